"""The affine map of every projection: ``dense``, ``x W + b`` over the last axis."""
from __future__ import annotations

import jax.numpy as jnp


def dense(x, kernel, bias=None, precision=None, preferred_element_type=None):
  """``x W + b`` on the last axis, as one 2-D matmul over the flattened leading axes.

  Flattening changes no value; XLA:CPU runs the weight gradient of a 3-D ``einsum("bld,df->blf")`` as a
  slower matmul of two transposed operands (benchmarks/FINDINGS.md#why-these-kernels).

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
