"""Losses and metrics: label-smoothed cross entropy against numpy, the weighted-sum helper, and token accuracy and
sequence exact match on hand-made examples, with padding weights."""
import jax
import numpy as np
import pytest

from transformer import ops


def _numpy_smoothed_targets(targets, vocab, label_smoothing):
  """``1 - ls`` on the true class, ``ls / (vocab - 1)`` on each other class."""
  distribution = np.full(targets.shape + (vocab,), label_smoothing / (vocab - 1))
  np.put_along_axis(distribution, targets[..., None], 1.0 - label_smoothing, axis=-1)
  return distribution


def _numpy_log_softmax(logits):
  logits = logits.astype(np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _numpy_loss(logits, targets, label_smoothing):
  """Cross entropy minus the target entropy: KL(smoothed targets || softmax(logits))."""
  q = _numpy_smoothed_targets(targets, logits.shape[-1], label_smoothing)
  cross_entropy = -(q * _numpy_log_softmax(logits)).sum(-1)
  entropy = -(q * np.log(np.where(q > 0, q, 1.0))).sum(-1)
  return cross_entropy - entropy


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
def test_cross_entropy_matches_numpy_label_smoothing(label_smoothing):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 7)).astype(np.float32) * 3
  targets = rng.integers(0, 7, (2, 3))
  loss = ops.softmax_cross_entropy(logits, targets, label_smoothing)
  assert loss.shape == (2, 3) and loss.dtype == np.float32
  np.testing.assert_allclose(loss, _numpy_loss(logits, targets, label_smoothing), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_gradient_is_softmax_minus_smoothed_targets(label_smoothing):
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(4, 9)).astype(np.float32) * 2
  targets = rng.integers(0, 9, (4,))
  gradient = jax.grad(lambda x: ops.softmax_cross_entropy(x, targets, label_smoothing).sum())(logits)
  expected = np.exp(_numpy_log_softmax(logits)) - _numpy_smoothed_targets(targets, 9, label_smoothing)
  np.testing.assert_allclose(gradient, expected, atol=1e-6)


def test_unsmoothed_cross_entropy_is_negative_log_probability():
  logits = np.array([[2.0, 0.0, -1.0]], np.float32)
  expected = -np.log(np.exp(2.0) / (np.exp(2.0) + 1 + np.exp(-1.0)))
  np.testing.assert_allclose(ops.softmax_cross_entropy(logits, np.array([0])), [expected], rtol=1e-6)


def test_smoothed_loss_is_zero_and_minimal_at_the_smoothed_distribution():
  vocab, label_smoothing = 6, 0.2
  targets = np.array([1, 4])
  optimum = np.log(_numpy_smoothed_targets(targets, vocab, label_smoothing)).astype(np.float32)
  loss_fn = lambda logits: ops.softmax_cross_entropy(logits, targets, label_smoothing).sum()
  np.testing.assert_allclose(loss_fn(optimum), 0.0, atol=1e-5)
  np.testing.assert_allclose(jax.grad(loss_fn)(optimum), 0.0, atol=1e-6)
  # Any other prediction, including the one-hot one, costs more.
  rng = np.random.default_rng(1)
  for _ in range(5):
    assert loss_fn(optimum + rng.normal(size=optimum.shape).astype(np.float32)) > 1e-3
  assert loss_fn(np.eye(vocab, dtype=np.float32)[targets] * 20) > 0.1


def test_cross_entropy_computes_in_float32_for_bfloat16_logits():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(4, 5)).astype(np.float32)
  targets = rng.integers(0, 5, (4,))
  rounded = jax.numpy.asarray(logits, jax.numpy.bfloat16)
  loss = ops.softmax_cross_entropy(rounded, targets, 0.1)
  assert loss.dtype == np.float32
  # The rounded logits' loss to float32 precision: a bfloat16 softmax would be ~1e-2 off.
  np.testing.assert_allclose(loss, _numpy_loss(np.asarray(rounded, np.float32), targets, 0.1), atol=1e-5)


def test_weighted_sum_returns_numerator_and_denominator():
  values = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
  weights = np.array([[1, 1, 0], [1, 0, 0]])
  total, count = ops.weighted_sum(values, weights)
  assert (float(total), float(count)) == (7.0, 3.0)
  total, count = ops.weighted_sum(values)
  assert (float(total), float(count)) == (21.0, 6.0)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_a_target_outside_the_vocabulary_gives_nan_only_at_its_position(label_smoothing):
  """Documented: out-of-vocabulary ids (also negative ones, which indexing would wrap to the last class)
  make that position's loss NaN instead of silently training on another class."""
  logits = np.random.default_rng(7).normal(size=(2, 3, 5)).astype(np.float32)
  targets = np.array([[1, 5, 2], [-1, 0, 4]])
  losses = np.asarray(ops.softmax_cross_entropy(logits, targets, label_smoothing))
  outside = np.array([[False, True, False], [True, False, False]])
  assert np.isnan(losses[outside]).all()
  in_vocabulary = np.where(outside, 0, targets)
  np.testing.assert_allclose(losses[~outside], _numpy_loss(logits, in_vocabulary, label_smoothing)[~outside],
                             rtol=1e-5, atol=1e-5)
  jitted = np.asarray(jax.jit(ops.softmax_cross_entropy, static_argnums=2)(logits, targets, label_smoothing))
  np.testing.assert_array_equal(np.isnan(jitted), outside)


@pytest.mark.parametrize("label_smoothing", [1.0, -0.1, 1.5])
def test_label_smoothing_outside_zero_one_is_named(label_smoothing):
  """1 would make the loss NaN (0 * log 0) and -0.1 a plausible finite wrong one; both are refused."""
  logits, targets = np.zeros((2, 4), np.float32), np.array([0, 3])
  with pytest.raises(ValueError, match=rf"label_smoothing={label_smoothing} is outside \[0, 1\)"):
    ops.softmax_cross_entropy(logits, targets, label_smoothing)


def test_smoothing_a_vocabulary_of_one_is_named_and_unsmoothed_is_zero():
  logits, targets = np.array([[3.0], [-1.0]], np.float32), np.array([0, 0])
  with pytest.raises(ValueError, match="needs a vocabulary of at least 2 classes.*the logits have 1"):
    ops.softmax_cross_entropy(logits, targets, 0.1)
  with pytest.raises(ValueError, match="a traced value needs a vocabulary of at least 2"):
    jax.jit(lambda ls: ops.softmax_cross_entropy(logits, targets, ls))(0.0)
  np.testing.assert_array_equal(ops.softmax_cross_entropy(logits, targets, 0.0), [0.0, 0.0])  # log 1


def test_a_traced_label_smoothing_outside_zero_one_gives_nan():
  """A traced value (one per replica of a vmapped sweep) cannot be checked while tracing: out of range, the loss
  is NaN (which the training loop reports), inside it is the eager loss."""
  rng = np.random.default_rng(0)
  logits, targets = rng.normal(size=(3, 5)).astype(np.float32), np.array([0, 2, 4])
  swept = jax.jit(jax.vmap(lambda ls: ops.softmax_cross_entropy(logits, targets, ls)))(
      np.array([0.1, 1.0, -0.1], np.float32))
  np.testing.assert_allclose(swept[0], ops.softmax_cross_entropy(logits, targets, 0.1), rtol=1e-6)
  assert np.all(np.isnan(swept[1:]))


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
