"""Normalisation layers as pure functions; statistics are computed in float32."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer.ops.kernels import REFERENCE, Kernels


def layer_norm(x, scale=None, bias=None, epsilon: float = 1e-6, kernels: Kernels | None = None):
  """LayerNorm (Ba et al. 2016) over the last axis.

  Args:
    x: ``[..., features]``.
    scale: ``[features]`` gain (None for 1).
    bias: ``[features]`` offset (None for 0).
    epsilon: added to the variance.
    kernels: backend-tuned pieces (``kernels.py``: on CPU a gradient barrier on ``x``); None for the formula.

  Returns:
    ``[..., features]`` in ``x``'s dtype.
  """
  x32 = _norm_input(x, kernels).astype(jnp.float32)
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  variance = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
  y = (x32 - mean) * jax.lax.rsqrt(variance + epsilon)
  return _affine(y, scale, bias).astype(x.dtype)


def rms_norm(x, scale=None, epsilon: float = 1e-6, kernels: Kernels | None = None):
  """RMSNorm (Zhang & Sennrich 2019): ``x / sqrt(mean(x^2) + eps) * scale`` over the last axis.

  Shapes and ``kernels`` as ``layer_norm``.
  """
  x32 = _norm_input(x, kernels).astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + epsilon)
  return _affine(y, scale, None).astype(x.dtype)


def batch_norm(x, scale=None, bias=None, valid=None, epsilon: float = 1e-6, kernels: Kernels | None = None):
  """BatchNorm (Ioffe & Szegedy 2015) with the statistics of this batch: per feature, over every position of
  every row where ``valid`` is True.

  There are no running averages: evaluation and decoding also normalise by the statistics of the batch they
  see (with a key/value cache, the tokens of the current step). Over a sequence the statistics mix positions,
  so in a causal decoder a position's output depends (weakly, through one mean and variance) on later ones.

  Args:
    x: ``[..., features]``.
    scale, bias, epsilon, kernels: as ``layer_norm``.
    valid: ``x.shape[:-1]`` bool, False at padding (left out of the statistics); None for all positions.

  Returns:
    ``[..., features]`` in ``x``'s dtype.
  """
  x32 = _norm_input(x, kernels).astype(jnp.float32)
  weight = jnp.ones(x.shape[:-1], jnp.float32) if valid is None else valid.astype(jnp.float32)
  weight = weight[..., None]
  axes = tuple(range(x.ndim - 1))
  count = jnp.maximum(jnp.sum(weight, axis=axes), 1.0)  # [1]; an all-padding batch keeps its values finite
  mean = jnp.sum(x32 * weight, axis=axes) / count
  variance = jnp.sum(jnp.square(x32 - mean) * weight, axis=axes) / count
  y = (x32 - mean) * jax.lax.rsqrt(variance + epsilon)
  return _affine(y, scale, bias).astype(x.dtype)


def _affine(y, scale, bias):
  """The learned gain and offset of a normalised float32 ``y`` (None: 1 and 0)."""
  if scale is not None:
    y = y * scale.astype(jnp.float32)
  if bias is not None:
    y = y + bias.astype(jnp.float32)
  return y


def _norm_input(x, kernels):
  """``x``, through the kernels' ``norm_input`` (an identity in value and gradient) if they have one."""
  kernels = kernels or REFERENCE
  return x if kernels.norm_input is None else kernels.norm_input(x)
