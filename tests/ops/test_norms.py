"""LayerNorm and RMSNorm against numpy (float64 reference)."""
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops


def _numpy_layer_norm(x, scale, bias, epsilon):
  x = x.astype(np.float64)
  mean = x.mean(-1, keepdims=True)
  variance = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(variance + epsilon) * scale + bias


def _numpy_rms_norm(x, scale, epsilon):
  x = x.astype(np.float64)
  return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + epsilon) * scale


@pytest.mark.parametrize("epsilon", [1e-6, 1e-1])
def test_layer_norm_matches_numpy(epsilon):
  rng = np.random.default_rng(0)
  x = (rng.normal(size=(2, 3, 8)) * 4 + 1.5).astype(np.float32)
  scale, bias = rng.normal(size=8).astype(np.float32), rng.normal(size=8).astype(np.float32)
  np.testing.assert_allclose(ops.layer_norm(x, scale, bias, epsilon), _numpy_layer_norm(x, scale, bias, epsilon),
                             rtol=1e-5, atol=1e-5)
  # No gain and no offset: zero mean and (almost) unit variance per position.
  y = np.asarray(ops.layer_norm(x, epsilon=epsilon), np.float64)
  np.testing.assert_allclose(y, _numpy_layer_norm(x, 1.0, 0.0, epsilon), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-6)


@pytest.mark.parametrize("epsilon", [1e-6, 1e-1])
def test_rms_norm_matches_numpy(epsilon):
  rng = np.random.default_rng(1)
  x = (rng.normal(size=(2, 3, 8)) * 4 + 1.5).astype(np.float32)
  scale = rng.normal(size=8).astype(np.float32)
  np.testing.assert_allclose(ops.rms_norm(x, scale, epsilon), _numpy_rms_norm(x, scale, epsilon),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ops.rms_norm(x, epsilon=epsilon), _numpy_rms_norm(x, 1.0, epsilon),
                             rtol=1e-5, atol=1e-5)


def test_norms_keep_the_input_dtype_and_compute_in_float32():
  rng = np.random.default_rng(2)
  x = (rng.normal(size=(4, 16)) * 100 + 300).astype(np.float32)
  x_bf16 = jnp.asarray(x, jnp.bfloat16)
  for y, reference in ((ops.layer_norm(x_bf16), _numpy_layer_norm(np.asarray(x_bf16, np.float32), 1.0, 0.0, 1e-6)),
                       (ops.rms_norm(x_bf16), _numpy_rms_norm(np.asarray(x_bf16, np.float32), 1.0, 1e-6))):
    assert y.dtype == jnp.bfloat16
    # Only the final rounding to bfloat16 (relative 2^-8) separates it from the exact value.
    np.testing.assert_allclose(np.asarray(y, np.float32), reference, rtol=1e-2, atol=1e-2)


def _numpy_batch_norm(x, valid, scale, bias, epsilon):
  rows = x.reshape(-1, x.shape[-1]).astype(np.float64)[valid.reshape(-1)]
  mean, variance = rows.mean(0), rows.var(0)
  return (x - mean) / np.sqrt(variance + epsilon) * scale + bias


def test_batch_norm_uses_the_statistics_of_the_valid_positions():
  rng = np.random.default_rng(3)
  x = (rng.normal(size=(3, 5, 8)) * 4 + 1.5).astype(np.float32)
  valid = np.arange(5)[None, :] < np.array([5, 2, 3])[:, None]
  scale, bias = rng.normal(size=8).astype(np.float32), rng.normal(size=8).astype(np.float32)
  y = ops.batch_norm(x, scale, bias, valid, epsilon=1e-6)
  np.testing.assert_allclose(y, _numpy_batch_norm(x, valid, scale, bias, 1e-6), rtol=1e-5, atol=1e-5)
  # Padding does not move the statistics: what sits there changes nothing at the valid positions.
  garbage = np.where(valid[..., None], x, 1e3).astype(np.float32)
  np.testing.assert_allclose(np.asarray(ops.batch_norm(garbage, scale, bias, valid))[valid],
                             np.asarray(y)[valid], rtol=1e-5, atol=1e-5)
  # Without a mask every position counts; each feature is then standardised over the batch.
  plain = np.asarray(ops.batch_norm(x), np.float64).reshape(-1, 8)
  np.testing.assert_allclose(plain.mean(0), 0.0, atol=1e-5)
  np.testing.assert_allclose(plain.std(0), 1.0, atol=1e-4)
