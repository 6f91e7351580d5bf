"""Time-series ops of the forecasting literature: instance normalisation, moving-average decomposition, patches.

    normalized, mean, std = instance_normalize(window)            # RevIN, PatchTST's input and output scaling
    seasonal, trend = series_decomposition(window, window_size=25)  # DLinear's two parts
    tokens = patches(series, patch_length=16, stride=8)           # PatchTST's tokens
"""
from __future__ import annotations

import jax.numpy as jnp


def instance_normalize(x, epsilon: float = 1e-5):
  """Each series standardised over its own window (RevIN without its affine part, as PatchTST uses it).

  Args:
    x: float ``[batch, length, channels]``.
    epsilon: added to the variance, so that a constant series divides by ``sqrt(epsilon)``, not 0.

  Returns:
    ``(normalized, mean, std)``: ``[batch, length, channels]`` and two ``[batch, 1, channels]``, so that
    ``normalized * std + mean`` gives ``x`` back (and a forecast in the normalised units its scale).
  """
  mean = jnp.mean(x, axis=1, keepdims=True)
  std = jnp.sqrt(jnp.var(x, axis=1, keepdims=True) + epsilon)
  return (x - mean) / std, mean, std


def moving_average(x, window_size: int):
  """Centred moving average along time, the series' ends repeated to keep its length (DLinear's ``moving_avg``).

  Args:
    x: float ``[batch, length, channels]``.
    window_size: odd number of hours averaged, centred on each hour; ``(window_size - 1) // 2`` copies of the
      first and last values pad the two ends.

  Returns:
    ``[batch, length, channels]``.
  """
  if window_size < 1 or window_size % 2 == 0:
    raise ValueError(f"moving_average: window_size must be a positive odd number of steps, got {window_size}.")
  half = (window_size - 1) // 2
  padded = jnp.concatenate([jnp.repeat(x[:, :1], half, axis=1), x, jnp.repeat(x[:, -1:], half, axis=1)], axis=1)
  # Window sums as differences of a running sum: one pass, whatever the window.
  running = jnp.cumsum(padded, axis=1)
  running = jnp.concatenate([jnp.zeros_like(running[:, :1]), running], axis=1)
  return (running[:, window_size:] - running[:, :-window_size]) / window_size


def series_decomposition(x, window_size: int):
  """``x`` ``[batch, length, channels]`` -> ``(seasonal, trend)``, both the same shape: ``trend`` its moving
  average, ``seasonal = x - trend`` (Autoformer's decomposition, which DLinear fits a linear layer to each of)."""
  trend = moving_average(x, window_size)
  return x - trend, trend


def patches(series, patch_length: int, stride: int):
  """Cut series into overlapping patches, the end padded with ``stride`` copies of the last value (PatchTST's
  ``padding_patch="end"``), so that the last patch ends on the last step.

  Args:
    series: float ``[batch, length]``.
    patch_length: steps per patch, at most ``length``.
    stride: steps between the starts of two patches.

  Returns:
    ``[batch, num_patches, patch_length]`` with ``num_patches = (length - patch_length) // stride + 2``.
  """
  length = series.shape[1]
  if not 1 <= patch_length <= length or stride < 1:
    raise ValueError(f"patches: need 1 <= patch_length <= length and stride >= 1; got patch_length "
                     f"{patch_length}, length {length}, stride {stride}.")
  padded = jnp.concatenate([series, jnp.repeat(series[:, -1:], stride, axis=1)], axis=1)
  num_patches = (length - patch_length) // stride + 2
  starts = jnp.arange(num_patches) * stride  # [num_patches]
  return padded[:, starts[:, None] + jnp.arange(patch_length)]
