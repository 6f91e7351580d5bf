"""Packing: whole examples one after another in rows of fixed length, told apart by segment ids (as flax's WMT
example packs), so that training compiles one batch shape and carries almost no padding.

A packed batch is ``{"source", "target", "source_segments", "target_segments"}``, int32 ``[rows, source_length]``
and ``[rows, target_length]``: the ``k``-th example of a row (``k`` from 1) fills consecutive positions of both
sides with segment id ``k``, and padding has id 0 (and token ``PAD_ID``). An example is never split across rows.
``EncoderDecoder(...)(source, target, source_segments, target_segments)`` keeps attention within each example
and restarts its positions, so each example is computed as if alone (tests/nn/test_packing.py).

Rows are filled first-fit: each example, in the epoch's shuffled order, goes to the first of the last
``OPEN_ROWS`` rows with room on both sides, else starts a new row.
"""
from __future__ import annotations

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
  rows = _first_fit(order, source_lengths, target_lengths, source_length, target_length, open_rows)
  sizes = np.fromiter(map(len, rows), np.int64, len(rows))
  return np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(sizes.sum())), sizes


def _first_fit(order, source_lengths, target_lengths, source_length, target_length, open_rows) -> list[list[int]]:
  rows: list[list[int]] = []
  open_slots: list[list] = []  # the open rows, oldest first: [source room, target room, the row's examples]
  source_needs, target_needs = np.asarray(source_lengths).tolist(), np.asarray(target_lengths).tolist()
  for example in np.asarray(order).tolist():
    source_need, target_need = source_needs[example], target_needs[example]
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
