"""Synthetic sequence tasks that need no download: copy, reverse and sort.

The sequences and the resumable training batches are ``transformer.data.synthetic``'s. The validation set comes
from a different seed stream than any training batch.
"""
from __future__ import annotations

import functools
import os

import jax
import numpy as np

from transformer import ops
from transformer.data.files import read_table, write_atomically
from transformer.data.synthetic import BOS_ID, EOS_ID, FIRST_SYMBOL, PAD_ID, SyntheticBatches, make_examples
from transformer.nn import split_rows
from transformer.tasks.configs import SyntheticConfig
from transformer.tasks.decoding import model_class
from transformer.tasks.seq2seq import Seq2SeqTask

_EVAL_STREAM = 2**31 - 1  # seed-sequence entry reserved for the validation set
OUTPUTS_FILE = "validation_outputs.tsv"  # what --mode=eval writes: see SyntheticTask.write_outputs
OUTPUT_COLUMNS = ("source", "target", "prediction", "correct_tokens", "tokens")


class SyntheticTask(Seq2SeqTask):
  """``config.task``: ``SyntheticConfig`` (the kind of task, its symbols and lengths, the validation set's size)."""
  task_config_class = SyntheticConfig
  task_config: SyntheticConfig

  def model_config(self):
    return self.make_model_config(vocab_size=FIRST_SYMBOL + self.task_config.num_symbols, target_vocab_size=None,
                                  pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID)

  def train_iterator(self, batch_size, seed):
    return SyntheticBatches(self.task_config, batch_size, seed)

  def eval_batches(self, batch_size):
    task = self.task_config
    # The data seed, not the parameter seed: replicas of a num_seeds > 1 run, and the separate runs they match
    # (seed + i, data_seed = seed), are evaluated on one validation set.
    rng = np.random.default_rng([self.settings.order_seed, _EVAL_STREAM])
    examples = make_examples(task.kind, rng, task.num_eval_examples, task.num_symbols, task.min_length,
                             task.max_length)
    return _split_into_batches(examples, batch_size)

  def write_test_outputs(self, model_config, params, output_dir, eval_metrics=None):
    """``--mode=eval``: ``validation_outputs.tsv`` (``write_outputs``), the outputs behind the evaluation's
    ``eval/exact_match`` and ``eval/token_accuracy``; a run of several replicas writes
    ``validation_outputs.replica_<i>.tsv`` for each. No other split: returns no metrics."""
    del eval_metrics
    count = self.settings.num_replicas
    name, extension = os.path.splitext(OUTPUTS_FILE)
    for replica in range(count):
      path = os.path.join(output_dir, OUTPUTS_FILE if count == 1 else f"{name}.replica_{replica}{extension}")
      self.write_outputs(model_config, params if count == 1 else jax.tree.map(lambda leaf: leaf[replica], params),
                         path)
    return {}

  def write_outputs(self, model_config, params, path: str) -> dict[str, float]:
    """Writes ``path``: a header (``OUTPUT_COLUMNS``), then one row per held-out example, tab-separated: its
    source and target (EOS included) as space-separated token ids, the greedy prediction at the target's
    positions (as the evaluation decodes it), and how many of the target's tokens the teacher-forced model
    ranks first (``correct_tokens``, ties counted right as ``ops.token_accuracy`` counts them) of ``tokens``.
    Returns ``outputs_metrics`` of the rows: the evaluation's exact match and token accuracy."""
    deterministic = model_config.replace(deterministic=True)
    rows = []
    for batch in self.eval_batches(self.settings.eval_batch_size):
      source, target = np.asarray(batch["source"]), np.asarray(batch["target"])
      predictions = np.asarray(self.decode_batch(model_config, params, source, target.shape[1], 1))
      correct, tokens = (np.asarray(counts) for counts in _token_counts(deterministic, params, source, target))
      for row in np.flatnonzero((target != PAD_ID).any(axis=1)):  # all-padding filler rows have no example
        length = int(np.count_nonzero(target[row] != PAD_ID))
        rows.append((_ids(source[row][source[row] != PAD_ID]), _ids(target[row][:length]),
                     _ids(predictions[row][:length]), int(correct[row]), int(tokens[row])))
    write_atomically(path, "".join("\t".join(map(str, row)) + "\n" for row in [OUTPUT_COLUMNS, *rows]))
    return outputs_metrics(read_outputs(path))


def _split_into_batches(examples, batch_size):
  """Fixed-shape batches; the last one is padded with all-padding rows (zero weight everywhere)."""
  count = len(next(iter(examples.values())))
  batches = []
  for start in range(0, count, batch_size):
    batch = {}
    for name, array in examples.items():
      chunk = array[start:start + batch_size]
      if len(chunk) < batch_size:
        chunk = np.concatenate([chunk, np.zeros((batch_size - len(chunk),) + chunk.shape[1:], chunk.dtype)])
      batch[name] = chunk
    batches.append(batch)
  return batches


def _ids(tokens) -> str:
  return " ".join(str(int(token)) for token in tokens)


@functools.partial(jax.jit, static_argnums=0)
def _token_counts(model_config, params, source, target):
  """``(correct, tokens)`` float32 ``[batch]``: per example, ``ops.token_accuracy`` of the teacher-forced logits
  (the evaluation's token accuracy, summed over the batch instead)."""
  def counts(source, target):
    logits = model_class(model_config)(model_config).apply({"params": params}, source, target)
    weights = (target != model_config.pad_id).astype(np.float32)
    return jax.vmap(ops.token_accuracy)(logits[:, None], target[:, None], weights[:, None])
  return split_rows(counts, source, target)


def read_outputs(path: str) -> list[dict]:
  """The rows of an outputs file (``SyntheticTask.write_outputs``): ``source``, ``target`` and ``prediction`` as
  int lists, ``correct_tokens`` and ``tokens`` as ints.

  Raises:
    InputFileError: the file is not one, or a line is damaged (the message names the file and the line).
  """
  def parse(cells):
    source, target, prediction, correct, tokens = cells
    return {"source": [int(t) for t in source.split()], "target": [int(t) for t in target.split()],
            "prediction": [int(t) for t in prediction.split()], "correct_tokens": int(correct), "tokens": int(tokens)}
  return read_table(path, OUTPUT_COLUMNS, parse, "decoded outputs")


def outputs_metrics(rows: list[dict]) -> dict[str, float]:
  """The evaluation's metrics from outputs rows (``read_outputs``): ``exact_match``, the fraction of examples
  predicted right at every target position (EOS included), and ``token_accuracy`` (teacher-forced)."""
  matches = sum(row["prediction"] == row["target"] for row in rows)
  return {"exact_match": matches / max(len(rows), 1),
          "token_accuracy": sum(row["correct_tokens"] for row in rows) / max(sum(row["tokens"] for row in rows), 1)}
