"""The attention core: masked softmax over logits, then a weighted sum of values.

Every attention variant in this package goes through ``attention_weights`` and ``weighted_values``:
dot-product (``dot_product_attention``), the Luong and Bahdanau scores of ``scores.py`` (compute logits,
then call ``attention_weights``), and the cached decoder (``transformer.nn.MultiHeadAttention``).
The memory-efficient path (``chunked.py``) computes the same function block by block.

Shapes: queries ``[batch, q_length, heads, head_dim]``, keys and values ``[batch, kv_length, heads, head_dim]``
(the convention of ``jax.nn.dot_product_attention``); logits, masks and weights
``[batch, heads, q_length, kv_length]``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from transformer.ops.dense import batched_matmul
from transformer.ops.dropout import dropout
from transformer.ops.scores import dot_product_scores

# Masked logits are set to this value rather than -inf: a row with every key masked then gives a finite
# softmax (which we zero out) instead of NaN, and gradients stay finite. exp(-1e9 - x) is exactly 0 in
# float32 for any realistic logit x, so partially masked rows are unaffected.
MASK_VALUE = -1e9


def attention_weights(logits, mask=None, bias=None, dropout_rate: float = 0.0, dropout_rng=None,
                      broadcast_dropout: bool = True, dtype=None, float32_logits: bool = True):
  """Softmax over keys, computed in float32 (by default), with masking and optional dropout.

  Args:
    logits: ``[batch, heads, q_length, kv_length]``.
    mask: bool, broadcastable to logits; True where attending is allowed.
    bias: float, broadcastable to logits; added before the softmax (e.g. relative positions).
    dropout_rate: probability of dropping a weight (the paper's attention dropout).
    dropout_rng: key for dropout, needed when ``dropout_rate > 0``.
    broadcast_dropout: share one dropout mask across batch and heads (as flax does).
    dtype: dtype of the returned weights (defaults to ``logits.dtype``).
    float32_logits: True (default) adds the bias, masks and takes the softmax in float32; False does so
      in the logits' own dtype (flax's stock behaviour: less accurate; ``python -m benchmarks.attention``
      times it beside the default, in its own column of benchmarks/RESULTS.md).

  Returns:
    ``[batch, heads, q_length, kv_length]`` weights; rows sum to 1, except rows whose keys are all masked,
    which are exactly 0 (never NaN and never a uniform average over padding).
  """
  dtype = logits.dtype if dtype is None else dtype
  # float32 softmax: bfloat16's 8-bit mantissa loses small probabilities and the normaliser.
  softmax_dtype = jnp.float32 if float32_logits else logits.dtype
  logits = logits.astype(softmax_dtype)
  if bias is not None:
    logits = logits + bias.astype(softmax_dtype)
  if mask is not None:
    logits = jnp.where(mask, logits, MASK_VALUE)  # -inf in float16: a fully masked row is NaN until zeroed below
  if float32_logits and jnp.finfo(dtype).bits < 32:
    weights = _softmax_saved_in(logits, dtype)  # float32 softmax, weights (and the backward's copy) in dtype
  else:
    # jax.nn.softmax: its custom JVP differentiates y * (g - sum(y g)) and never through the max it
    # subtracts (a hand-written exp/sum did, at the cost of an extra [batch, heads, q, kv] backward pass).
    weights = jax.nn.softmax(logits, axis=-1)
  if mask is not None:
    weights = jnp.where(jnp.any(mask, axis=-1, keepdims=True), weights, jnp.zeros((), weights.dtype))
  if dropout_rate > 0.0:
    weights = dropout(weights, dropout_rate, dropout_rng, broadcast_dims=(0, 1) if broadcast_dropout else ())
  return weights.astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _softmax_saved_in(logits, dtype):
  """``softmax(logits)`` over the last axis, computed in float32 and returned in the low-precision ``dtype``.

  Autodiff of the float32 softmax would keep its float32 ``[batch, heads, q_length, kv_length]`` output for
  the backward; here the backward reuses the ``dtype`` weights (half the bytes written and read) and
  computes ``w * (g - sum(w g))`` in float32. In bfloat16, forward+backward of 8 heads of 64 on CPU: 1.10x
  faster at 1024 tokens, 1.06x at 4096; 1.13x at both with the bfloat16 backward of the scores
  (``scores.dot_product_scores``); interleaved A/B in one process on a loaded 2-core machine, 2026-11-25.
  """
  return jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(dtype)


def _softmax_forward(logits, dtype):
  weights = _softmax_saved_in(logits, dtype)
  return weights, weights


def _softmax_backward(dtype, weights, weights_cotangent):
  del dtype
  weights = weights.astype(jnp.float32)
  weights_cotangent = weights_cotangent.astype(jnp.float32)
  return (weights * (weights_cotangent - jnp.sum(weights * weights_cotangent, axis=-1, keepdims=True)),)


_softmax_saved_in.defvjp(_softmax_forward, _softmax_backward)


def weighted_values(weights, value, precision=None):
  """Weighted sum of values.

  Args:
    weights: ``[batch, heads, q_length, kv_length]``.
    value: ``[batch, kv_length, heads, head_dim]``.

  Returns:
    ``[batch, q_length, heads, head_dim]``.
  """
  # Heads next to batch for the matmul, as in dot_product_scores.
  output = batched_matmul(weights.astype(value.dtype), jnp.swapaxes(value, 1, 2), precision=precision)
  return jnp.swapaxes(output, 1, 2)


def dot_product_attention(query, key, value, mask=None, bias=None, *, scale: bool | float = True,
                          dropout_rate: float = 0.0, dropout_rng=None, broadcast_dropout: bool = True,
                          return_weights: bool = False, precision=None, float32_logits: bool = True):
  """Scaled dot-product attention, ``softmax(q k^T / sqrt(d_k)) v`` (Vaswani et al. 2017, eq. 1).

  Args:
    query: ``[batch, q_length, heads, head_dim]``.
    key: ``[batch, kv_length, heads, head_dim]``.
    value: ``[batch, kv_length, heads, head_dim_v]``.
    mask: bool ``[batch, heads, q_length, kv_length]`` (broadcastable); True = attend.
    bias: float, broadcastable to ``[batch, heads, q_length, kv_length]``.
    scale: True for ``1/sqrt(head_dim)``, False for no scaling (ablation), or a float.
    dropout_rate, dropout_rng, broadcast_dropout: attention-weight dropout.
    return_weights: also return the ``[batch, heads, q_length, kv_length]`` weights.
    precision: einsum precision.
    float32_logits: True (default): logits and softmax in float32 whatever the inputs' dtype. False: in the
      inputs' dtype, as flax's stock attention (T5X's ``float32_logits=False``); only differs for
      bfloat16/float16 inputs.

  Returns:
    ``[batch, q_length, heads, head_dim_v]`` in the value's dtype, and the weights if asked.
  """
  if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
    raise ValueError("query, key and value must be [batch, length, heads, head_dim]; got shapes "
                     f"{query.shape}, {key.shape}, {value.shape}")
  if query.shape[-1] != key.shape[-1]:
    raise ValueError(f"query and key head_dim differ: {query.shape[-1]} vs {key.shape[-1]}")
  if key.shape[:3] != value.shape[:3]:
    raise ValueError(f"key and value must agree on [batch, kv_length, heads]: {key.shape} vs {value.shape}")
  logits = dot_product_scores(query, key, scale=scale, precision=precision, float32_logits=float32_logits)
  weights = attention_weights(logits, mask=mask, bias=bias, dropout_rate=dropout_rate,
                              dropout_rng=dropout_rng, broadcast_dropout=broadcast_dropout,
                              dtype=value.dtype, float32_logits=float32_logits)
  output = weighted_values(weights, value, precision=precision)
  return (output, weights) if return_weights else output
