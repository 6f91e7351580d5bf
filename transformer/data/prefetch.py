"""Batches placed on the device ahead of the step that uses them, with the position to resume from."""
from __future__ import annotations

import collections
from typing import Any, Callable, Iterator


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
