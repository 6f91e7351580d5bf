"""Batches of labelled texts held as one padded token array (classification): fixed-shape eval batches, and
endless shuffled training batches whose position a checkpoint saves.

Batches: ``{"tokens": int32 [batch, length], "label": int32 [batch], "weight": float32 [batch]}`` (weight 0 marks
padding rows).
"""
from __future__ import annotations

import functools

import numpy as np

from transformer.errors import ConfigError


def fixed_batches(tokens: np.ndarray, labels: np.ndarray, batch_size: int) -> list[dict]:
  """Batches of identical shapes in order; the last is padded with zero-weight rows."""
  batches = []
  for start in range(0, len(labels), batch_size):
    count = min(batch_size, len(labels) - start)
    batch = {"tokens": np.zeros((batch_size, tokens.shape[1]), np.int32),
             "label": np.zeros((batch_size,), np.int32), "weight": np.zeros((batch_size,), np.float32)}
    batch["tokens"][:count] = tokens[start:start + count]
    batch["label"][:count] = labels[start:start + count]
    batch["weight"][:count] = 1.0
    batches.append(batch)
  return batches


class ShuffledBatches:
  """Endless training batches: epoch ``e`` is a permutation drawn from ``(seed, e)``, cut into full batches
  (the remainder waits for the next epoch's order). The state is the batch count, so resuming is exact.

  With ``length_multiple``, texts of similar lengths share a batch (the permutation is sorted by length
  within windows of ``BUCKET_WINDOW`` batches, and the window's batches shuffled), and each batch is cut to its
  longest text rounded up to ``length_multiple`` tokens: less padding, at most ``length / length_multiple``
  batch shapes (one compilation each)."""

  BUCKET_WINDOW = 16

  def __init__(self, tokens: np.ndarray, labels: np.ndarray, batch_size: int, seed: int, pad_id: int = 0,
               length_multiple: int = 0):
    if len(labels) < batch_size:
      raise ConfigError(f"config.batch_size={batch_size} is larger than the {len(labels)} training examples.")
    self._tokens, self._labels, self._batch_size, self._seed = tokens, labels, batch_size, seed
    self._lengths = np.sum(tokens != pad_id, axis=1)
    self._length_multiple = length_multiple
    self._index = 0

  def __iter__(self):
    return self

  @functools.lru_cache(maxsize=1)
  def _epoch_order(self, epoch: int) -> np.ndarray:
    rng = np.random.default_rng([self._seed, epoch])
    order = rng.permutation(len(self._labels))
    if not self._length_multiple:
      return order
    size = self._batch_size
    batches = []
    for start in range(0, len(order) - size + 1, size * self.BUCKET_WINDOW):
      window = order[start:start + size * self.BUCKET_WINDOW]
      window = window[np.argsort(self._lengths[window], kind="stable")]
      batches += [window[i:i + size] for i in range(0, len(window) - size + 1, size)]
    return np.concatenate([batches[i] for i in rng.permutation(len(batches))])

  def __next__(self):
    per_epoch = len(self._labels) // self._batch_size
    epoch, position = divmod(self._index, per_epoch)
    rows = self._epoch_order(epoch)[position * self._batch_size:(position + 1) * self._batch_size]
    self._index += 1
    tokens = self._tokens[rows]
    if self._length_multiple:
      length = -(-int(self._lengths[rows].max()) // self._length_multiple) * self._length_multiple
      tokens = tokens[:, :length]
    return {"tokens": tokens, "label": self._labels[rows], "weight": np.ones((self._batch_size,), np.float32)}

  def get_state(self) -> dict:
    return {"index": self._index}

  def set_state(self, state: dict) -> None:
    self._index = int(state["index"])
