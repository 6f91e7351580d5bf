"""``ops.dense`` (every projection) against numpy (``batched_matmul``: tests/ops/test_kernels.py), and the
position-wise feed-forward network against numpy."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops


@pytest.mark.parametrize("leading", [(), (5,), (2, 3), (2, 1, 3)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_dense_matches_numpy_for_any_leading_axes(leading, with_bias):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(*leading, 4)).astype(np.float32)
  kernel = rng.normal(size=(4, 7)).astype(np.float32)
  bias = rng.normal(size=7).astype(np.float32) if with_bias else None
  expected = x.astype(np.float64) @ kernel + (0 if bias is None else bias)
  output = ops.dense(x, kernel, bias)
  assert output.shape == (*leading, 7)
  np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-5)


def test_dense_gradients_match_the_einsum_it_replaces():
  rng = np.random.default_rng(1)
  x, kernel, bias = (rng.normal(size=shape).astype(np.float32) for shape in [(2, 3, 4), (4, 5), (5,)])
  cotangent = rng.normal(size=(2, 3, 5)).astype(np.float32)

  def loss(function):
    return lambda x, kernel, bias: jnp.sum(function(x, kernel, bias) * cotangent)

  ours = jax.grad(loss(ops.dense), argnums=(0, 1, 2))(x, kernel, bias)
  reference = jax.grad(loss(lambda x, k, b: jnp.einsum("bld,df->blf", x, k) + b), argnums=(0, 1, 2))(x, kernel, bias)
  for got, want in zip(ours, reference):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # the kernel's gradient by hand: sum over positions of x^T cotangent
  np.testing.assert_allclose(ours[1], np.einsum("bld,blf->df", x, cotangent), rtol=1e-5, atol=1e-5)


def test_dense_float32_accumulation_of_bfloat16_operands():
  x, kernel = jnp.ones((3, 257), jnp.bfloat16), jnp.ones((257, 2), jnp.bfloat16)
  assert float(ops.dense(x, kernel)[0, 0]) != 257  # not a bfloat16 number
  output = ops.dense(x, kernel, preferred_element_type=jnp.float32)
  assert output.dtype == jnp.float32
  np.testing.assert_array_equal(output, 257.0)


def test_dense_names_a_feature_mismatch():
  with pytest.raises(ValueError, match="x has 4 features but the kernel"):
    ops.dense(jnp.ones((2, 4)), jnp.ones((3, 5)))


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
