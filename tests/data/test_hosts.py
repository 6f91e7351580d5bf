"""Data on many hosts: the processes' rows of each global batch put back together are the global batch, past
epoch ends, for every kind of training iterator (packed streams too, each process packing only its own); a position
saved on one process count resumes on another; ``host_rows`` refuses what does not split; ``pad_rows`` fills with
rows that name no example."""
from __future__ import annotations

import json

import ml_collections
import numpy as np
import pytest

from transformer.data import batching, packing, prefetch, timeseries
from transformer.data.classification import ShuffledBatches
from transformer.data.hosts import HostShard, host_rows, pad_rows
from transformer.data.synthetic import SyntheticBatches
from transformer.errors import ConfigError
from transformer.tasks.language_model import SentenceBatcher


def _token_examples(count: int, max_length: int, seed: int) -> batching.TokenizedExamples:
  """Ids in [4, 100) (never the pad id 0), lengths in [1, max_length]."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, max_length + 1, (2, count))
  return batching.TokenizedExamples.from_sequences([rng.integers(4, 100, n) for n in lengths[0]],
                                                   [rng.integers(4, 100, n) for n in lengths[1]])


def _token_batcher(batcher_class=batching.TokenBatcher, **options):
  # Buckets 8 / 16 / 24 hold 12 / 4 / 4 rows: every bucket splits over 2 and 4 processes.
  return batcher_class(_token_examples(70, 24, seed=5), max_tokens=96, max_length=24, seed=1,
                       batch_size_multiple=4, **options)


def _synthetic():
  config = ml_collections.ConfigDict({"kind": "sort", "num_symbols": 10, "min_length": 1, "max_length": 7})
  return SyntheticBatches(config, batch_size=8, seed=3), 5  # no epochs: any count of batches


def _token_batches():
  batcher = _token_batcher(include_index=True)
  return prefetch.PrefetchIterator(batcher.iterator()), batcher.num_batches()


def _sentences():
  batcher = _token_batcher(SentenceBatcher)
  return prefetch.PrefetchIterator(batcher.iterator()), batcher.num_batches()


def _packed_streams():
  batcher = _eight_way_batcher(pack=True, pack_streams=4)  # 2 rows of each batch per stream
  return prefetch.PrefetchIterator(batcher.iterator()), batcher.num_batches()


def _windows():
  hours = 80
  features = np.arange(hours, dtype=np.float32)[:, None] * np.array([1, -1], np.float32)
  mask = np.ones(hours, bool)
  mask[30:40] = False
  series = timeseries.WindowedSeries(features, np.arange(hours, dtype=np.float32), mask, input_length=4,
                                     horizons=(1, 3))
  iterator = series.train_iterator(batch_size=8, seed=2)
  return iterator, iterator.batches_per_epoch


def _classification():
  rng = np.random.default_rng(4)
  lengths = rng.integers(1, 13, 50)
  tokens = np.where(np.arange(12) < lengths[:, None], rng.integers(5, 50, (50, 12)), 0).astype(np.int32)
  labels = rng.integers(0, 2, 50).astype(np.int32)
  return ShuffledBatches(tokens, labels, batch_size=8, seed=6, length_multiple=4), 50 // 8


ITERATORS = {"synthetic": _synthetic, "token_batches": _token_batches, "language_model": _sentences,
             "windows": _windows, "classification": _classification, "packed_streams": _packed_streams}


def _take(iterator, count: int) -> list[dict]:
  return [next(iterator) for _ in range(count)]


def _close(*iterators) -> None:
  for iterator in iterators:
    if hasattr(iterator, "close"):
      iterator.close()


def _assert_batches_equal(got: list[dict], want: list[dict]) -> None:
  assert len(got) == len(want)
  for step, (got_batch, want_batch) in enumerate(zip(got, want)):
    assert set(got_batch) == set(want_batch)
    for name in want_batch:
      np.testing.assert_array_equal(got_batch[name], want_batch[name], err_msg=f"batch {step}, {name}")
      assert got_batch[name].dtype == want_batch[name].dtype


def _joined(shards: list[list[dict]]) -> list[dict]:
  """Batch ``s`` of every process's list, rows concatenated in process order."""
  return [{name: np.concatenate([shard[step][name] for shard in shards]) for name in shards[0][step]}
          for step in range(len(shards[0]))]


@pytest.mark.parametrize("process_count", [2, 4])
@pytest.mark.parametrize("kind", sorted(ITERATORS))
def test_the_processes_rows_joined_are_the_global_batches_past_epoch_ends(kind, process_count):
  reference, per_epoch = ITERATORS[kind]()
  count = 2 * per_epoch + 3
  expected = _take(reference, count)
  shards = []
  for process in range(process_count):
    shard = HostShard(ITERATORS[kind]()[0], process, process_count)
    shards.append(_take(shard, count))
    assert shard.get_state() == reference.get_state()  # the position is global
    _close(shard)
  for step in range(count):  # every process feeds the same shapes at a step
    shapes = {tuple((name, value.shape) for name, value in shard[step].items()) for shard in shards}
    assert len(shapes) == 1
    assert next(iter(shapes))[0][1][0] * process_count == next(iter(expected[step].values())).shape[0]
  _assert_batches_equal(_joined(shards), expected)
  _close(reference)


@pytest.mark.parametrize("saved_on, restored_on", [((1, 2), 1), ((0, 1), 2), ((3, 4), 2)])
@pytest.mark.parametrize("kind", sorted(ITERATORS))
def test_a_position_saved_on_one_process_count_resumes_the_global_batches_on_another(kind, saved_on,
                                                                                      restored_on):
  reference, per_epoch = ITERATORS[kind]()
  skip, count = per_epoch + 1, per_epoch + 2  # saved in the second epoch, resumed into the third
  expected = _take(reference, skip + count)[skip:]
  saver = HostShard(ITERATORS[kind]()[0], *saved_on)
  _take(saver, skip)
  state = json.loads(json.dumps(saver.get_state()))  # as a checkpoint stores it
  restored = []
  for process in range(restored_on):
    shard = HostShard(ITERATORS[kind]()[0], process, restored_on)
    shard.set_state(state)
    restored.append(_take(shard, count))
    _close(shard)
  _assert_batches_equal(_joined(restored), expected)
  _close(reference, saver)


@pytest.mark.parametrize("kind", sorted(ITERATORS))
def test_one_process_sees_the_global_batches_themselves(kind):
  reference, per_epoch = ITERATORS[kind]()
  shard = HostShard(ITERATORS[kind]()[0], 0, 1)
  _assert_batches_equal(_take(shard, per_epoch + 1), _take(reference, per_epoch + 1))
  assert shard.get_state() == reference.get_state()
  batch = {"rows": np.arange(4)}
  assert host_rows(batch, 0, 1) is batch
  _close(reference, shard)


def test_batch_shapes_are_the_global_ones_with_the_rows_divided():
  iterator = prefetch.PrefetchIterator(_token_batcher().iterator())
  assert iterator.batch_shapes == [(12, 8), (4, 16), (4, 24)]
  assert HostShard(iterator, 3, 4).batch_shapes == [(3, 8), (1, 16), (1, 24)]
  assert HostShard(iterator, 0, 1).batch_shapes == iterator.batch_shapes
  with pytest.raises(ValueError, match="4 rows does not split evenly over 3 processes"):
    HostShard(iterator, 0, 3).batch_shapes  # pylint: disable=expression-not-assigned
  iterator.close()
  assert not hasattr(HostShard(_synthetic()[0], 0, 2), "batch_shapes")  # fixed batch_size: nothing to list


def test_host_rows_takes_contiguous_rows_and_refuses_what_does_not_split():
  batch = {"tokens": np.arange(24).reshape(6, 4), "label": np.arange(6)}
  rows = host_rows(batch, 1, 3)
  np.testing.assert_array_equal(rows["tokens"], batch["tokens"][2:4])
  np.testing.assert_array_equal(rows["label"], [2, 3])
  with pytest.raises(ValueError, match="6 rows does not split evenly over 4 processes"):
    host_rows(batch, 0, 4)
  with pytest.raises(ValueError, match="process_index=2, process_count=2"):
    host_rows(batch, 2, 2)
  with pytest.raises(ValueError, match="leading sizes"):
    host_rows({"a": np.zeros(4), "b": np.zeros(2)}, 0, 2)


def test_pad_rows_appends_zero_rows_with_index_minus_one_and_leaves_divisible_batches_alone():
  batch = {"source": np.arange(1, 16, dtype=np.int32).reshape(5, 3), "index": np.arange(5, dtype=np.int32),
           "weight": np.ones(5, np.float32), "mask": np.ones((5, 2), bool)}
  padded = pad_rows(batch, 4)
  assert {name: value.shape[0] for name, value in padded.items()} == dict.fromkeys(batch, 8)
  assert {name: value.dtype for name, value in padded.items()} == {name: v.dtype for name, v in batch.items()}
  for name, value in batch.items():
    np.testing.assert_array_equal(padded[name][:5], value)
  np.testing.assert_array_equal(padded["index"][5:], [-1, -1, -1])
  assert not padded["source"][5:].any() and not padded["weight"][5:].any() and not padded["mask"][5:].any()
  assert pad_rows(batch, 5) is batch and pad_rows(batch, 1) is batch
  with pytest.raises(ValueError, match="multiple must be >= 1"):
    pad_rows(batch, 0)
  # The use: an evaluation batch split over processes x devices.
  _assert_batches_equal(_joined([[host_rows(padded, i, 2)] for i in range(2)]), [padded])


def _old_make_batch(batcher, indices):
  """``TokenBatcher.make_batch`` as it was before each process built only its rows: a loop over rows."""
  if batcher.pack:
    rows = batcher.buckets[0].batch_size if batcher.fill_partial_batches else len(indices)
    source_length, target_length = batcher.row_lengths
    batch = {name: np.zeros([rows, length], np.int32)
             for name, length in (("source", source_length), ("target", target_length),
                                  ("source_segments", source_length), ("target_segments", target_length))}
    for row, members in enumerate(indices):
      starts = {"source": 0, "target": 0}
      for segment, index in enumerate(members, start=1):
        for side, tokens in zip(("source", "target"), batcher.examples[index]):
          start, stop = starts[side], starts[side] + len(tokens)
          batch[side][row, start:stop] = tokens
          batch[f"{side}_segments"][row, start:stop] = segment
          starts[side] = stop
    return batch
  bucket = batcher.buckets[batcher.bucket_ids[indices[0]]]
  rows = bucket.batch_size if batcher.fill_partial_batches else len(indices)
  batch = {"source": np.zeros([rows, bucket.length], np.int32), "target": np.zeros([rows, bucket.length], np.int32)}
  for row, index in enumerate(indices):
    source, target = batcher.examples[index]
    batch["source"][row, :len(source)] = source
    batch["target"][row, :len(target)] = target
  if batcher.include_index:
    batch["index"] = np.full([rows], -1, np.int32)
    batch["index"][:len(indices)] = indices
  return batch


def _eight_way_batcher(**options):
  # Buckets of 16 / 8 / 8 rows (packed: 8 rows): every batch splits over 1, 2, 4 and 8 processes.
  return batching.TokenBatcher(_token_examples(150, 24, seed=7), max_tokens=192, max_length=24, seed=2,
                               batch_size_multiple=8, **options)


@pytest.mark.parametrize("options", [{"include_index": True}, {"pack": True}, {"fixed_shape": True}], ids=str)
def test_each_process_builds_its_rows_of_the_old_global_batches_for_1_2_4_8_processes(options):
  """The processes' own rows, put together, are the batches the loop over rows built whole, for any count."""
  reference = _eight_way_batcher(**options)
  per_epoch = reference.num_batches(0)
  expected = [_old_make_batch(reference, reference.epoch_batches(epoch)[batch])
              for epoch in range(2) for batch in range(per_epoch if epoch == 0 else reference.num_batches(1))]
  for process_count in (1, 2, 4, 8):
    shards = []
    for process in range(process_count):
      shard = HostShard(prefetch.PrefetchIterator(_eight_way_batcher(**options).iterator()), process, process_count)
      assert shard.builds_rows == (process_count > 1)
      shards.append(_take(shard, len(expected)))
      _close(shard)
    _assert_batches_equal(_joined(shards), expected)


def test_a_process_reads_only_the_examples_of_its_rows():
  batcher = _eight_way_batcher(include_index=True)
  indices = batcher.epoch_batches(0)[0]
  rows = batcher.buckets[batcher.bucket_ids[indices[0]]].batch_size
  for process in range(4):
    read = []
    original = batching.padded_rows
    def spy(tokens, offsets, chosen, *args):
      read.append(np.asarray(chosen).tolist())
      return original(tokens, offsets, chosen, *args)
    batching.padded_rows = spy
    try:
      batcher.make_batch(indices, process, 4)
    finally:
      batching.padded_rows = original
    mine = indices[process * rows // 4:(process + 1) * rows // 4].tolist()
    assert read == [mine, mine]  # source and target: this process's examples, no other


def test_the_global_plan_is_the_same_for_any_process_count_and_made_once_per_epoch_ahead_of_it():
  plans = {}
  for process_count in (1, 2, 4, 8):
    batcher = _eight_way_batcher(pack=True)
    made = []
    original = batcher._packed_batches
    batcher._packed_batches = lambda epoch: made.append(epoch) or original(epoch)
    iterator = batcher.iterator()
    iterator.build_host_rows(process_count - 1, process_count)
    first = batcher.num_batches(0)
    _take(iterator, first + 2)
    batcher._plans[1].result()
    batcher._plans[2].result(timeout=10)  # planned while epoch 1 is walked, before its first batch is needed
    assert sorted(made) == [0, 1, 2]  # once per epoch, however many batches were drawn
    plans[process_count] = [[np.asarray(row).tolist() for row in batch] for batch in batcher.epoch_batches(1)]
  assert all(plan == plans[1] for plan in plans.values())


@pytest.mark.parametrize("restored_on", [1, 4])
def test_packed_streams_saved_on_two_processes_resume_on_one_and_on_four(restored_on):
  reference, per_epoch = _packed_streams()
  skip, count = per_epoch + 1, per_epoch + 2  # saved in the second epoch, resumed into the third
  expected = _take(reference, skip + count)[skip:]
  savers = [HostShard(_packed_streams()[0], process, 2) for process in range(2)]
  for saver in savers:
    _take(saver, skip)
  state = json.loads(json.dumps(savers[1].get_state()))
  assert state == savers[0].get_state()  # the position is global: either process's resumes both
  restored = []
  for process in range(restored_on):
    shard = HostShard(_packed_streams()[0], process, restored_on)
    shard.set_state(state)
    restored.append(_take(shard, count))
    _close(shard)
  _assert_batches_equal(_joined(restored), expected)
  _close(reference, *savers)


def test_a_process_packs_only_the_streams_of_its_rows():
  packed = []
  original = packing._first_fit
  def spy(order, *args):
    packed.append(len(order))
    return original(order, *args)
  packing._first_fit = spy
  try:
    for process_count in (1, 2, 4):
      del packed[:]
      batcher = _eight_way_batcher(pack=True, pack_streams=4)
      batcher.plan_rows_of(process_count - 1, process_count)
      plan = batcher.epoch_batches(0)
      assert len(packed) == 4 // process_count and all(len(rows) == 8 // process_count for rows in plan)
  finally:
    packing._first_fit = original


def test_streams_that_do_not_split_over_the_processes_are_refused_in_one_line_naming_the_fix():
  iterator = _eight_way_batcher(pack=True, pack_streams=4).iterator()
  with pytest.raises(ConfigError, match=r"^pack_streams=4 does not split over 8 processes: set pack_streams to a "
                                        r"multiple of 8\.$"):
    HostShard(iterator, 0, 8)
