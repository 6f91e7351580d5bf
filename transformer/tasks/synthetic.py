"""Synthetic sequence tasks that need no download: copy, reverse and sort.

The sequences and the resumable training batches are ``transformer.data.synthetic``'s. The validation set comes
from a different seed stream than any training batch.
"""
from __future__ import annotations

import numpy as np

from transformer.data.synthetic import BOS_ID, EOS_ID, FIRST_SYMBOL, PAD_ID, SyntheticBatches, make_examples
from transformer.tasks.configs import SyntheticConfig
from transformer.tasks.seq2seq import Seq2SeqTask

_EVAL_STREAM = 2**31 - 1  # seed-sequence entry reserved for the validation set


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
