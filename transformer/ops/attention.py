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

import jax
import jax.numpy as jnp

from transformer.ops.dropout import dropout
from transformer.ops.scores import dot_product_scores

# Masked logits are set to this value rather than -inf: a row with every key masked then gives a finite
# softmax (which we zero out) instead of NaN, and gradients stay finite. exp(-1e9 - x) is exactly 0 in
# float32 for any realistic logit x, so partially masked rows are unaffected.
MASK_VALUE = -1e9


def attention_weights(logits, mask=None, bias=None, dropout_rate: float = 0.0, dropout_rng=None,
                      broadcast_dropout: bool = True, dtype=None):
  """Softmax over keys, computed in float32, with masking and optional dropout.

  Args:
    logits: ``[batch, heads, q_length, kv_length]``.
    mask: bool, broadcastable to logits; True where attending is allowed.
    bias: float, broadcastable to logits; added before the softmax (e.g. relative positions).
    dropout_rate: probability of dropping a weight (the paper's attention dropout).
    dropout_rng: key for dropout, needed when ``dropout_rate > 0``.
    broadcast_dropout: share one dropout mask across batch and heads (as flax does).
    dtype: dtype of the returned weights (defaults to ``logits.dtype``).

  Returns:
    ``[batch, heads, q_length, kv_length]`` weights; rows sum to 1, except rows whose keys are all masked,
    which are exactly 0 (never NaN and never a uniform average over padding).
  """
  dtype = logits.dtype if dtype is None else dtype
  # float32 softmax: bfloat16's 8-bit mantissa loses small probabilities and the normaliser.
  logits = logits.astype(jnp.float32)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, MASK_VALUE)
  # jax.nn.softmax: its custom JVP differentiates y * (g - sum(y g)) and never through the max it subtracts
  # (a hand-written exp/sum did, at the cost of an extra [batch, heads, q, kv] pass in the backward).
  weights = jax.nn.softmax(logits, axis=-1)
  if mask is not None:
    weights = jnp.where(jnp.any(mask, axis=-1, keepdims=True), weights, 0.0)
  if dropout_rate > 0.0:
    weights = dropout(weights, dropout_rate, dropout_rng, broadcast_dims=(0, 1) if broadcast_dropout else ())
  return weights.astype(dtype)


def weighted_values(weights, value, precision=None):
  """Weighted sum of values.

  Args:
    weights: ``[batch, heads, q_length, kv_length]``.
    value: ``[batch, kv_length, heads, head_dim]``.

  Returns:
    ``[batch, q_length, heads, head_dim]``.
  """
  # Heads next to batch for the matmul, as in dot_product_scores.
  output = jnp.einsum("bhqk,bhkd->bhqd", weights.astype(value.dtype), jnp.swapaxes(value, 1, 2),
                      precision=precision)
  return jnp.swapaxes(output, 1, 2)


def dot_product_attention(query, key, value, mask=None, bias=None, *, scale: bool | float = True,
                          dropout_rate: float = 0.0, dropout_rng=None, broadcast_dropout: bool = True,
                          return_weights: bool = False, precision=None):
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
  logits = dot_product_scores(query, key, scale=scale, precision=precision)
  weights = attention_weights(logits, mask=mask, bias=bias, dropout_rate=dropout_rate,
                              dropout_rng=dropout_rng, broadcast_dropout=broadcast_dropout,
                              dtype=value.dtype)
  output = weighted_values(weights, value, precision=precision)
  return (output, weights) if return_weights else output
