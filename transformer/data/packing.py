"""Packing: whole examples one after another in rows of fixed length, told apart by segment ids (as flax's WMT
example packs), so that training compiles one batch shape and carries almost no padding.

A packed batch is ``{"source", "target", "source_segments", "target_segments"}``, int32 ``[rows, source_length]``
and ``[rows, target_length]``: the ``k``-th example of a row (``k`` from 1) fills consecutive positions of both
sides with segment id ``k``, and padding has id 0 (and token ``PAD_ID``). An example is never split across rows.
``EncoderDecoder(...)(source, target, source_segments, target_segments)`` keeps attention within each example
and restarts its positions, so each example is computed as if alone (tests/nn/test_packing.py).

Rows are filled first-fit: each example, in the epoch's shuffled order, goes to the first of the last
``OPEN_ROWS`` rows with room on both sides, else starts a new row.

Streams (:class:`Streams`, ``TokenBatcher(pack_streams=S)``): the epoch's order is dealt into ``S`` streams, each
packed alone by the same first fit into its own block of rows of every global batch, so that a process plans only
the streams of its rows (1/n of the epoch on each of n processes) and the plan still does not depend on n.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

import numpy as np

PAD_ID = 0  # == tokenizers.PAD_ID, as in batching.py
OPEN_ROWS = 64  # rows still taking examples: more fill rows more densely, each example then costs more to place
LENGTH_MULTIPLE = 8  # the shorter side's row length is rounded up to this (matrix tiles)


def row_lengths(source_lengths: np.ndarray, target_lengths: np.ndarray, max_length: int) -> tuple[int, int]:
  """``(source, target)`` positions of a packed row: ``max_length`` for the side with more tokens in total, the
  other side its share of that (rounded up to a multiple of ``LENGTH_MULTIPLE``, at most ``max_length``), so
  that both sides fill alike; a side without tokens (a language model's sources) gets 0."""
  totals = float(np.sum(source_lengths)), float(np.sum(target_lengths))
  longer = max(totals)
  lengths = []
  for total in totals:
    share = max_length * total / longer if longer else 0.0
    lengths.append(min(max_length, int(np.ceil(share / LENGTH_MULTIPLE)) * LENGTH_MULTIPLE))
  return lengths[0], lengths[1]


def pack_rows(order: np.ndarray, source_lengths: np.ndarray, target_lengths: np.ndarray, source_length: int,
              target_length: int, open_rows: int = OPEN_ROWS) -> list[np.ndarray]:
  """The example indices of each row, in the order rows were started (first fit; see the module docstring).

  ``order``: the examples to pack, in order; each must fit a row on both sides (callers drop the others).
  Plain Python lists, not numpy: with at most ``open_rows`` rows to scan per example, a numpy call's overhead
  costs more than the scan itself.
  """
  return [np.asarray(row, np.int64) for row in _first_fit(order, source_lengths, target_lengths, source_length,
                                                          target_length, open_rows)]


def pack_rows_flat(order: np.ndarray, source_lengths: np.ndarray, target_lengths: np.ndarray, source_length: int,
                   target_length: int, open_rows: int = OPEN_ROWS) -> tuple[np.ndarray, np.ndarray]:
  """:func:`pack_rows` as two arrays, cheap to send between processes: ``(examples int64 [kept], sizes int64
  [rows])``, the rows' examples one row after another and how many each row holds."""
  return _flat(_first_fit(order, source_lengths, target_lengths, source_length, target_length, open_rows))


@dataclasses.dataclass(frozen=True)
class Streams:
  """The epoch's order dealt into ``count`` streams (position ``p`` of the order to stream ``p % count``); stream
  ``s`` fills rows ``[s * rows, (s + 1) * rows)`` of every global batch, and this process plans streams
  ``[first, stop)``."""
  count: int  # streams of an epoch (config.task.pack_streams)
  rows: int  # each stream's rows of a global batch
  first: int  # the first stream planned here
  stop: int  # one past the last

  @property
  def first_row(self) -> int:
    """The global batch row where this process's planned rows start."""
    return self.first * self.rows

  @property
  def planned_rows(self) -> int:
    """Rows of each global batch planned here."""
    return (self.stop - self.first) * self.rows


def fewest_rows(order: np.ndarray, source_lengths: np.ndarray, target_lengths: np.ndarray,
                row_lengths: tuple[int, int], count: int) -> np.ndarray:
  """int64 ``[count]``: the fewest rows any packing of each stream of ``order`` can fill (its tokens over a row's,
  on the side that needs more); known without packing, so that every process agrees where an epoch ends."""
  stream = np.arange(len(order)) % count
  fewest = np.zeros([count], np.int64)
  for lengths, row_length in zip((source_lengths, target_lengths), row_lengths):
    if row_length:  # a language model's sources are empty
      tokens = np.bincount(stream, np.asarray(lengths)[order], minlength=count).astype(np.int64)
      fewest = np.maximum(fewest, -(-tokens // row_length))
  return fewest


def pack_streams_flat(order: np.ndarray, source_lengths: np.ndarray, target_lengths: np.ndarray,
                      row_lengths: tuple[int, int], streams: Streams,
                      open_rows: int = OPEN_ROWS) -> tuple[np.ndarray, np.ndarray]:
  """The rows of streams ``[streams.first, streams.stop)`` of ``order``, each stream packed first fit on its own
  (:func:`pack_rows`), in the order the global batches hold them: batch 0's rows of the first stream, of the next,
  ..., then batch 1's. As :func:`pack_rows_flat`: ``(examples int64 [kept], sizes int64 [batches * planned_rows])``,
  a padding row of size 0.

  The epoch ends in the batch where the first stream could run out (``batches = ceil(min(fewest_rows) /
  streams.rows)``; a stream knows only its own length): a stream that ran out fills its rows of that last batch
  with padding rows, as the single-stream plan fills its last batch, and a stream's rows past ``batches *
  streams.rows`` are dropped (their examples are not seen this epoch).
  """
  fewest = int(fewest_rows(order, source_lengths, target_lengths, row_lengths, streams.count).min())
  rows_kept = -(-fewest // streams.rows) * streams.rows
  packed = [_first_fit(order[stream::streams.count], source_lengths, target_lengths, *row_lengths, open_rows)
            for stream in range(streams.first, streams.stop)]
  packed = [rows[:rows_kept] + [[]] * (rows_kept - len(rows)) for rows in packed]
  return _flat([row for start in range(0, rows_kept, streams.rows)
                for rows in packed for row in rows[start:start + streams.rows]])


def _flat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
  """``(examples int64 [kept], sizes int64 [rows])`` of the rows' examples, one row after another."""
  sizes = np.fromiter(map(len, rows), np.int64, len(rows))
  return np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(sizes.sum())), sizes


def _first_fit(order, source_lengths, target_lengths, source_length, target_length, open_rows) -> list[list[int]]:
  rows: list[list[int]] = []
  open_slots: list[list] = []  # the open rows, oldest first: [source room, target room, the row's examples]
  order = np.asarray(order, np.int64)
  # Only the lengths of ``order``, gathered once: a stream's packing reads 1/count of them.
  needs = zip(order.tolist(), np.asarray(source_lengths)[order].tolist(), np.asarray(target_lengths)[order].tolist())
  for example, source_need, target_need in needs:
    for slot in open_slots:
      if slot[0] >= source_need and slot[1] >= target_need:
        slot[2].append(example)
        slot[0] -= source_need
        slot[1] -= target_need
        break
    else:
      rows.append([example])
      open_slots.append([source_length - source_need, target_length - target_need, rows[-1]])
      if len(open_slots) > open_rows:
        del open_slots[0]
  return rows


def make_packed_batch(rows: Sequence[np.ndarray], examples, num_rows: int, source_length: int,
                      target_length: int) -> dict[str, np.ndarray]:
  """The batch of ``rows`` (example indices of ``examples``, a ``batching.TokenizedExamples``), filled to
  ``num_rows`` with all-padding rows. One gather per array, no loop over rows or examples."""
  counts = np.array([len(row) for row in rows], np.int64)
  flat = np.concatenate(rows).astype(np.int64) if len(rows) else np.zeros([0], np.int64)
  row_of = np.repeat(np.arange(len(counts)), counts)  # each example's row
  first_of_row = np.repeat(np.cumsum(counts) - counts, counts)  # the position in ``flat`` of its row's first
  segments = np.arange(len(flat)) - first_of_row + 1
  batch = {}
  for side, length in (("source", source_length), ("target", target_length)):
    tokens, offsets = getattr(examples, f"{side}_tokens"), getattr(examples, f"{side}_offsets")
    starts = offsets[flat]
    lengths = offsets[flat + 1] - starts
    ends = np.cumsum(lengths)
    firsts = ends - lengths  # where each example starts among the batch's tokens of this side
    columns = firsts - firsts[first_of_row] if len(flat) else firsts  # where it starts in its row
    within = np.arange(int(lengths.sum())) - np.repeat(firsts, lengths)  # each token's place in its example
    token_rows, token_columns = np.repeat(row_of, lengths), np.repeat(columns, lengths) + within
    if len(flat) and (columns + lengths).max() > length:
      raise ValueError(f"packed examples of {(columns + lengths).max()} {side} tokens overflow a row of {length}.")
    batch[side] = np.full([num_rows, length], PAD_ID, np.int32)
    batch[side][token_rows, token_columns] = tokens[np.repeat(starts, lengths) + within]
    batch[f"{side}_segments"] = np.full([num_rows, length], PAD_ID, np.int32)
    batch[f"{side}_segments"][token_rows, token_columns] = np.repeat(segments, lengths)
  return {name: batch[name] for name in ("source", "target", "source_segments", "target_segments")}
