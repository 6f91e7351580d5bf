"""Matmuls: the affine map of every projection (``dense``, ``x W + b`` over the last axis) and the batched
products of attention (``batched_matmul``)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from transformer.ops.barriers import materialized_transpose


def dense(x, kernel, bias=None, precision=None, preferred_element_type=None):
  """``x W + b`` on the last axis, as one 2-D matmul over the flattened leading axes.

  Flattening matters for speed, not for the result: XLA:CPU ran the forward and backward of a projection
  written as the 3-D ``einsum("bld,df->blf")`` about 1.2x slower than the same product on ``[batch * length,
  d]`` (its weight gradient became a matmul of two transposed operands); the train step's figures before and
  after are in README.md (benchmarks row) and benchmarks/RESULTS.md (section train_step).

  Args:
    x: ``[..., features_in]``.
    kernel: ``W``, ``[features_in, features_out]``.
    bias: ``[features_out]`` or None.
    precision, preferred_element_type: passed to ``jnp.matmul``.

  Returns:
    ``[..., features_out]``.
  """
  if x.shape[-1] != kernel.shape[0]:
    raise ValueError(f"dense: x has {x.shape[-1]} features but the kernel {kernel.shape} expects {kernel.shape[0]}")
  flat = x.reshape(-1, x.shape[-1])
  output = jnp.matmul(flat, kernel, precision=precision, preferred_element_type=preferred_element_type)
  if bias is not None:
    output = output + bias
  return output.reshape(*x.shape[:-1], kernel.shape[1])


def batched_matmul(a, b, precision=None, preferred_element_type=None):
  """``a @ b`` over the last two axes, with a backward pass of plain matmuls.

  Attention's two products go through it: logits ``q k^T`` and the weighted sum ``weights v``. Autodiff's
  gradient of ``b``, ``a^T g``, contracts the second-to-last axis of ``a``; XLA:CPU ran those dots on its
  Eigen path instead of YNNPACK. Here the smaller of ``a`` and ``g`` is transposed first
  (``materialized_transpose``, a copy of the small ``[length, head_dim]`` side). Attention forward+backward
  (8 heads of 64, 4096 tokens per batch, CPU, A/B in one process against the autodiff version): float32
  0.85x the time at 1,024 tokens and 0.97x at 4,096; bfloat16 0.99x and 0.44x.

  Low precision: when ``a`` and ``b`` share a 16-bit dtype, the cotangent is rounded to it before the
  backward's matmuls, which accumulate in float32 (FlashAttention-2 rounds its ``dS`` the same way): a
  float32 ``preferred_element_type`` (e.g. float32 attention logits) then costs no float32 matmul over the
  ``[.., q_length, kv_length]`` cotangent. A single row (``m = 1``) is a plain ``jnp.matmul`` (see below).

  Args:
    a: ``[..., m, n]``.
    b: ``[..., n, p]`` (the same leading axes).
    precision, preferred_element_type: passed to ``jnp.matmul``.

  Returns:
    ``[..., m, p]``.
  """
  if a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
    raise ValueError(f"batched_matmul: shapes {a.shape} and {b.shape} are not [..., m, n] and [..., n, p] with "
                     "the same leading axes")
  if a.shape[-2] == 1:
    # One row (an RNN decoder's attention step, inside a scan): a^T g is an outer product with nothing to
    # transpose, and autodiff keeps a loop-invariant b out of the scan's per-step residuals, which a custom
    # VJP would stack once per step (with both of attention's products under it, a 30-step scan of Luong
    # attention ran 2.8x slower forward+backward on CPU).
    return jnp.einsum("...mn,...np->...mp", a, b, precision=precision,
                      preferred_element_type=preferred_element_type)
  return _batched_matmul(a, b, precision, preferred_element_type)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _batched_matmul(a, b, precision, preferred_element_type):
  return jnp.matmul(a, b, precision=precision, preferred_element_type=preferred_element_type)


def _batched_matmul_forward(a, b, precision, preferred_element_type):
  return _batched_matmul(a, b, precision, preferred_element_type), (a, b)


def _batched_matmul_backward(precision, preferred_element_type, residuals, cotangent):
  del preferred_element_type
  a, b = residuals
  operands_dtype = jnp.promote_types(a.dtype, b.dtype)
  if jnp.finfo(operands_dtype).bits < 32:
    cotangent = cotangent.astype(operands_dtype)
  accumulate = jnp.promote_types(operands_dtype, jnp.float32)
  matmul = functools.partial(jnp.matmul, precision=precision, preferred_element_type=accumulate)
  a_cotangent = matmul(cotangent, jnp.swapaxes(b, -1, -2))  # contracts the last axis of both: a plain dot
  if a.size <= cotangent.size:
    b_cotangent = matmul(materialized_transpose(a), cotangent)
  else:  # (g^T a)^T: transposes g and the [n, p] result instead of the large a
    b_cotangent = jnp.swapaxes(matmul(materialized_transpose(cotangent), a), -1, -2)
  return a_cotangent.astype(a.dtype), b_cotangent.astype(b.dtype)


_batched_matmul.defvjp(_batched_matmul_forward, _batched_matmul_backward)
