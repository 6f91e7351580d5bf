"""Synthetic sequences that need no download (copy, reverse, sort) and their endless, resumable training batches.

Sequences of ``min_length..max_length`` symbols drawn uniformly from ``num_symbols`` symbols (ids
``FIRST_SYMBOL..``), padded with 0; targets end with EOS. Every batch is a pure function of
``(seed, batch index)``, so the iterator's state is one integer and resuming is exact.
"""
from __future__ import annotations

import numpy as np

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_SYMBOL = 3
KINDS = ("copy", "reverse", "sort")


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
  """Endless, resumable training batches ``{"source": [batch_size, max_length], "target": [batch_size,
  max_length + 1]}``: batch ``i`` depends only on ``(seed, i)``, the same on every process (a global batch)."""

  def __init__(self, task_config, batch_size: int, seed: int):
    self._config = task_config
    self._batch_size = batch_size
    self._seed = seed
    self._index = 0

  def __iter__(self):
    return self

  def __next__(self):
    # The 0 was the former shard index: the batches stay those of earlier single-process runs.
    rng = np.random.default_rng([self._seed, 0, self._index])
    self._index += 1
    config = self._config
    return make_examples(config.kind, rng, self._batch_size, config.num_symbols, config.min_length,
                         config.max_length)

  def get_state(self) -> dict:
    return {"index": self._index}

  def set_state(self, state: dict) -> None:
    self._index = int(state["index"])
