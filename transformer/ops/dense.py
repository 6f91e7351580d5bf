"""The affine map of every projection: ``x W + b`` over the last axis."""
from __future__ import annotations

import jax.numpy as jnp


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
