"""Time-series ops against numpy loops written from the papers' code descriptions: the moving average of
DLinear (ends repeated, then a stride-1 average pool), PatchTST's patches (the end padded with ``stride``
copies of the last value, then unfolded), and RevIN's normalisation round trip."""
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops

SERIES = np.random.default_rng(0).normal(size=(2, 11, 3)).astype(np.float32)  # [batch, length, channels]


@pytest.mark.parametrize("window_size", [1, 3, 5, 25])
def test_moving_average_equals_a_loop_over_the_end_padded_series(window_size):
  half = (window_size - 1) // 2
  padded = np.concatenate([np.repeat(SERIES[:, :1], half, 1), SERIES, np.repeat(SERIES[:, -1:], half, 1)], 1)
  expected = np.stack([padded[:, t:t + window_size].mean(axis=1) for t in range(SERIES.shape[1])], axis=1)
  np.testing.assert_allclose(ops.moving_average(jnp.asarray(SERIES), window_size), expected, atol=1e-6)


def test_series_decomposition_adds_back_to_the_series_and_keeps_a_constant_as_trend():
  seasonal, trend = ops.series_decomposition(jnp.asarray(SERIES), 5)
  np.testing.assert_allclose(seasonal + trend, SERIES, atol=1e-6)
  constant = jnp.full((1, 7, 1), 2.5)
  seasonal, trend = ops.series_decomposition(constant, 5)
  np.testing.assert_allclose(trend, constant, atol=1e-6)
  np.testing.assert_allclose(seasonal, 0.0, atol=1e-6)


@pytest.mark.parametrize("length, patch_length, stride", [(11, 4, 2), (168, 16, 8), (72, 16, 8), (10, 3, 4)])
def test_patches_equal_unfolding_the_end_padded_series(length, patch_length, stride):
  series = np.random.default_rng(1).normal(size=(2, length)).astype(np.float32)
  padded = np.concatenate([series, np.repeat(series[:, -1:], stride, 1)], axis=1)
  expected = np.stack([padded[:, start:start + patch_length]
                       for start in range(0, padded.shape[1] - patch_length + 1, stride)], axis=1)
  got = ops.patches(jnp.asarray(series), patch_length, stride)
  assert got.shape == (2, (length - patch_length) // stride + 2, patch_length) == expected.shape
  np.testing.assert_array_equal(got, expected)


def test_instance_normalize_standardises_each_series_and_inverts():
  normalized, mean, std = ops.instance_normalize(jnp.asarray(SERIES))
  assert mean.shape == std.shape == (2, 1, 3)
  np.testing.assert_allclose(normalized.mean(axis=1), 0.0, atol=1e-5)
  np.testing.assert_allclose(normalized.std(axis=1), 1.0, atol=1e-4)  # epsilon 1e-5 against variances ~1
  np.testing.assert_allclose(normalized * std + mean, SERIES, atol=1e-5)
  normalized, _, _ = ops.instance_normalize(jnp.ones((1, 4, 1)))  # constant: zeros, not NaN
  np.testing.assert_array_equal(normalized, 0.0)


@pytest.mark.parametrize("call, message", [
    (lambda: ops.moving_average(jnp.asarray(SERIES), 4), "window_size must be a positive odd number"),
    (lambda: ops.patches(jnp.zeros((1, 5)), 6, 2), "need 1 <= patch_length <= length"),
    (lambda: ops.patches(jnp.zeros((1, 5)), 2, 0), "stride >= 1"),
])
def test_bad_sizes_are_named(call, message):
  with pytest.raises(ValueError, match=message):
    call()
