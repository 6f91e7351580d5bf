"""Position-wise feed-forward network (Vaswani et al. 2017, eq. 2)."""
from __future__ import annotations

import functools

import jax

from transformer.ops.dense import dense
from transformer.ops.dropout import dropout
from transformer.ops.kernels import Kernels

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
