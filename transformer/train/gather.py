"""Work shared by processes: each computes its share of a list of items, and every process gets all results back
in the items' order, as one process alone would have computed them.

* :func:`process_share`: process ``i`` of ``n`` takes items ``i, i + n, i + 2n, ...``.
* :func:`interleave`: the shares' results put back in the items' order.
* :func:`gather_objects`: one picklable host object per process, exchanged so that every process has all.
* :func:`split_over_processes`: the three together.
"""
from __future__ import annotations

import pickle
from typing import Any, Callable, Sequence

import jax
import numpy as np


def process_share(items: Sequence, process_index: int, process_count: int) -> list:
  """Items ``process_index, process_index + process_count, ...`` of ``items`` (any sequence, e.g. a lazy one).

  Strided rather than contiguous: evaluation batches come grouped by length, so every process gets a mix of
  short and long ones and the processes finish together.
  """
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"process_index must lie in [0, process_count) with process_count >= 1; got "
                     f"process_index={process_index}, process_count={process_count}.")
  return [items[index] for index in range(process_index, len(items), process_count)]


def interleave(shares: Sequence[Sequence]) -> list:
  """The inverse of :func:`process_share`: ``shares[i]`` holds the results of process ``i``'s share (one per
  item, in order); returns one result per item, in the items' order."""
  count = len(shares)
  total = sum(len(share) for share in shares)
  return [shares[index % count][index // count] for index in range(total)]


def gather_objects(obj: Any) -> list:
  """``[obj of process 0, obj of process 1, ...]`` on every process: a collective, so every process calls it, in
  the same order. One process: ``[obj]``, without any communication.

  Each object travels pickled, as a uint8 array padded to the longest of them (the all-gather wants one shape
  everywhere), after an all-gather of the lengths.
  """
  if jax.process_count() == 1:
    return [obj]
  from jax.experimental import multihost_utils  # only multi-process runs need it
  payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  lengths = np.asarray(multihost_utils.process_allgather(np.int32(payload.size))).reshape(-1)  # [processes]
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[:payload.size] = payload
  gathered = np.asarray(multihost_utils.process_allgather(padded))  # [processes, longest]
  return [pickle.loads(gathered[process, :length].tobytes()) for process, length in enumerate(lengths)]


def split_over_processes(function: Callable[[list], list], items: Sequence, process_index: int,
                         process_count: int, gather: Callable[[Any], list] = gather_objects) -> list:
  """``function(list(items))`` computed in shares: this process applies ``function`` to its
  :func:`process_share` only, and the results of every share, exchanged with ``gather``, are put back in the
  items' order.

  Args:
    function: items -> one picklable result per item, each depending on its own item alone.
    items: the work, the same sequence on every process.
    process_index, process_count: this process, of how many.
    gather: this process's results -> every process's, in process order (:func:`gather_objects`; a test
      passes one that computes the other processes' shares itself). Not called with one process.

  Returns:
    One result per item, in the items' order, the same on every process.
  """
  mine = process_share(items, process_index, process_count)
  share = function(mine)
  if len(share) != len(mine):
    raise ValueError(f"split_over_processes: the function gave {len(share)} results for {len(mine)} items; "
                     "it must give one per item.")
  return interleave(gather(share) if process_count > 1 else [share])
