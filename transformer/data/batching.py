"""Batching by token count with length buckets; iterators whose position saves and restores.

Pieces, each usable alone (the background prefetching of any of these iterators is ``prefetch.py``):

* :class:`TokenizedExamples`: parallel ``(source ids, target ids)`` pairs in flat arrays.
* :class:`TokenBatcher`: which examples go into which batch in each epoch (a pure function of
  ``seed`` and ``epoch``), and how a batch of them is padded.
* :class:`BatchIterator`: walks the epochs; ``get_state()`` / ``set_state()`` save and restore
  its position as a small JSON-serialisable dict.

A batch is ``{"source": int32 [batch_size, length], "target": int32 [batch_size, length]}`` padded
with 0 (``tokenizers.PAD_ID``), plus ``"index": int32 [batch_size]`` (the example's position in
the :class:`TokenizedExamples`, -1 on filler rows) when ``include_index``.

Bucketing: an example's length is ``max(len(source), len(target))`` (EOS included); it goes to
the first bucket whose boundary is ``>= length`` and both its sides are padded to that boundary.
Bucket ``b`` holds ``batch_size_b = max_tokens // boundary_b`` rows (rounded down to a multiple
of ``batch_size_multiple``), so ``batch_size * length <= max_tokens`` for each of source and
target. With ``fill_partial_batches`` (default) the last, partial batch of a bucket is filled
with all-padding rows, so every batch of a bucket has the same shape and the set of shapes a
jitted step sees is :attr:`TokenBatcher.batch_shapes`, one per bucket. ``fixed_shape=True``
uses a single bucket, ``[max_tokens // max_length, max_length]`` for every batch. ``pack=True`` (training)
packs whole examples into rows instead (``packing.py``): one shape, segment ids, almost no padding; with
``pack_streams`` in streams of their own rows, so that each process plans only its own.

Training (``train=True``) drops examples longer than ``max_length`` and shuffles: in epoch
``e`` the examples are permuted with ``numpy.random.default_rng([seed, e])``, cut into batches
within their buckets, and the batches permuted again. Every kept example is in exactly one
batch per epoch. Evaluation keeps the order of the examples within each bucket, never drops or
truncates: an example longer than ``max_length`` gets its own ``[1, L]`` batch, ``L`` rounded up
to a multiple of ``max_length`` (so over-long examples add few extra shapes).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import multiprocessing
import threading
from typing import Any, Iterator, Sequence

import numpy as np

from transformer.data import hosts, packing
from transformer.errors import ConfigError

PAD_ID = 0  # == tokenizers.PAD_ID; not imported so that batching needs numpy only


class TokenizedExamples:
  """Parallel token sequences stored flat: example ``i`` is ``(source[i], target[i])``.

  Args:
    source_tokens: int32 ``[total_source_tokens]``, all source sequences concatenated.
    source_offsets: int64 ``[num_examples + 1]``; source ``i`` is
      ``source_tokens[source_offsets[i]:source_offsets[i + 1]]``.
    target_tokens, target_offsets: the same for the targets.

  The arrays may be read-only memory maps (``token_cache``): everything here only reads them, and a batch gathers
  just its examples' tokens, so a process touches the pages of its own rows only.
  """

  def __init__(self, source_tokens, source_offsets, target_tokens, target_offsets):
    self.source_tokens = np.asarray(source_tokens, np.int32)
    self.source_offsets = np.asarray(source_offsets, np.int64)
    self.target_tokens = np.asarray(target_tokens, np.int32)
    self.target_offsets = np.asarray(target_offsets, np.int64)
    if len(self.source_offsets) != len(self.target_offsets) or len(self.source_offsets) < 1:
      raise ValueError(f"source_offsets ({len(self.source_offsets)}) and target_offsets "
                       f"({len(self.target_offsets)}) must both have num_examples + 1 entries.")

  @classmethod
  def from_sequences(cls, source: Sequence[Sequence[int]],
                     target: Sequence[Sequence[int]]) -> TokenizedExamples:
    """From two equally long lists of id sequences (lists or 1-D arrays)."""
    if len(source) != len(target):
      raise ValueError(f"{len(source)} source but {len(target)} target sequences.")
    def flatten(sequences):
      lengths = np.fromiter((len(sequence) for sequence in sequences), np.int64, len(sequences))
      offsets = np.concatenate([[0], np.cumsum(lengths)])
      tokens = (np.concatenate([np.asarray(sequence, np.int32) for sequence in sequences])
                if len(sequences) else np.zeros([0], np.int32))
      return tokens, offsets
    return cls(*flatten(source), *flatten(target))

  @classmethod
  def from_pairs(cls, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> TokenizedExamples:
    return cls.from_sequences([pair[0] for pair in pairs], [pair[1] for pair in pairs])

  def __len__(self) -> int:
    return len(self.source_offsets) - 1

  def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
    return self.source(index), self.target(index)

  def source(self, index: int) -> np.ndarray:
    return self.source_tokens[self.source_offsets[index]:self.source_offsets[index + 1]]

  def target(self, index: int) -> np.ndarray:
    return self.target_tokens[self.target_offsets[index]:self.target_offsets[index + 1]]

  @property
  def source_lengths(self) -> np.ndarray:
    return np.diff(self.source_offsets)

  @property
  def target_lengths(self) -> np.ndarray:
    return np.diff(self.target_offsets)

  def select(self, indices: Sequence[int]) -> TokenizedExamples:
    """A new :class:`TokenizedExamples` holding ``indices``, in that order."""
    return TokenizedExamples.from_sequences([self.source(i) for i in indices],
                                            [self.target(i) for i in indices])


def padded_rows(tokens: np.ndarray, offsets: np.ndarray, indices: np.ndarray, rows: int,
                length: int) -> np.ndarray:
  """int32 ``[rows, length]``: row ``r`` holds sequence ``indices[r]`` of the flat ``tokens`` / ``offsets``
  (``TokenizedExamples``' layout) from its first position, then ``PAD_ID``; the rows past ``len(indices)`` are
  all padding. One gather for the whole batch, no loop over rows."""
  batch = np.full([rows, length], PAD_ID, np.int32)
  indices = np.asarray(indices, np.int64)
  starts = offsets[indices]
  lengths = offsets[indices + 1] - starts
  if lengths.size and lengths.max() > length:
    raise ValueError(f"a sequence of {lengths.max()} tokens does not fit a row of {length}.")
  firsts = np.cumsum(lengths) - lengths  # where each sequence starts among the batch's tokens
  positions = np.arange(int(lengths.sum())) - np.repeat(firsts, lengths)  # each token's column
  batch[np.repeat(np.arange(len(indices)), lengths), positions] = tokens[np.repeat(starts, lengths) + positions]
  return batch


def packed_epoch(seed: int, epoch: int, kept: np.ndarray, source_lengths: np.ndarray, target_lengths: np.ndarray,
                 row_lengths: tuple[int, int],
                 streams: packing.Streams | None = None) -> tuple[np.ndarray, np.ndarray]:
  """``packing.pack_rows_flat`` of ``epoch``: the ``kept`` examples (bool ``[num_examples]``) in the epoch's
  shuffled order (as bucketing shuffles), packed first fit into rows in the order they were started; with
  ``streams``, ``packing.pack_streams_flat`` of that order (the planned streams' rows, in batch order). A pure
  function of its arguments, so that a worker process can make it (``TokenBatcher.plan_workers``)."""
  order = np.random.default_rng([seed, epoch]).permutation(len(kept))
  order = order[kept[order]]
  if streams is None:
    return packing.pack_rows_flat(order, source_lengths, target_lengths, *row_lengths)
  return packing.pack_streams_flat(order, source_lengths, target_lengths, row_lengths, streams)


def make_bucket_boundaries(max_length: int, min_length: int = 8, growth: float = 1.2,
                           multiple: int = 8) -> list[int]:
  """Geometric bucket boundaries, multiples of ``multiple``, ending exactly at ``max_length``.

  ``growth=1.2`` bounds the padding inside a bucket by about 1/6 of its length while keeping
  the count small (14 boundaries up to 256), each boundary being one compiled shape.
  """
  if max_length < 1:
    raise ValueError(f"max_length must be >= 1, got {max_length}.")
  boundaries = []
  boundary = min(max(min_length, multiple), max_length)
  while boundary < max_length:
    boundaries.append(boundary)
    boundary = max(boundary + multiple, math.ceil(boundary * growth / multiple) * multiple)
  return boundaries + [max_length]


@dataclasses.dataclass(frozen=True)
class Bucket:
  length: int  # padded length of source and target
  batch_size: int  # rows of a full batch


class TokenBatcher:
  """Plans batches of examples by token count; see the module docstring for the rules.

  Args:
    examples: :class:`TokenizedExamples` (or a sequence of ``(source_ids, target_ids)`` pairs).
    max_tokens: bound on ``batch_size * padded_length`` of each of source and target.
    max_length: longest example kept in training, and the last bucket boundary.
    bucket_boundaries: increasing lengths; those below ``max_length`` are used, with
      ``max_length`` appended. Default: :func:`make_bucket_boundaries`.
    train: shuffle and drop over-long examples (True), or keep order and every example (False).
    seed: shuffling seed (training).
    fixed_shape: a single bucket, so every batch is ``[max_tokens // max_length, max_length]``.
    batch_size_multiple: batch sizes are multiples of this (e.g. the number of devices).
    fill_partial_batches: fill a bucket's last batch with padding rows to its full batch size.
    include_index: add ``"index"`` (int32 ``[batch_size]``, -1 on filler rows) to each batch.
    pack: training only: pack examples into rows of ``packing.row_lengths`` positions (``max_length`` on the
      side with more tokens), ``max_tokens // max_length`` rows a batch (see ``packing.py``).
    plan_workers: with ``pack``, processes that plan the next ``plan_workers`` epochs at once (``plan_ahead``),
      for when one thread's first-fit packing is slower than the steps consume an epoch; 0: one thread.
    pack_streams: with ``pack``, streams packed apart (``packing.Streams``), each into its own ``rows /
      pack_streams`` rows of every batch, so that process ``i`` of ``n`` plans only its own (``plan_rows_of``):
      planning per process falls as 1/n. An epoch ends in the batch where the first stream could run out, and
      each stream's rows past it are dropped (``packing.pack_streams_flat``). 1: one stream, every row planned
      together.
  """

  def __init__(self, examples, *, max_tokens: int, max_length: int = 256,
               bucket_boundaries: Sequence[int] | None = None, train: bool = True, seed: int = 0,
               fixed_shape: bool = False, batch_size_multiple: int = 1,
               fill_partial_batches: bool = True, include_index: bool = False, pack: bool = False,
               plan_workers: int = 0, pack_streams: int = 1):
    if not isinstance(examples, TokenizedExamples):
      examples = TokenizedExamples.from_pairs(examples)
    self.examples = examples
    self.max_tokens = int(max_tokens)
    self.max_length = int(max_length)
    self.train = bool(train)
    self.seed = int(seed)
    self.fill_partial_batches = bool(fill_partial_batches)
    self.include_index = bool(include_index)
    self.pack = bool(pack)
    self.plan_workers = int(plan_workers)
    self._plan_pool: concurrent.futures.ProcessPoolExecutor | None = None
    if self.plan_workers < 0:
      raise ValueError(f"plan_workers must be >= 0, got {plan_workers}.")
    if pack_streams < 1 or (pack_streams > 1 and not self.pack):
      raise ValueError(f"pack_streams must be >= 1, and above 1 only with pack=True; got "
                       f"pack_streams={pack_streams}, pack={pack}.")
    if self.pack and (include_index or not self.train):
      raise ValueError("pack=True is for training batches: evaluation and prediction keep one example per row "
                       "(with include_index); leave pack off there.")
    if fixed_shape or self.pack:
      boundaries = [self.max_length]
    elif bucket_boundaries is None:
      boundaries = make_bucket_boundaries(self.max_length)
    else:
      boundaries = sorted({int(b) for b in bucket_boundaries if 0 < b < self.max_length})
      boundaries.append(self.max_length)
    if self.max_tokens < self.max_length * batch_size_multiple:
      raise ConfigError(  # the config's task.max_tokens and task.max_length
          f"max_tokens={self.max_tokens} is too small for max_length={self.max_length} with "
          f"batch_size_multiple={batch_size_multiple}: a batch of the longest bucket needs "
          f"max_tokens >= {self.max_length * batch_size_multiple}; raise max_tokens or lower "
          f"max_length.")
    self.buckets = [
        Bucket(boundary, (self.max_tokens // boundary) // batch_size_multiple * batch_size_multiple)
        for boundary in boundaries]
    self.streams = self._all_streams(int(pack_streams)) if pack_streams > 1 else None

    # [num_examples] the length that decides the bucket, and the bucket (-1: over-long).
    self.lengths = np.maximum(examples.source_lengths, examples.target_lengths)
    boundary_array = np.array(boundaries)
    self.bucket_ids = np.searchsorted(boundary_array, self.lengths, side="left")
    self.bucket_ids[self.lengths > self.max_length] = -1
    if self.pack:
      kept = self.bucket_ids >= 0
      self.row_lengths = packing.row_lengths(examples.source_lengths[kept], examples.target_lengths[kept],
                                             self.max_length)
      # The shorter side's row is its share of max_length: the rare example longer than that is dropped too.
      self.bucket_ids[(examples.source_lengths > self.row_lengths[0])
                      | (examples.target_lengths > self.row_lengths[1])] = -1
    self.num_dropped = int(np.sum(self.bucket_ids < 0)) if self.train else 0
    if self.train and self.num_dropped == len(examples):
      raise ValueError(f"No training example is at most max_length={self.max_length} tokens long "
                       f"({len(examples)} examples, longest {self.lengths.max(initial=0)}).")
    # epoch -> its plan (a Future: computed here, or ahead on a thread by ``plan_ahead``); the latest two kept.
    self._plans: dict[int, concurrent.futures.Future] = {}
    self._plans_lock = threading.Lock()

  def _all_streams(self, count: int) -> packing.Streams:
    rows = self.buckets[0].batch_size
    if rows % count:
      raise ConfigError(  # the config's task.pack_streams and task.batch_size_multiple
          f"pack_streams={count} does not divide the {rows} rows of a packed batch; set batch_size_multiple to a "
          f"multiple of {count} (or pack_streams to a divisor of {rows}).")
    return packing.Streams(count, rows // count, 0, count)

  def plan_rows_of(self, process_index: int, process_count: int) -> None:
    """From now on, plan only the streams (``pack_streams``) whose rows process ``process_index`` of
    ``process_count`` holds; a plan of every row (one stream) stays as it is. ConfigError unless the streams split
    evenly over the processes."""
    if self.streams is None:
      return
    count = self.streams.count
    if count % process_count:
      raise ConfigError(f"pack_streams={count} does not split over {process_count} processes: set "  # task.pack_streams
                        f"pack_streams to a multiple of {process_count}.")
    first = process_index * count // process_count
    with self._plans_lock:
      self.streams = dataclasses.replace(self.streams, first=first, stop=first + count // process_count)
      self._plans.clear()  # plans of other streams: an epoch planned before is planned again for these

  @property
  def batch_shapes(self) -> list[tuple[int, int]]:
    """``(batch_size, length)`` of the batches, one per bucket, shortest first.

    Exact with ``fill_partial_batches``; in evaluation an example longer than ``max_length``
    adds ``(1, k * max_length)``.
    """
    return [(bucket.batch_size, bucket.length) for bucket in self.buckets]

  def epoch_batches(self, epoch: int) -> list[np.ndarray]:
    """The example indices of each batch of ``epoch``, in order (a pure function of seed, epoch), planned once
    per epoch (here, or ahead by ``plan_ahead``)."""
    future, mine = self._plan_future(epoch)
    if mine:
      self._compute_plan(epoch, future)
    return future.result()

  def plan_ahead(self, epoch: int) -> None:
    """Starts planning ``epoch`` on a background thread, unless it is planned or being planned: so that the
    step after an epoch's last batch does not wait for the next epoch's plan. With ``plan_workers`` (packing),
    epochs ``epoch`` to ``epoch + plan_workers - 1`` are planned at once, each in a worker process."""
    if self.pack and self.plan_workers:
      for ahead in range(epoch, epoch + self.plan_workers):
        future, mine = self._plan_future(ahead, keep_from=epoch - 1)
        if mine:
          self._plan_in_worker(ahead, future)
      return
    future, mine = self._plan_future(epoch)
    if mine:
      threading.Thread(target=self._compute_plan, args=(epoch, future), daemon=True,
                       name=f"TokenBatcher plan of epoch {epoch}").start()

  def _plan_in_worker(self, epoch: int, future: concurrent.futures.Future) -> None:
    if self._plan_pool is None:  # spawned, not forked: the parent may hold JAX's threads
      self._plan_pool = concurrent.futures.ProcessPoolExecutor(self.plan_workers,
                                                               mp_context=multiprocessing.get_context("spawn"))
    submitted = self._plan_pool.submit(packed_epoch, self.seed, epoch, self.bucket_ids >= 0,
                                       self.examples.source_lengths, self.examples.target_lengths, self.row_lengths,
                                       self.streams)

    def done(submitted):
      try:
        future.set_result(self._packed_plan(*submitted.result()))
      except BaseException as error:  # pylint: disable=broad-except
        future.set_exception(error)
    submitted.add_done_callback(done)

  def close(self) -> None:
    """Stops the worker processes of ``plan_workers``, if any were started (plans already made are kept)."""
    if self._plan_pool is not None:
      self._plan_pool.shutdown(wait=False, cancel_futures=True)
      self._plan_pool = None

  def _plan_future(self, epoch: int, keep_from: int | None = None) -> tuple[concurrent.futures.Future, bool]:
    """``(the Future of epoch's plan, whether the caller must compute it)``; forgets plans before ``keep_from``
    (default ``epoch - 1``)."""
    with self._plans_lock:
      future = self._plans.get(epoch)
      if future is not None:
        return future, False
      keep_from = epoch - 1 if keep_from is None else keep_from
      for old in [e for e in self._plans if e < keep_from]:
        del self._plans[old]
      future = self._plans[epoch] = concurrent.futures.Future()
      return future, True

  def _compute_plan(self, epoch: int, future: concurrent.futures.Future) -> None:
    try:
      future.set_result(self._packed_batches(epoch) if self.pack else self._bucketed_batches(epoch))
    except BaseException as error:  # pylint: disable=broad-except
      future.set_exception(error)  # raised where the plan is used

  def _bucketed_batches(self, epoch: int) -> list[np.ndarray]:
    batches = []
    if self.train:
      rng = np.random.default_rng([self.seed, epoch])
      order = rng.permutation(len(self.examples))
    else:
      order = np.arange(len(self.examples))
    bucket_of_order = self.bucket_ids[order]
    for bucket_id, bucket in enumerate(self.buckets):
      members = order[bucket_of_order == bucket_id]
      batches.extend(members[start:start + bucket.batch_size]
                     for start in range(0, len(members), bucket.batch_size))
    if self.train:
      batches = [batches[i] for i in rng.permutation(len(batches))]
    else:
      batches.extend(order[bucket_of_order < 0, None])  # over-long: one example per batch
    return batches

  def _packed_batches(self, epoch: int) -> list:
    """``pack``: each batch's rows (example indices per row) in ``epoch`` (``packed_epoch``)."""
    return self._packed_plan(*packed_epoch(self.seed, epoch, self.bucket_ids >= 0, self.examples.source_lengths,
                                           self.examples.target_lengths, self.row_lengths, self.streams))

  def _packed_plan(self, examples: np.ndarray, sizes: np.ndarray) -> list:
    """The rows of ``packed_epoch``'s two arrays cut into batches of the rows planned here."""
    rows = np.split(examples, np.cumsum(sizes)[:-1]) if len(sizes) else []
    return [rows[start:start + self._planned_rows] for start in range(0, len(rows), self._planned_rows)]

  @property
  def _planned_rows(self) -> int:
    """Rows of a full packed batch that this batcher plans: all, or those of its streams."""
    return self.buckets[0].batch_size if self.streams is None else self.streams.planned_rows

  def num_batches(self, epoch: int = 0) -> int:
    return len(self.epoch_batches(epoch))

  def make_batch(self, indices: np.ndarray, process_index: int = 0,
                 process_count: int = 1) -> dict[str, np.ndarray]:
    """Pads the examples ``indices`` into a batch (see the module docstring); with ``pack``, ``indices`` are the
    batch's rows (``epoch_batches``).

    With ``process_count`` > 1, only rows ``hosts.host_range`` of that batch, equal to ``hosts.host_rows`` of the
    whole one: only their examples are read and padded. ValueError if the rows do not split evenly, or (streams)
    if they were not planned here (``plan_rows_of``)."""
    if self.pack:
      full = self.fill_partial_batches or self.streams is not None  # a streamed batch is never partial
      start, stop = hosts.host_range(self.buckets[0].batch_size if full else len(indices), process_index,
                                     process_count)
      first = 0 if self.streams is None else self.streams.first_row  # the global row of indices[0]
      if self.streams is not None and not first <= start < stop <= first + len(indices):
        raise ValueError(f"rows [{start}, {stop}) of the batch were not planned here (rows [{first}, "
                         f"{first + len(indices)})): plan_rows_of({process_index}, {process_count}) first.")
      return packing.make_packed_batch(indices[start - first:stop - first], self.examples, stop - start,
                                       *self.row_lengths)
    bucket_id = self.bucket_ids[indices[0]]
    if bucket_id >= 0:
      bucket = self.buckets[bucket_id]
      length = bucket.length
      rows = bucket.batch_size if self.fill_partial_batches else len(indices)
    else:  # an over-long evaluation example, alone in its batch
      length = -(-int(self.lengths[indices[0]]) // self.max_length) * self.max_length
      rows = 1
    start, stop = hosts.host_range(rows, process_index, process_count)
    mine = np.asarray(indices[start:stop], np.int64)
    examples = self.examples
    batch = {"source": padded_rows(examples.source_tokens, examples.source_offsets, mine, stop - start, length),
             "target": padded_rows(examples.target_tokens, examples.target_offsets, mine, stop - start, length)}
    if self.include_index:
      batch["index"] = np.full([stop - start], -1, np.int32)
      batch["index"][:len(mine)] = mine
    return batch

  def padding_fraction(self, epoch: int = 0) -> float:
    """Fraction of the positions of ``epoch``'s batches (source and target) that are padding."""
    source_lengths = self.examples.source_lengths
    target_lengths = self.examples.target_lengths
    real = padded = 0
    if self.pack:
      for rows in self.epoch_batches(epoch):
        indices = np.concatenate(rows)
        padded += (self._planned_rows if self.fill_partial_batches else len(rows)) * sum(self.row_lengths)
        real += int(source_lengths[indices].sum() + target_lengths[indices].sum())
      return 1.0 - real / padded if padded else 0.0
    for indices in self.epoch_batches(epoch):
      rows, length = self._batch_shape(indices)
      padded += 2 * rows * length
      real += int(source_lengths[indices].sum() + target_lengths[indices].sum())
    return 1.0 - real / padded if padded else 0.0

  def _batch_shape(self, indices: np.ndarray) -> tuple[int, int]:
    bucket_id = self.bucket_ids[indices[0]]
    if bucket_id < 0:
      return 1, -(-int(self.lengths[indices[0]]) // self.max_length) * self.max_length
    bucket = self.buckets[bucket_id]
    return (bucket.batch_size if self.fill_partial_batches else len(indices)), bucket.length

  def iterator(self, num_epochs: int | None = None) -> BatchIterator:
    """A :class:`BatchIterator` over ``num_epochs`` epochs (None: forever)."""
    return BatchIterator(self, num_epochs=num_epochs)


class BatchIterator:
  """Iterates a :class:`TokenBatcher` epoch after epoch; its position saves and restores.

  ``get_state()`` is ``{"epoch": e, "batch": i, "seed": s, "num_examples": n}``: the next batch
  is batch ``i`` of epoch ``e``. A fresh iterator over the same examples and settings, given
  that state with ``set_state``, yields exactly the batches that would have followed.

  While it walks epoch ``e``, the plan of ``e + 1`` is made on a background thread (``TokenBatcher.plan_ahead``).
  After ``build_host_rows(i, n)`` (``hosts.HostShard`` calls it) each batch is only process ``i``'s rows of the
  global batch (``hosts.host_rows`` of it), only those examples are read and padded, and with ``pack_streams`` only
  their streams are planned (``TokenBatcher.plan_rows_of``).
  """

  def __init__(self, batcher: TokenBatcher, num_epochs: int | None = None):
    self.batcher = batcher
    self.num_epochs = num_epochs
    self._epoch = 0
    self._batch = 0
    self.process_index, self.process_count = 0, 1

  def build_host_rows(self, process_index: int, process_count: int) -> bool:
    hosts.host_range(process_count, process_index, process_count)  # checks the pair
    self.batcher.plan_rows_of(process_index, process_count)
    self.process_index, self.process_count = int(process_index), int(process_count)
    return True

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    while self.num_epochs is None or self._epoch < self.num_epochs:
      plan = self.batcher.epoch_batches(self._epoch)
      if self._batch < len(plan):
        if self.num_epochs is None or self._epoch + 1 < self.num_epochs:
          self.batcher.plan_ahead(self._epoch + 1)
        batch = self.batcher.make_batch(plan[self._batch], self.process_index, self.process_count)
        self._batch += 1
        return batch
      if not plan:
        raise StopIteration  # nothing to batch at all; also ends an endless iterator
      self._epoch, self._batch = self._epoch + 1, 0
    raise StopIteration

  @property
  def batch_shapes(self) -> list[tuple[int, int]]:
    """The batcher's :attr:`TokenBatcher.batch_shapes`: the shapes a train step will be compiled for."""
    return self.batcher.batch_shapes

  def close(self) -> None:
    """Stops the batcher's planning processes, if any (``TokenBatcher.close``)."""
    self.batcher.close()

  def get_state(self) -> dict[str, Any]:
    return {"epoch": self._epoch, "batch": self._batch, "seed": self.batcher.seed,
            "num_examples": len(self.batcher.examples)}

  def set_state(self, state: dict[str, Any]) -> None:
    expected = {"seed": self.batcher.seed, "num_examples": len(self.batcher.examples)}
    found = {key: state.get(key) for key in expected}
    if found != expected:
      raise ValueError(f"Iterator state {state} was saved for {found}, but this iterator has "
                       f"{expected}: restore it into an iterator over the same data and seed.")
    self._epoch, self._batch = int(state["epoch"]), int(state["batch"])

