"""Compiler hints that change no value, only how XLA schedules and fuses the computation."""
from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.custom_vjp
def gradient_barrier(x):
  """Identity whose gradient is computed once, as a whole array, before anything uses it.

  The norms (``layer_norm``, ``rms_norm``) apply it to their input. Their backward pass is a chain of
  element-wise ops, and in a Transformer the gradient of each norm's input feeds the next norm's backward
  pass down the residual stream. XLA (seen on CPU, JAX 0.10) fuses that chain into each of its consumers,
  the transposes feeding the weight-gradient matmuls included, and so recomputes it from the top of the
  stack for every layer: quadratic in depth. ``lax.optimization_barrier`` on the cotangent stops that
  fusion. The 4+4-layer pre-LN translation model's train step ran 1.5x faster with it on CPU, level with
  the same model built from flax's stock layers (``benchmarks/train_step.py``).

  Args:
    x: any array, e.g. ``[batch, length, d_model]``.

  Returns:
    ``x`` unchanged; its gradient is also unchanged.
  """
  return x


def _gradient_barrier_forward(x):
  return x, None


def _gradient_barrier_backward(_, cotangent):
  return (jax.lax.optimization_barrier(cotangent),)


gradient_barrier.defvjp(_gradient_barrier_forward, _gradient_barrier_backward)


def materialized_transpose(x):
  """``x`` with its last two axes swapped, written out as a new array rather than folded into its consumer.

  XLA folds a transpose into the dot that consumes it, as a change of the dot's contracting dimension. On CPU
  (XLA:CPU, JAX 0.10) a dot that contracts its left operand's second-to-last axis is not given to YNNPACK
  and runs on the slower Eigen path. ``optimization_barrier`` keeps the transpose a separate copy, so the
  dot reads a plain ``[m, k] x [k, n]`` product. ``batched_matmul``'s backward uses it on the smaller of
  its forward's left operand and the output's cotangent.

  Args:
    x: ``[..., m, n]``.

  Returns:
    ``[..., n, m]``.
  """
  return jax.lax.optimization_barrier(jnp.swapaxes(x, -1, -2))
