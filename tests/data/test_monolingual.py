"""Sentences as language-model data: long ones cut into pieces keep every token, in order, each piece at most
``max_length`` long and the last one ending where its sentence ended."""
from __future__ import annotations

import numpy as np

from transformer.data import batching
from transformer.data.monolingual import chunk_long_sequences, sentences_as_targets


def test_chunking_keeps_every_token_in_order_in_pieces_of_at_most_max_length():
  rng = np.random.default_rng(0)
  sentences = [rng.integers(4, 50, length).astype(np.int32) for length in (3, 10, 11, 25, 1, 30, 10)]
  examples = sentences_as_targets(sentences)
  chunked, count = chunk_long_sequences(examples, max_length=10)
  assert count == 3  # the sentences of 11, 25 and 30 tokens
  pieces = [chunked.target(i) for i in range(len(chunked))]
  assert [len(piece) for piece in pieces] == [3, 10, 10, 1, 10, 10, 5, 1, 10, 10, 10, 10]
  np.testing.assert_array_equal(np.concatenate(pieces), np.concatenate(sentences))  # every token, in order
  assert all(len(chunked.source(i)) == 0 for i in range(len(chunked)))
  # Each sentence's pieces are consecutive examples: joined, they are the sentence.
  ends = np.cumsum([len(piece) for piece in pieces])
  assert set(np.cumsum([len(s) for s in sentences])) <= set(ends)


def test_without_long_sentences_the_examples_are_the_same_object():
  examples = sentences_as_targets([np.arange(4, 9, dtype=np.int32), np.arange(4, 6, dtype=np.int32)])
  assert chunk_long_sequences(examples, max_length=5) == (examples, 0)


def test_chunked_sentences_are_all_trained_on_where_dropping_loses_the_long_ones():
  rng = np.random.default_rng(1)
  sentences = [rng.integers(4, 50, length).astype(np.int32) for length in rng.integers(1, 40, 200)]
  examples = sentences_as_targets(sentences)
  chunked, _ = chunk_long_sequences(examples, max_length=16)
  kept = sum(len(sentence) for sentence in sentences if len(sentence) <= 16)
  for data, expected in ((chunked, sum(map(len, sentences))), (examples, kept)):
    batcher = batching.TokenBatcher(data, max_tokens=64, max_length=16, seed=0)
    batches = [batcher.make_batch(indices) for indices in batcher.epoch_batches(0)]
    assert sum(int(np.count_nonzero(batch["target"])) for batch in batches) == expected
