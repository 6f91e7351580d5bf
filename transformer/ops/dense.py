"""Dense maps: the affine map of every projection (``dense``, ``x W + b`` over the last axis), and the position-wise
feed-forward network of two of them around an activation (``feed_forward``, Vaswani et al. 2017, eq. 2)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from transformer.ops.dropout import dropout
from transformer.ops.kernels import Kernels


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

ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,  # the tanh approximation (GPT-2's "gelu_new"), jax.nn.gelu's default
    # x * Phi(x) with the exact normal CDF (erf), as BERT checkpoints were trained with ("gelu" in their config).
    "gelu_exact": functools.partial(jax.nn.gelu, approximate=False),
}


def feed_forward(x, kernel_in, bias_in, kernel_out, bias_out, activation: str = "relu",
                 dropout_rate: float = 0.0, dropout_rng=None, precision=None, kernels: Kernels | None = None,
                 constrain_hidden=None):
  """``FFN(x) = act(x W_1 + b_1) W_2 + b_2``, applied to each position alike.

  Args:
    x: ``[batch, length, d_model]``.
    kernel_in: ``W_1``, ``[d_model, d_ff]``;  bias_in: ``[d_ff]`` or None.
    kernel_out: ``W_2``, ``[d_ff, d_model]``;  bias_out: ``[d_model]`` or None.
    activation: one of ``ACTIVATIONS`` ("relu" as in the paper, "gelu" (tanh approximation) or
      "gelu_exact").
    dropout_rate, dropout_rng: dropout on the hidden activations.
    kernels: a backend-tuned dropout (``kernels.py``); None for the reference one.
    constrain_hidden: a function applied to the hidden activations ``[batch, length, d_ff]`` that returns them
      unchanged in value (a caller's sharding constraint); None: none.

  Returns:
    ``[batch, length, d_model]``.
  """
  if activation not in ACTIVATIONS:
    raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
  hidden = ACTIVATIONS[activation](dense(x, kernel_in, bias_in, precision=precision))
  if constrain_hidden is not None:
    hidden = constrain_hidden(hidden)
  hidden = dropout(hidden, dropout_rate, dropout_rng, kernels=kernels)
  return dense(hidden, kernel_out, bias_out, precision=precision)
