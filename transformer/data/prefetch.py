"""Batches ahead of the step that uses them, with the position to resume from: built on a background thread
(:class:`PrefetchIterator`, around any :class:`ResumableIterator`) and placed on the device
(``prefetch_to_device``); batches grouped and stacked for a compiled call of several steps."""
from __future__ import annotations

import collections
import queue
import threading
from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy as np

_END = object()  # what the thread puts after the last batch


class ResumableIterator(Protocol):
  """A batch iterator whose position can be saved in a checkpoint and restored exactly (``batching.BatchIterator``,
  ``synthetic.SyntheticBatches``, ...). Token-bucketed ones also have ``batch_shapes``: ``[(rows, length), ...]``,
  the shapes of their batches."""

  def __iter__(self) -> Iterator[dict[str, Any]]: ...

  def __next__(self) -> dict[str, Any]: ...

  def get_state(self) -> dict: ...  # JSON-serialisable

  def set_state(self, state: dict) -> None: ...


def prefetch_to_device(iterator, put: Callable[[Any], Any], size: int = 2) -> Iterator[tuple[Any, Any, dict]]:
  """Yield ``(host_batch, placed_batch, state)`` for each batch of ``iterator``, ``size`` batches placed ahead.

  ``put`` places a host batch as the step expects it (``jax.device_put``, sharded over a mesh, split over
  ``pmap``'s devices); placing is asynchronous, so the copy of the next batches overlaps the step running
  now (as ``flax.jax_utils.prefetch_to_device``). ``state`` is ``iterator.get_state()`` right after that batch
  was drawn: the position a checkpoint saved after its step must resume from, while the iterator itself is
  already ``size`` batches further. The batches are those of ``iterator``, in its order.
  """
  ahead = collections.deque()

  def fill():
    while len(ahead) < size:
      try:
        batch = next(iterator)
      except StopIteration:
        return
      ahead.append((batch, put(batch), iterator.get_state()))

  fill()
  while ahead:
    yield ahead.popleft()
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


class PrefetchIterator:
  """Runs ``iterator`` ``buffer_size`` batches ahead on a background thread.

  ``get_state()`` describes the batches handed out by ``__next__``, not those waiting in the
  buffer, so saving it with a checkpoint and restoring it (here or into a fresh
  ``PrefetchIterator(BatchIterator(...))``) continues exactly after the last consumed batch.
  An exception in the thread is re-raised by ``__next__``. Call ``close()`` (or use ``with``)
  to stop the thread early. The thread starts with the first ``__next__``, so that nothing is built before
  ``build_host_rows`` or ``set_state`` says which rows and where.
  """

  def __init__(self, iterator: ResumableIterator, buffer_size: int = 2):
    self._iterator = iterator
    self._buffer_size = buffer_size
    self._state = iterator.get_state()
    self._thread = None
    self._finished = self._closed = False

  def _start(self) -> None:
    self._queue = queue.Queue(maxsize=self._buffer_size)
    self._stop = threading.Event()
    self._finished = False
    self._thread = threading.Thread(target=self._produce, args=(self._queue, self._stop),
                                    daemon=True, name="PrefetchIterator")
    self._thread.start()

  def _produce(self, buffer: queue.Queue, stop: threading.Event) -> None:
    def put(item) -> bool:
      while not stop.is_set():
        try:
          buffer.put(item, timeout=0.05)
          return True
        except queue.Full:
          pass
      return False
    try:
      while not stop.is_set():
        try:
          batch = next(self._iterator)
        except StopIteration:
          put((_END, None))
          return
        if not put((batch, self._iterator.get_state())):
          return
    except BaseException as error:  # pylint: disable=broad-except
      put((error, None))

  def _shutdown(self) -> None:
    if self._thread is None:
      return
    self._stop.set()
    while self._thread.is_alive():
      try:  # make room so that a blocked put() sees the stop flag
        self._queue.get(timeout=0.05)
      except queue.Empty:
        pass
    self._thread.join()
    self._thread = None

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._thread is None and not (self._finished or self._closed):
      self._start()
    if self._finished or self._thread is None:
      raise StopIteration
    item, state = self._queue.get()
    if item is _END:
      self._finished = True
      raise StopIteration
    if isinstance(item, BaseException):
      self._finished = True
      raise item
    self._state = state
    return item

  @property
  def batch_shapes(self) -> list[tuple[int, int]]:
    return self._iterator.batch_shapes

  def build_host_rows(self, process_index: int, process_count: int) -> bool:
    """``hosts.BuildsHostRows``: passed on to the inner iterator if it can (batches already built ahead, whole,
    are dropped and built again as this process's rows); False if it cannot."""
    build = getattr(self._iterator, "build_host_rows", None)
    if build is None:
      return False
    state = self.get_state()
    self._shutdown()
    built = build(process_index, process_count)
    self._iterator.set_state(state)
    self._state = self._iterator.get_state()
    self._finished = False
    return built

  def get_state(self) -> dict[str, Any]:
    return dict(self._state)

  def set_state(self, state: dict[str, Any]) -> None:
    self._shutdown()
    self._iterator.set_state(state)
    self._state = self._iterator.get_state()
    self._finished = False

  def close(self) -> None:
    self._closed = True
    self._shutdown()
    close = getattr(self._iterator, "close", None)
    if close is not None:
      close()

  def __enter__(self) -> PrefetchIterator:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
