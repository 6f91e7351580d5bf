"""Data on many hosts: every process walks the same global plan of batches and gets its own contiguous rows of each.

The sequence of global batches is the same on every process and independent of the process count, so the data
position is global: one saved position resumes every host exactly, also on another number of processes, every
host feeds the same shapes at each step, and no host's epoch ends before another's.

A batch is ``{name: array [rows, ...]}``, every array sharing the leading row axis.

* :func:`host_rows`: process ``i`` of ``n`` takes rows ``[i * rows / n, (i + 1) * rows / n)`` of a batch.
* :class:`HostShard`: a resumable iterator of global batches -> this process's rows of each. An iterator that
  can build only some rows (:class:`BuildsHostRows`: ``batching.BatchIterator``, and ``prefetch.PrefetchIterator``
  around one) is told which once, and then reads and pads only those (1/n of the work; with packed streams it also
  plans only those, ``TokenBatcher.plan_rows_of``); any other is built whole and sliced.
* :func:`pad_rows`: zero filler rows so that an evaluation batch splits over processes and devices.
"""
from __future__ import annotations

from typing import Any, Iterator, Protocol, runtime_checkable

import numpy as np

# Filler rows are all zero except these keys, where -1 already means "no example" (translation's example
# index, a forecasting window's origin) and 0 would name a real one.
FILLER_VALUES = {"index": -1, "origin": -1}


def row_count(batch: dict[str, Any]) -> int:
  """The shared leading dimension of the arrays of ``batch``; ValueError if they disagree or it is empty."""
  counts = {name: np.shape(value)[0] for name, value in batch.items()}
  if not counts or len(set(counts.values())) != 1:
    raise ValueError(f"a batch needs arrays sharing one leading row axis; got leading sizes {counts}.")
  return next(iter(counts.values()))


def check_divisible(rows: int, process_count: int) -> None:
  """ValueError naming both numbers unless ``rows`` rows split evenly over ``process_count`` processes."""
  if rows % process_count:
    raise ValueError(f"a global batch of {rows} rows does not split evenly over {process_count} processes; "
                     f"make the batch size a multiple of {process_count}.")


def _check_process(process_index: int, process_count: int) -> None:
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"process_index must lie in [0, process_count) with process_count >= 1; got "
                     f"process_index={process_index}, process_count={process_count}.")


def host_range(rows: int, process_index: int, process_count: int) -> tuple[int, int]:
  """``(start, stop)``: the rows of a global batch of ``rows`` rows that process ``process_index`` of
  ``process_count`` holds (:func:`host_rows`); ValueError if ``rows`` does not split evenly."""
  _check_process(process_index, process_count)
  check_divisible(rows, process_count)
  size = rows // process_count
  return process_index * size, (process_index + 1) * size


@runtime_checkable
class BuildsHostRows(Protocol):
  """An iterator of global batches that can build only one process's rows of each, from the same global plan."""

  def build_host_rows(self, process_index: int, process_count: int) -> bool:
    """From now on, yield only rows :func:`host_range` of each global batch (the rest is never read or padded)
    and return True; or change nothing and return False (a wrapper around an iterator that cannot). The position
    (``get_state``) stays the global one."""


def host_rows(batch: dict[str, Any], process_index: int, process_count: int) -> dict[str, Any]:
  """Process ``process_index``'s contiguous share of a global batch.

  Args:
    batch: ``{name: [rows, ...]}``, the global batch.
    process_index, process_count: this process, of how many.

  Returns:
    ``{name: [rows / process_count, ...]}``, rows ``[i * rows / n, (i + 1) * rows / n)`` of every array (views);
    ``batch`` itself when ``process_count`` is 1.

  Raises:
    ValueError: ``rows`` is not a multiple of ``process_count`` (the message names both).
  """
  start, stop = host_range(row_count(batch), process_index, process_count)
  if process_count == 1:
    return batch
  return {name: value[start:stop] for name, value in batch.items()}


class HostShard:
  """This process's rows (:func:`host_rows`) of each batch of a resumable iterator of global batches.

  ``get_state`` / ``set_state`` are the inner iterator's unchanged: the position is global, the same on every
  process, so a state saved by any process resumes all of them, on any process count. ``batch_shapes`` (when
  the inner iterator has it) is the inner one's with the row count divided by ``process_count``. With
  ``process_count`` 1 the batches are the inner iterator's own. An inner iterator that is :class:`BuildsHostRows`
  builds only this process's rows (the same arrays ``host_rows`` would cut from the global batch); ``builds_rows``
  says so.
  """

  def __init__(self, iterator, process_index: int, process_count: int):
    _check_process(process_index, process_count)
    self.iterator = iterator
    self.process_index = int(process_index)
    self.process_count = int(process_count)
    self.builds_rows = (process_count > 1 and isinstance(iterator, BuildsHostRows)
                        and iterator.build_host_rows(self.process_index, self.process_count))

  def __iter__(self) -> Iterator[dict[str, Any]]:
    return self

  def __next__(self) -> dict[str, Any]:
    if self.builds_rows:
      return next(self.iterator)
    return host_rows(next(self.iterator), self.process_index, self.process_count)

  @property
  def batch_shapes(self) -> list[tuple[int, ...]]:
    """``(rows / process_count, ...)`` of each of the inner iterator's ``batch_shapes``; AttributeError if it
    has none, ValueError if a row count does not divide."""
    shapes = self.iterator.batch_shapes
    for shape in shapes:
      check_divisible(shape[0], self.process_count)
    return [(shape[0] // self.process_count, *shape[1:]) for shape in shapes]

  def get_state(self) -> dict:
    return self.iterator.get_state()

  def set_state(self, state: dict) -> None:
    self.iterator.set_state(state)

  def close(self) -> None:
    """Stops the inner iterator's background work, if it has any (``prefetch.PrefetchIterator``)."""
    close = getattr(self.iterator, "close", None)
    if close is not None:
      close()

  def __enter__(self) -> HostShard:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def pad_rows(batch: dict[str, Any], multiple: int) -> dict[str, Any]:
  """``batch`` with filler rows appended so that its row count is a multiple of ``multiple``.

  Filler rows are all zero (padding tokens, zero weight, no observed target: they weigh nothing in any task's
  loss), except the keys of ``FILLER_VALUES`` (``"index"``, ``"origin"``), which get -1.

  Args:
    batch: ``{name: [rows, ...]}``.
    multiple: e.g. process count x devices per process.

  Returns:
    ``{name: [ceil(rows / multiple) * multiple, ...]}``; ``batch`` itself when ``rows`` already divides.
  """
  if multiple < 1:
    raise ValueError(f"pad_rows: multiple must be >= 1; got {multiple}.")
  missing = -row_count(batch) % multiple
  if not missing:
    return batch
  padded = {}
  for name, value in batch.items():
    value = np.asarray(value)
    filler = np.full((missing,) + value.shape[1:], FILLER_VALUES.get(name, 0), value.dtype)
    padded[name] = np.concatenate([value, filler])
  return padded
