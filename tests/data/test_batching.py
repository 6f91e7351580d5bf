"""Batching by tokens: coverage, token budget, shapes, padding, determinism, resume, prefetch."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from transformer.data import batching, hosts
from transformer.data.prefetch import PrefetchIterator
from transformer.errors import ConfigError


def random_examples(count: int, max_length: int, seed: int = 0) -> batching.TokenizedExamples:
  """Ids in [4, 100) (never the pad id 0), lengths in [1, max_length], target ~ source length."""
  rng = np.random.default_rng(seed)
  source_lengths = rng.integers(1, max_length + 1, count)
  target_lengths = np.clip(source_lengths + rng.integers(-3, 4, count), 1, max_length)
  return batching.TokenizedExamples.from_sequences(
      [rng.integers(4, 100, n) for n in source_lengths],
      [rng.integers(4, 100, n) for n in target_lengths])


def epoch(batcher, epoch_index=0):
  return [batcher.make_batch(indices) for indices in batcher.epoch_batches(epoch_index)]


def check_batch_content(batcher, batch):
  """Each real row is its example, zero-padded; filler rows are all zero."""
  for row, index in enumerate(batch["index"]):
    if index < 0:
      assert not batch["source"][row].any() and not batch["target"][row].any()
      continue
    source, target = batcher.examples[index]
    assert batch["source"][row, :len(source)].tolist() == source.tolist()
    assert not batch["source"][row, len(source):].any()
    assert batch["target"][row, :len(target)].tolist() == target.tolist()
    assert not batch["target"][row, len(target):].any()


@pytest.mark.parametrize("fixed_shape", [False, True])
def test_every_kept_example_once_per_epoch_within_the_token_budget(fixed_shape):
  examples = random_examples(500, 70)
  batcher = batching.TokenBatcher(examples, max_tokens=512, max_length=64, seed=1,
                                  fixed_shape=fixed_shape, include_index=True)
  kept = np.flatnonzero(np.maximum(examples.source_lengths, examples.target_lengths) <= 64)
  assert batcher.num_dropped == len(examples) - len(kept) > 0
  for epoch_index in range(3):
    batches = epoch(batcher, epoch_index)
    seen = np.concatenate([batch["index"][batch["index"] >= 0] for batch in batches])
    assert sorted(seen.tolist()) == kept.tolist()
    for batch in batches:
      assert batch["source"].dtype == np.int32 and batch["target"].dtype == np.int32
      assert batch["source"].shape == batch["target"].shape
      assert batch["source"].shape[0] * batch["source"].shape[1] <= 512
      assert tuple(batch["source"].shape) in batcher.batch_shapes
      check_batch_content(batcher, batch)
  if fixed_shape:
    assert batcher.batch_shapes == [(8, 64)]


def test_shuffle_is_a_function_of_seed_and_epoch():
  examples = random_examples(300, 40)
  first = batching.TokenBatcher(examples, max_tokens=256, max_length=40, seed=5)
  again = batching.TokenBatcher(examples, max_tokens=256, max_length=40, seed=5)
  other_seed = batching.TokenBatcher(examples, max_tokens=256, max_length=40, seed=6)
  as_lists = lambda batcher, e: [b.tolist() for b in batcher.epoch_batches(e)]
  assert as_lists(first, 0) == as_lists(again, 0)
  assert as_lists(first, 1) == as_lists(again, 1)
  assert as_lists(first, 0) != as_lists(first, 1)
  assert as_lists(first, 0) != as_lists(other_seed, 0)


def test_padding_fraction_matches_the_batches_and_buckets_keep_it_small():
  examples = random_examples(2000, 100, seed=2)
  bucketed = batching.TokenBatcher(examples, max_tokens=2048, max_length=128,
                                   fill_partial_batches=False)
  fixed = batching.TokenBatcher(examples, max_tokens=2048, max_length=128, fixed_shape=True)
  for batcher in (bucketed, fixed):
    batches = epoch(batcher)
    padding = sum(int((b["source"] == 0).sum() + (b["target"] == 0).sum()) for b in batches)
    total = sum(b["source"].size + b["target"].size for b in batches)
    assert batcher.padding_fraction() == pytest.approx(padding / total)
  # Buckets grow by 1.2: padding inside a bucket is at most ~1/6 of it, plus the
  # source/target length difference (up to 3 tokens here).
  assert bucketed.padding_fraction() < 0.2
  assert fixed.padding_fraction() > 2 * bucketed.padding_fraction()


def test_bucket_boundaries_are_few_and_end_at_max_length():
  boundaries = batching.make_bucket_boundaries(256)
  assert boundaries[-1] == 256 and len(boundaries) <= 16
  assert all(b % 8 == 0 for b in boundaries)
  assert boundaries == sorted(set(boundaries))
  assert batching.make_bucket_boundaries(5) == [5]
  batcher = batching.TokenBatcher(random_examples(10, 9), max_tokens=64, max_length=16,
                                  bucket_boundaries=[4, 8, 32], batch_size_multiple=2)
  assert batcher.batch_shapes == [(16, 4), (8, 8), (4, 16)]


def test_too_small_token_budget_is_a_clear_error():
  with pytest.raises(ConfigError, match="max_tokens=100 is too small for max_length=256"):
    batching.TokenBatcher(random_examples(10, 9), max_tokens=100, max_length=256)


def test_eval_keeps_every_example_and_gives_long_ones_their_own_batch():
  examples = random_examples(200, 60, seed=3)
  long_indices = np.flatnonzero(np.maximum(examples.source_lengths, examples.target_lengths) > 32)
  assert len(long_indices) > 0
  batcher = batching.TokenBatcher(examples, max_tokens=256, max_length=32, train=False,
                                  include_index=True)
  batches = list(batcher.iterator(num_epochs=1))
  seen = np.concatenate([batch["index"][batch["index"] >= 0] for batch in batches])
  assert sorted(seen.tolist()) == list(range(len(examples)))  # none dropped
  for batch in batches:
    check_batch_content(batcher, batch)  # none truncated
    if batch["index"][0] in long_indices:
      assert batch["source"].shape == (1, 64)  # rounded up to a multiple of max_length
  # Evaluation does not shuffle: within each bucket, examples come in their original order.
  for _, length in batcher.batch_shapes:
    order = [int(i) for b in batches if b["source"].shape[1] == length
             for i in b["index"] if i >= 0]
    assert order == sorted(order)


def test_resume_from_state_gives_the_same_following_batches():
  examples = random_examples(300, 40, seed=4)
  make = lambda: batching.TokenBatcher(examples, max_tokens=256, max_length=40, seed=9)
  reference = make().iterator()
  num_batches = make().num_batches(0)
  expected = [next(reference) for _ in range(3 * num_batches)]
  for stop in (0, 5, num_batches, num_batches + 7):  # also across an epoch boundary
    iterator = make().iterator()
    for _ in range(stop):
      next(iterator)
    state = json.loads(json.dumps(iterator.get_state()))  # JSON-serialisable
    assert set(state) == {"epoch", "batch", "seed", "num_examples"}
    restored = make().iterator()
    restored.set_state(state)
    for want in expected[stop:stop + num_batches + 3]:
      got = next(restored)
      assert all(np.array_equal(got[key], want[key]) for key in want)


def test_prefetch_state_counts_consumed_batches_not_prefetched_ones():
  examples = random_examples(300, 40, seed=5)
  make = lambda: batching.TokenBatcher(examples, max_tokens=256, max_length=40, seed=2)
  expected = [batch for _, batch in zip(range(60), make().iterator())]
  with PrefetchIterator(make().iterator(), buffer_size=4) as prefetch:
    consumed = [next(prefetch) for _ in range(17)]
    state = prefetch.get_state()
    next(prefetch)  # consuming more must not change a state saved before
  assert all(np.array_equal(a["source"], b["source"]) for a, b in zip(consumed, expected))
  plain = make().iterator()
  for _ in range(17):
    next(plain)
  assert state == plain.get_state()
  with PrefetchIterator(make().iterator(), buffer_size=4) as restored:
    restored.set_state(json.loads(json.dumps(state)))
    assert restored.get_state() == state
    for want in expected[17:40]:
      got = next(restored)
      assert np.array_equal(got["source"], want["source"])
      assert np.array_equal(got["target"], want["target"])


def test_prefetch_ends_with_the_data_and_reraises_errors():
  batcher = batching.TokenBatcher(random_examples(50, 20), max_tokens=128, max_length=20,
                                  train=False)
  with PrefetchIterator(batcher.iterator(num_epochs=1)) as prefetch:
    assert len(list(prefetch)) == batcher.num_batches()
    assert prefetch.get_state()["batch"] == batcher.num_batches()
    with pytest.raises(StopIteration):
      next(prefetch)

  class Failing(batching.BatchIterator):
    def __next__(self):
      raise OSError("disk gone")
  with PrefetchIterator(Failing(batcher)) as prefetch:
    with pytest.raises(OSError, match="disk gone"):
      next(prefetch)


def test_prefetch_builds_nothing_before_the_first_batch_is_asked_for():
  """(was: the thread started with the iterator, so a multi-process run built whole global batches, and planned
  the next epoch whole, before ``build_host_rows`` said which rows were this process's)."""
  batcher = batching.TokenBatcher(random_examples(200, 30, seed=3), max_tokens=256, max_length=30, seed=4)
  built = []

  class Counting(batching.BatchIterator):
    def __next__(self):
      built.append((self.process_index, self.process_count))
      return super().__next__()
  prefetch = PrefetchIterator(Counting(batcher), buffer_size=3)
  time.sleep(0.2)
  assert built == []
  assert prefetch.build_host_rows(1, 2)
  first = next(prefetch)
  assert built and set(built) == {(1, 2)}
  assert np.array_equal(first["source"], hosts.host_rows(batcher.make_batch(batcher.epoch_batches(0)[0]), 1, 2)[
      "source"])
  prefetch.close()
  with pytest.raises(StopIteration):
    next(prefetch)


def test_state_from_other_data_is_refused():
  iterator = batching.TokenBatcher(random_examples(50, 20), max_tokens=128, max_length=20,
                                   seed=1).iterator()
  with pytest.raises(ValueError, match="same data and seed"):
    iterator.set_state({"epoch": 0, "batch": 3, "seed": 2, "num_examples": 50})


def test_examples_from_pairs_and_select():
  examples = batching.TokenizedExamples.from_pairs([([5, 6, 2], [7, 2]), ([8, 2], [9, 9, 9, 2])])
  assert len(examples) == 2
  assert examples[1][1].tolist() == [9, 9, 9, 2]
  assert examples.source_lengths.tolist() == [3, 2]
  assert examples.select([1])[0][0].tolist() == [8, 2]
