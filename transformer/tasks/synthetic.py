"""Synthetic sequence tasks that need no download: copy, reverse and sort.

Sequences of ``min_length..max_length`` symbols drawn uniformly from ``num_symbols`` symbols (ids
``FIRST_SYMBOL..``), padded with 0; targets end with EOS. Every batch is a pure function of
``(seed, shard, batch index)``, so the iterator's state is one integer and resuming is exact. The
validation set comes from a different seed stream than any training batch.
"""
from __future__ import annotations

import numpy as np

from transformer.tasks.seq2seq import Seq2SeqTask

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_SYMBOL = 3
KINDS = ("copy", "reverse", "sort")
_EVAL_STREAM = 2**31 - 1  # seed-sequence entry reserved for the validation set


def make_examples(kind: str, rng: np.random.Generator, count: int, num_symbols: int, min_length: int,
                  max_length: int):
  """``count`` examples of a task.

  Returns:
    ``{"source": int32 [count, max_length], "target": int32 [count, max_length + 1]}``, zero-padded,
    targets ending with ``EOS_ID``.
  """
  if kind not in KINDS:
    raise ValueError(f"unknown synthetic task {kind!r}; choose one of {list(KINDS)}.")
  lengths = rng.integers(min_length, max_length + 1, size=count)
  symbols = rng.integers(FIRST_SYMBOL, FIRST_SYMBOL + num_symbols, size=(count, max_length))
  positions = np.arange(max_length)[None, :]
  valid = positions < lengths[:, None]
  source = np.where(valid, symbols, PAD_ID)
  if kind == "copy":
    target_body = source
  elif kind == "reverse":
    # Position i takes symbol length-1-i; padding stays at the end.
    index = np.clip(lengths[:, None] - 1 - positions, 0, max_length - 1)
    target_body = np.where(valid, np.take_along_axis(source, index, axis=1), PAD_ID)
  else:
    # Padding sorts last because it is replaced by a value above every symbol.
    sentinel = FIRST_SYMBOL + num_symbols
    target_body = np.sort(np.where(valid, source, sentinel), axis=1)
    target_body = np.where(valid, target_body, PAD_ID)
  target = np.zeros((count, max_length + 1), np.int64)
  target[:, :max_length] = target_body
  target[np.arange(count), lengths] = EOS_ID
  return {"source": source.astype(np.int32), "target": target.astype(np.int32)}


class SyntheticBatches:
  """Endless, resumable training batches: batch ``i`` depends only on ``(seed, shard_index, i)``."""

  def __init__(self, task_config, batch_size: int, seed: int, shard_index: int = 0):
    self._config = task_config
    self._batch_size = batch_size
    self._seed = seed
    self._shard_index = shard_index
    self._index = 0

  def __iter__(self):
    return self

  def __next__(self):
    rng = np.random.default_rng([self._seed, self._shard_index, self._index])
    self._index += 1
    config = self._config
    return make_examples(config.kind, rng, self._batch_size, config.num_symbols, config.min_length,
                         config.max_length)

  def get_state(self) -> dict:
    return {"index": self._index}

  def set_state(self, state: dict) -> None:
    self._index = int(state["index"])


class SyntheticTask(Seq2SeqTask):
  """``config.task``: kind (copy | reverse | sort), num_symbols, min_length, max_length, num_eval_examples."""

  def model_config(self):
    return self.make_model_config(vocab_size=FIRST_SYMBOL + self.config.task.num_symbols, target_vocab_size=None,
                                  pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID)

  def train_iterator(self, batch_size, seed, shard_index=0, shard_count=1):
    return SyntheticBatches(self.config.task, batch_size, seed, shard_index)

  def eval_batches(self, batch_size):
    task = self.config.task
    # The data seed, not the parameter seed: replicas of a num_seeds > 1 run, and the separate runs they match
    # (seed + i, data_seed = seed), are evaluated on one validation set.
    data_seed = self.config.seed if self.config.data_seed < 0 else self.config.data_seed
    rng = np.random.default_rng([data_seed, _EVAL_STREAM])
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
