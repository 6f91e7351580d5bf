"""Position-wise feed-forward network against numpy."""
import math

import jax
import numpy as np
import pytest

from transformer import ops


def _numpy_gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _numpy_gelu_exact(x):
  """``x * Phi(x)``, the standard normal CDF written with ``math.erf``."""
  return x * 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


NUMPY_ACTIVATIONS = {"relu": lambda x: np.maximum(x, 0.0), "gelu": _numpy_gelu_tanh,
                     "gelu_exact": _numpy_gelu_exact}


def _weights(rng, d_model=6, d_ff=10):
  return (rng.normal(size=(d_model, d_ff)).astype(np.float32), rng.normal(size=d_ff).astype(np.float32),
          rng.normal(size=(d_ff, d_model)).astype(np.float32), rng.normal(size=d_model).astype(np.float32))


def _numpy_feed_forward(x, kernel_in, bias_in, kernel_out, bias_out, activation):
  x = x.astype(np.float64)
  hidden = NUMPY_ACTIVATIONS[activation](x @ kernel_in + (0 if bias_in is None else bias_in))
  return hidden @ kernel_out + (0 if bias_out is None else bias_out)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_exact"])
def test_feed_forward_matches_numpy(activation):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 3, 6)).astype(np.float32)
  weights = _weights(rng)
  np.testing.assert_allclose(ops.feed_forward(x, *weights, activation=activation),
                             _numpy_feed_forward(x, *weights, activation), rtol=1e-5, atol=1e-4)


def test_feed_forward_without_biases_and_each_position_alike():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 4, 6)).astype(np.float32)
  kernel_in, _, kernel_out, _ = _weights(rng)
  y = ops.feed_forward(x, kernel_in, None, kernel_out, None)
  np.testing.assert_allclose(y, _numpy_feed_forward(x, kernel_in, None, kernel_out, None, "relu"),
                             rtol=1e-5, atol=1e-4)
  # Position-wise: position 2 alone gives the same as inside the sequence.
  np.testing.assert_allclose(ops.feed_forward(x[:, 2:3], kernel_in, None, kernel_out, None), y[:, 2:3],
                             rtol=1e-6, atol=1e-6)


def test_feed_forward_dropout_acts_on_hidden_units():
  rng = np.random.default_rng(2)
  x = rng.normal(size=(1, 2, 6)).astype(np.float32)
  kernel_in, bias_in, kernel_out, bias_out = _weights(rng)
  key = jax.random.key(0)
  y = ops.feed_forward(x, kernel_in, bias_in, kernel_out, bias_out, dropout_rate=0.5, dropout_rng=key)
  hidden = np.maximum(x.astype(np.float64) @ kernel_in + bias_in, 0)
  hidden = np.asarray(ops.dropout(hidden.astype(np.float32), 0.5, key), np.float64)
  np.testing.assert_allclose(y, hidden @ kernel_out + bias_out, rtol=1e-5, atol=1e-4)
  assert not np.allclose(y, ops.feed_forward(x, kernel_in, bias_in, kernel_out, bias_out))


def test_unknown_activation_names_the_choices():
  rng = np.random.default_rng(3)
  with pytest.raises(ValueError, match=r"'swish'.*\['gelu', 'gelu_exact', 'relu'\]"):
    ops.feed_forward(np.ones((1, 1, 6), np.float32), *_weights(rng), activation="swish")


def test_exact_and_tanh_gelu_differ_measurably():
  """BERT checkpoints need the erf form: the tanh approximation is off by up to 5e-4."""
  x = np.linspace(-4, 4, 801).astype(np.float32)
  exact = np.asarray(ops.ACTIVATIONS["gelu_exact"](x), np.float64)
  np.testing.assert_allclose(exact, _numpy_gelu_exact(x.astype(np.float64)), atol=1e-6)
  assert np.abs(exact - np.asarray(ops.ACTIVATIONS["gelu"](x))).max() > 1e-4
