"""Packed training batches: every kept example whole, once per epoch, in rows whose segment ids say which
positions are whose; one shape; far less padding than length buckets; the position resumes. Streams: each is the
first fit of its own examples, in its own rows, and one stream is the plan of every row together."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.data.test_batching import random_examples
from transformer.data import batching, packing
from transformer.errors import ConfigError


def _unpack(batch):
  """``[(source, target), ...]`` of every segment of every row, in order."""
  pairs = []
  for row in range(batch["source"].shape[0]):
    for segment in range(1, int(batch["target_segments"][row].max(initial=0)) + 1):
      pairs.append((batch["source"][row][batch["source_segments"][row] == segment],
                    batch["target"][row][batch["target_segments"][row] == segment]))
  return pairs


def test_every_kept_example_whole_once_per_epoch_in_one_shape():
  examples = random_examples(600, 70, seed=2)
  batcher = batching.TokenBatcher(examples, max_tokens=512, max_length=64, seed=3, pack=True,
                                  batch_size_multiple=4)
  source_length, target_length = batcher.row_lengths
  assert batcher.batch_shapes == [(8, target_length)] and max(batcher.row_lengths) == 64
  kept = ((examples.source_lengths <= source_length) & (examples.target_lengths <= target_length))
  expected = sorted((tuple(examples.source(i)), tuple(examples.target(i))) for i in np.flatnonzero(kept))
  for epoch_index in range(2):
    batches = [batcher.make_batch(rows) for rows in batcher.epoch_batches(epoch_index)]
    for batch in batches:
      assert batch["source"].shape == batch["source_segments"].shape == (8, source_length)
      assert batch["target"].shape == batch["target_segments"].shape == (8, target_length)
      for side in ("source", "target"):  # padding is exactly segment 0, and segments are contiguous runs
        np.testing.assert_array_equal(batch[side] == 0, batch[f"{side}_segments"] == 0)
        assert (np.diff(batch[f"{side}_segments"], axis=1)[batch[f"{side}_segments"][:, 1:] > 0] >= 0).all()
    found = sorted((tuple(s), tuple(t)) for batch in batches for s, t in _unpack(batch))
    assert found == expected


def test_packing_leaves_little_padding_where_buckets_leave_much():
  examples = random_examples(2000, 30, seed=5)
  packed = batching.TokenBatcher(examples, max_tokens=1024, max_length=128, pack=True)
  bucketed = batching.TokenBatcher(examples, max_tokens=1024, max_length=128)
  assert packed.padding_fraction() < 0.05 < bucketed.padding_fraction()
  assert len(packed.batch_shapes) == 1 < len(bucketed.batch_shapes)


def test_the_shorter_side_gets_its_share_of_the_row():
  source = np.full(100, 10)
  assert packing.row_lengths(source, np.full(100, 20), 64) == (32, 64)
  assert packing.row_lengths(np.full(100, 20), source, 64) == (64, 32)
  assert packing.row_lengths(np.zeros(100, int), source, 64) == (0, 64)  # a language model's sentences
  rows = packing.pack_rows(np.arange(6), np.array([3, 3, 3, 3, 2, 1]), np.array([4, 5, 4, 4, 1, 1]), 6, 8)
  assert [row.tolist() for row in rows] == [[0, 2], [1, 4, 5], [3]]  # the first row with room on both sides
  lengths = np.array([4, 5, 2])
  assert [row.tolist() for row in packing.pack_rows(np.arange(3), lengths, lengths, 6, 8, open_rows=2)] == [
      [0, 2], [1]]
  assert [row.tolist() for row in packing.pack_rows(np.arange(3), lengths, lengths, 6, 8, open_rows=1)] == [
      [0], [1], [2]]  # the first row was closed when the second started


def test_a_packed_position_resumes_to_the_same_batches():
  examples = random_examples(400, 40, seed=4)
  make = lambda: batching.TokenBatcher(examples, max_tokens=256, max_length=64, seed=9, pack=True)
  reference = make().iterator()
  num_batches = make().num_batches(0)
  expected = [next(reference) for _ in range(2 * num_batches + 2)]
  iterator = make().iterator()
  for _ in range(num_batches + 1):
    next(iterator)
  restored = make().iterator()
  restored.set_state(json.loads(json.dumps(iterator.get_state())))
  for want in expected[num_batches + 1:]:
    got = next(restored)
    assert all(np.array_equal(got[key], want[key]) for key in want)


def test_packing_is_for_training_only():
  with pytest.raises(ValueError, match="pack=True is for training"):
    batching.TokenBatcher(random_examples(10, 8), max_tokens=64, max_length=8, pack=True, train=False)


def _old_pack_rows(order, source_lengths, target_lengths, source_length, target_length, open_rows=packing.OPEN_ROWS):
  """``packing.pack_rows`` as it was (numpy arrays of the open rows' room), the reference the faster one keeps."""
  rows, open_index, room = [], np.zeros([0], np.int64), np.zeros([0, 2], np.int64)
  for example in order:
    needs = (source_lengths[example], target_lengths[example])
    fits = np.flatnonzero((room[:, 0] >= needs[0]) & (room[:, 1] >= needs[1]))
    if len(fits):
      rows[open_index[fits[0]]].append(int(example))
      room[fits[0]] -= needs
      continue
    rows.append([int(example)])
    open_index = np.append(open_index, len(rows) - 1)[-open_rows:]
    room = np.concatenate([room, [[source_length - needs[0], target_length - needs[1]]]])[-open_rows:]
  return [np.asarray(row, np.int64) for row in rows]


@pytest.mark.parametrize("open_rows", [1, 4, packing.OPEN_ROWS])
def test_pack_rows_gives_the_rows_of_the_numpy_implementation(open_rows):
  rng = np.random.default_rng(open_rows)
  source_lengths, target_lengths = rng.integers(1, 40, 3000), rng.integers(0, 60, 3000)
  order = rng.permutation(3000)[:2500]
  got = packing.pack_rows(order, source_lengths, target_lengths, 48, 64, open_rows)
  want = _old_pack_rows(order, source_lengths, target_lengths, 48, 64, open_rows)
  assert [row.tolist() for row in got] == [row.tolist() for row in want]
  assert all(row.dtype == np.int64 for row in got)


@pytest.mark.parametrize("pack_streams", [1, 2])
def test_epochs_planned_by_worker_processes_are_the_ones_planned_here(pack_streams):
  examples = random_examples(400, 40, seed=4)
  options = dict(max_tokens=256, max_length=32, seed=5, pack=True, batch_size_multiple=4, pack_streams=pack_streams)
  here = batching.TokenBatcher(examples, **options)
  expected = [[[row.tolist() for row in batch] for batch in here.epoch_batches(epoch)] for epoch in range(4)]
  workers = batching.TokenBatcher(examples, plan_workers=2, **options)
  try:
    iterator = workers.iterator()
    for _ in range(3 * workers.num_batches(0) + 1):  # into epoch 3: epochs 1-4 planned by the workers
      next(iterator)
    assert workers._plan_pool is not None
    got = [[[row.tolist() for row in batch] for batch in workers.epoch_batches(epoch)] for epoch in range(2, 4)]
    assert got == expected[2:]
  finally:
    workers.close()
  assert workers._plan_pool is None


def _epoch_order(batcher, epoch):
  """The kept examples of ``epoch`` in its shuffled order, as the plan deals them (an independent copy)."""
  order = np.random.default_rng([batcher.seed, epoch]).permutation(len(batcher.examples))
  return order[batcher.bucket_ids[order] >= 0]


def _rows(batches):
  return [[np.asarray(row).tolist() for row in batch] for batch in batches]


def test_each_stream_is_the_first_fit_of_its_own_examples_in_its_own_rows_until_the_first_could_run_out():
  examples = random_examples(1500, 40, seed=6)
  batcher = batching.TokenBatcher(examples, max_tokens=16 * 40, max_length=40, seed=2, pack=True,
                                  batch_size_multiple=4, pack_streams=4)
  for epoch in range(2):
    order, plan = _epoch_order(batcher, epoch), _rows(batcher.epoch_batches(epoch))
    streams = [order[stream::4] for stream in range(4)]
    packed = [_rows([packing.pack_rows(examples_of, examples.source_lengths, examples.target_lengths,
                                       *batcher.row_lengths)])[0] for examples_of in streams]
    # A stream's fewest rows: its tokens over a row's, on the side that needs more.
    fewest = [max(-(-int(examples.source_lengths[s].sum()) // batcher.row_lengths[0]),
                  -(-int(examples.target_lengths[s].sum()) // batcher.row_lengths[1])) for s in streams]
    assert all(len(rows) >= least for rows, least in zip(packed, fewest))
    assert len(plan) == -(-min(fewest) // 4)  # the batch where the first stream could run out is the last
    for stream in range(4):  # rows 4s to 4s + 3 of every batch: the stream's rows in the order they were started,
      kept = packed[stream][:4 * len(plan)]  # then padding rows if it ran out in the last batch
      assert [row for batch in plan for row in batch[4 * stream:4 * stream + 4]] == kept + [[]] * (4 * len(plan) -
                                                                                                   len(kept))


def test_one_stream_is_the_plan_of_every_row_together():
  examples = random_examples(600, 40, seed=7)
  options = dict(max_tokens=8 * 40, max_length=40, seed=3, pack=True, batch_size_multiple=4)
  default, one = batching.TokenBatcher(examples, **options), batching.TokenBatcher(examples, pack_streams=1, **options)
  assert one.streams is None
  for epoch in range(2):
    rows = _rows([packing.pack_rows(_epoch_order(default, epoch), examples.source_lengths, examples.target_lengths,
                                    *default.row_lengths)])[0]
    expected = [rows[start:start + 8] for start in range(0, len(rows), 8)]  # the last batch partial, nothing dropped
    assert _rows(one.epoch_batches(epoch)) == _rows(default.epoch_batches(epoch)) == expected


def test_streams_refuse_batches_they_do_not_divide_and_need_pack():
  examples = random_examples(100, 16, seed=1)
  with pytest.raises(ConfigError, match=r"^pack_streams=3 does not divide the 8 rows of a packed batch; set "
                                        r"batch_size_multiple to a multiple of 3 \(or pack_streams to a divisor "
                                        r"of 8\)\.$"):
    batching.TokenBatcher(examples, max_tokens=8 * 16, max_length=16, pack=True, pack_streams=3)
  with pytest.raises(ValueError, match="above 1 only with pack=True"):
    batching.TokenBatcher(examples, max_tokens=8 * 16, max_length=16, pack_streams=2)


def test_an_epoch_of_streams_ends_in_the_batch_where_the_first_could_run_out_padding_or_dropping_the_rest():
  full = np.full(7, 8)  # every example fills a row: stream 0 (examples 0, 2, 4, 6) 4 rows, stream 1 3 rows
  streams = packing.Streams(count=2, rows=2, first=0, stop=2)
  np.testing.assert_array_equal(packing.fewest_rows(np.arange(7), full, full, (8, 8), 2), [4, 3])
  examples, sizes = packing.pack_streams_flat(np.arange(7), full, full, (8, 8), streams)
  # Batch 0: stream 0's rows [0] [2], stream 1's [1] [3]; batch 1: [4] [6], then [5] and a padding row.
  assert examples.tolist() == [0, 2, 1, 3, 4, 6, 5] and sizes.tolist() == [1, 1, 1, 1, 1, 1, 1, 0]
  tokens = batching.TokenizedExamples.from_sequences([[i + 4] * 8 for i in range(7)], [[i + 4] * 8 for i in range(7)])
  last = packing.make_packed_batch(np.split(examples, np.cumsum(sizes)[:-1])[4:], tokens, 4, 8, 8)
  assert last["target"][:, 0].tolist() == [8, 10, 9, 0] and not last["target_segments"][3].any()  # all padding
  lengths = np.array([5, 8, 5, 8, 5])  # stream 0: three 5s, one per row, but 15 tokens could fill 2 rows of 8
  examples, sizes = packing.pack_streams_flat(np.arange(5), lengths, lengths, (8, 8),
                                              packing.Streams(count=2, rows=1, first=0, stop=2))
  assert examples.tolist() == [0, 1, 2, 3] and sizes.tolist() == [1, 1, 1, 1]  # stream 0's third row dropped
  examples, sizes = packing.pack_streams_flat(np.arange(5), lengths, lengths, (8, 8),
                                              packing.Streams(count=2, rows=1, first=1, stop=2))
  assert examples.tolist() == [1, 3] and sizes.tolist() == [1, 1]  # process 1 of 2: its stream alone
