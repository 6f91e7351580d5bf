"""Batches placed on the device ahead of the step that uses them, with the position to resume from; batches
grouped and stacked for a compiled call of several steps."""
from __future__ import annotations

import collections
from typing import Any, Callable, Iterable, Iterator

import numpy as np


def prefetch_to_device(iterator, put: Callable[[Any], Any], size: int = 2) -> Iterator[tuple[Any, Any, dict]]:
  """Yield ``(host_batch, placed_batch, state)`` for each batch of ``iterator``, ``size`` batches placed ahead.

  ``put`` places a host batch as the step expects it (``jax.device_put``, sharded over a mesh, split over
  ``pmap``'s devices); placing is asynchronous, so the copy of the next batches overlaps the step running
  now (as ``flax.jax_utils.prefetch_to_device``). ``state`` is ``iterator.get_state()`` right after that batch
  was drawn: the position a checkpoint saved after its step must resume from, while the iterator itself is
  already ``size`` batches further. The batches are those of ``iterator``, in its order.
  """
  queue = collections.deque()

  def fill():
    while len(queue) < size:
      try:
        batch = next(iterator)
      except StopIteration:
        return
      queue.append((batch, put(batch), iterator.get_state()))

  fill()
  while queue:
    yield queue.popleft()
    fill()  # after the consumer dispatched its step with the batch just handed out


class BatchGroups:
  """The batches of ``iterator`` in groups, as lists: group ``i`` holds ``sizes[i]`` batches (a group stops
  short only where ``iterator`` ends). ``get_state()`` is ``iterator``'s: after the last group drawn."""

  def __init__(self, iterator, sizes: Iterable[int]):
    self.iterator, self.sizes = iterator, iter(sizes)

  def __iter__(self):
    return self

  def __next__(self) -> list:
    size = next(self.sizes)  # StopIteration: no more groups wanted
    group = []
    for _ in range(size):
      try:
        group.append(next(self.iterator))
      except StopIteration:
        break
    if not group:
      raise StopIteration
    return group

  def get_state(self):
    return self.iterator.get_state()


def stack_batches(batches: list) -> dict | None:
  """``name -> [len(batches), ...]``: equally shaped batches stacked along a new leading axis; None when their
  shapes differ (bucketed data), which cannot be stacked."""
  shapes = {tuple(sorted((name, np.shape(value)) for name, value in batch.items())) for batch in batches}
  if len(shapes) > 1:
    return None
  return {name: np.stack([np.asarray(batch[name]) for batch in batches]) for name in batches[0]}
