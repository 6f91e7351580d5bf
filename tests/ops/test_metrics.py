"""Metrics on hand-made examples: token accuracy and sequence exact match, with padding weights."""
import numpy as np

from transformer import ops


def _one_hot_logits(predictions, vocab=4):
  return np.eye(vocab, dtype=np.float32)[np.asarray(predictions)]


def test_token_accuracy_counts_argmax_hits_at_weighted_positions():
  predictions = np.array([[1, 2, 3], [0, 0, 1]])
  targets = np.array([[1, 2, 0], [0, 3, 1]])
  logits = _one_hot_logits(predictions)
  correct, total = ops.token_accuracy(logits, targets)
  assert (float(correct), float(total)) == (4.0, 6.0)
  # The wrong predictions at [0, 2] and [1, 1] sit on padding: they no longer count.
  weights = np.array([[1, 1, 0], [1, 0, 1]])
  correct, total = ops.token_accuracy(logits, targets, weights)
  assert (float(correct), float(total)) == (4.0, 4.0)


def test_token_accuracy_matches_numpy_argmax_and_counts_ties_as_right():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 11)).astype(np.float32)
  targets = rng.integers(0, 11, (3, 5))
  targets[0, :2] = logits[0, :2].argmax(-1)  # a few sure hits among the random misses
  correct, total = ops.token_accuracy(logits, targets)
  assert (float(correct), float(total)) == (float((logits.argmax(-1) == targets).sum()), 15.0)
  tied = np.array([[[0.0, 2.0, 2.0]]], np.float32)
  assert float(ops.token_accuracy(tied, np.array([[2]]))[0]) == 1.0


def test_sequence_exact_match_ignores_padding_and_empty_sequences():
  predictions = np.array([[1, 2, 3], [1, 2, 3], [4, 4, 4], [7, 7, 7]])
  targets = np.array([[1, 2, 3], [1, 2, 0], [4, 5, 9], [0, 0, 0]])
  weights = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [0, 0, 0]])
  matches, sequences = ops.sequence_exact_match(predictions, targets, weights)
  # Row 0 exact, row 1 exact on its real positions, row 2 wrong, row 3 has no real position.
  assert (float(matches), float(sequences)) == (2.0, 3.0)
  matches, sequences = ops.sequence_exact_match(predictions, targets)
  assert (float(matches), float(sequences)) == (1.0, 4.0)
