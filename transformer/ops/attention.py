"""The attention core: ``softmax(q k^T / sqrt(d_k)) v`` as a masked softmax over logits, then a weighted sum of values.

Every attention variant in this package goes through ``attention_weights`` and ``weighted_values``:
dot-product (``dot_product_attention``), the Luong and Bahdanau scores of ``scores.py`` (compute logits,
then call ``attention_weights``), and the cached decoder (``transformer.nn.MultiHeadAttention``).
The memory-efficient path (``chunked.py``) is a separate function with a narrower interface: it takes the
mask in parts (per-position validity and segments, ``causal``, ``window``) rather than a dense ``mask``, has no
``bias``, dropout, weights or ``precision``, and always computes logits in float32; given those parts it equals
(to float rounding) ``dot_product_attention`` over the mask they build. ``attend`` chooses between the two.

Shapes: queries ``[batch, q_length, heads, head_dim]``, keys and values ``[batch, kv_length, kv_heads, head_dim]``
(the convention of ``jax.nn.dot_product_attention``; ``kv_heads`` divides ``heads``, equal but for grouped-query
and multi-query attention, see ``heads.py``); logits, masks and weights ``[batch, heads, q_length, kv_length]``.

Each function computes its formula. The optional ``kernels`` argument (``kernels.select_kernels``, set by
``ModelConfig.kernels``) swaps in backend-tuned pieces that compute the same values, e.g. cuDNN's fused
attention on a GPU.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer.ops.dropout import dropout
from transformer.ops.heads import check_attention_inputs, head_groups, repeat_kv_heads
from transformer.ops.kernels import REFERENCE, Kernels, fused_attention_blocker
from transformer.ops.masks import (MASK_VALUE, check_mask_shape, check_per_position, combine_masks,
                                   make_attention_mask, make_causal_mask, make_local_mask, make_segment_mask)
from transformer.ops.scores import dot_product_scores

def _zero_unseen_keys(key, value, mask):
  """Keys and values set to 0 where no query may attend (e.g. padding): a weight of exactly 0 times a NaN
  or inf there would otherwise still reach the output (0 * NaN = NaN) and the gradients."""
  mask = jnp.asarray(mask, bool)
  mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)  # numpy broadcasting adds leading axes
  seen = jnp.any(mask, axis=(1, 2))[:, :, None, None]  # [batch or 1, kv_length, 1, 1]
  return jnp.where(seen, key, jnp.zeros((), key.dtype)), jnp.where(seen, value, jnp.zeros((), value.dtype))


def attention_weights(logits, mask=None, bias=None, dropout_rate: float = 0.0, dropout_rng=None,
                      broadcast_dropout: bool = True, dtype=None, float32_logits: bool = True,
                      kernels: Kernels | None = None):
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
      in the logits' own dtype (flax's stock behaviour: less accurate, faster in bfloat16).
    kernels: backend-tuned softmax and dropout (``kernels.py``); None for the formula.

  Returns:
    ``[batch, heads, q_length, kv_length]`` weights; rows sum to 1, except rows whose keys are all masked,
    which are exactly 0 (never NaN and never a uniform average over padding).
  """
  kernels = kernels or REFERENCE
  logits, mask = jnp.asarray(logits), None if mask is None else jnp.asarray(mask)
  for name, array in (("mask", mask), ("bias", bias)):
    if array is not None:
      check_mask_shape(name, jnp.shape(array), logits.shape)
  dtype = logits.dtype if dtype is None else dtype
  # float32 softmax: bfloat16's 8-bit mantissa loses small probabilities and the normaliser.
  softmax_dtype = jnp.float32 if float32_logits else logits.dtype
  logits = logits.astype(softmax_dtype)
  if bias is not None:
    logits = logits + jnp.asarray(bias, softmax_dtype)
  if mask is not None:
    logits = jnp.where(mask, logits, MASK_VALUE)  # -inf in float16: a fully masked row is NaN until zeroed below
  if kernels.softmax is not None:
    weights = kernels.softmax(logits, dtype)
  else:
    weights = jax.nn.softmax(logits, axis=-1)
  if mask is not None:
    weights = jnp.where(jnp.any(mask, axis=-1, keepdims=True), weights, jnp.zeros((), weights.dtype))
  if dropout_rate > 0.0:
    weights = dropout(weights, dropout_rate, dropout_rng, broadcast_dims=(0, 1) if broadcast_dropout else (),
                      kernels=kernels)
  return weights.astype(dtype)


def weighted_values(weights, value, precision=None, kernels: Kernels | None = None):
  """Weighted sum of values.

  Args:
    weights: ``[batch, heads, q_length, kv_length]``.
    value: ``[batch, kv_length, kv_heads, head_dim]``, ``kv_heads`` dividing ``heads``.
    precision: einsum precision.
    kernels: a backend-tuned product (``kernels.py``); None for the einsum.

  Returns:
    ``[batch, q_length, heads, head_dim]``.
  """
  kernels = kernels or REFERENCE
  weights = weights.astype(value.dtype)
  if kernels.weights_value_product is not None:
    return kernels.weights_value_product(weights, repeat_kv_heads(value, weights.shape[1]), precision=precision)
  batch, heads, q_length, kv_length = weights.shape
  kv_heads = value.shape[2]
  weights = weights.reshape(batch, kv_heads, head_groups(heads, kv_heads), q_length, kv_length)
  output = jnp.einsum("bhgqk,bkhd->bqhgd", weights, value, precision=precision)
  return output.reshape(batch, q_length, heads, value.shape[-1])


def dot_product_attention(query, key, value, mask=None, bias=None, *, scale: bool | float = True,
                          dropout_rate: float = 0.0, dropout_rng=None, broadcast_dropout: bool = True,
                          return_weights: bool = False, precision=None, float32_logits: bool = True,
                          kernels: Kernels | None = None):
  """Scaled dot-product attention, ``softmax(q k^T / sqrt(d_k)) v`` (Vaswani et al. 2017, eq. 1).

  Args:
    query: ``[batch, q_length, heads, head_dim]`` (any array-like: a nested list is converted with
      ``jnp.asarray``, as ``jax.nn.dot_product_attention`` does; so are ``key``, ``value``, ``mask``, ``bias``).
    key: ``[batch, kv_length, kv_heads, head_dim]``, ``kv_heads`` dividing ``heads`` (grouped-query attention).
    value: ``[batch, kv_length, kv_heads, head_dim_v]``.
    mask: bool ``[batch, heads, q_length, kv_length]`` (broadcastable); True = attend. Keys and values that
      no query may attend to are never read (a NaN or inf there does not reach the output).
    bias: float, broadcastable to ``[batch, heads, q_length, kv_length]``.
    scale: True for ``1/sqrt(head_dim)``, False for no scaling (ablation), or a float.
    dropout_rate, dropout_rng, broadcast_dropout: attention-weight dropout.
    return_weights: also return the ``[batch, heads, q_length, kv_length]`` weights.
    precision: einsum precision.
    float32_logits: True (default): logits and softmax in float32 whatever the inputs' dtype. False: in the
      inputs' dtype, as flax's stock attention (T5X's ``float32_logits=False``); only differs for
      bfloat16/float16 inputs.
    kernels: backend-tuned pieces (``kernels.select_kernels``); None for the formula. A fused attention
      kernel (cuDNN) is used only where ``kernels.fused_attention_blocker`` finds nothing against it.

  Returns:
    ``[batch, q_length, heads, head_dim_v]`` in the value's dtype, and the weights if asked.
  """
  kernels = kernels or REFERENCE
  # Array-likes (nested lists, numpy) are taken as jax.nn.dot_product_attention takes them.
  query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
  mask, bias = (None if x is None else jnp.asarray(x) for x in (mask, bias))
  check_attention_inputs(query, key, value)
  weights_shape = (query.shape[0], query.shape[2], query.shape[1], key.shape[1])
  for name, array in (("mask", mask), ("bias", bias)):
    if array is not None:  # here, not at the first broadcast, which names neither the argument nor its shape
      check_mask_shape(name, array.shape, weights_shape)
  if mask is not None:
    key, value = _zero_unseen_keys(key, value, mask)
  if kernels.attention is not None and fused_attention_blocker(
      query, key, value, mask=mask, bias=bias, dropout_rate=dropout_rate, return_weights=return_weights,
      precision=precision) is None:
    scale = query.shape[-1] ** -0.5 if scale is True else 1.0 if scale is False else scale
    return kernels.attention(query, key, value, mask, float(scale))
  logits = dot_product_scores(query, key, scale=scale, precision=precision, float32_logits=float32_logits,
                              kernels=kernels)
  weights = attention_weights(logits, mask=mask, bias=bias, dropout_rate=dropout_rate,
                              dropout_rng=dropout_rng, broadcast_dropout=broadcast_dropout,
                              dtype=value.dtype, float32_logits=float32_logits, kernels=kernels)
  output = weighted_values(weights, value, precision=precision, kernels=kernels)
  return (output, weights) if return_weights else output


def attend(query, key, value, *, query_valid=None, key_valid=None, causal: bool = False,
           window: int | None = None, mask=None, scale: bool | float = True, dropout_rate: float = 0.0,
           dropout_rng=None, return_weights: bool = False, float32_logits: bool = True,
           kernels: Kernels | None = None, query_segments=None, key_segments=None):
  """Scaled dot-product attention with its mask given in parts, in the implementation ``kernels`` allow.

  The one place an implementation is chosen: the memory-efficient blocks of ``chunked.py`` when
  ``kernels.attention_chunk_size`` is set and nothing needs the weights or a dense mask (no dropout, no
  ``mask``, no ``return_weights``); otherwise ``dot_product_attention`` over the dense mask built from the
  parts, which itself takes a fused kernel (cuDNN) where one applies. The paths agree to float rounding, with
  two differences: the chunked one always computes logits in float32 (it ignores ``float32_logits=False``)
  and returns the query's dtype where the dense one returns the value's.

  Args:
    query, key, value: as ``dot_product_attention``.
    query_valid: bool ``[batch, q_length]``, False at padding; key_valid: bool ``[batch, kv_length]``.
    causal: query ``i`` sees keys ``j <= i``; window: and only those less than ``window`` positions away
      (``make_local_mask``).
    mask: a further bool mask broadcastable to ``[batch, heads, q_length, kv_length]`` (e.g. a decode cache's,
      which differs per example and query); it takes the dense path.
    scale, dropout_rate, dropout_rng, return_weights, float32_logits: as ``dot_product_attention``.
    kernels: ``select_kernels(...)`` (a model's ``config.resolved_kernels``); None for the formula.
    query_segments, key_segments: int ``[batch, q_length]`` and ``[batch, kv_length]``, the examples of packed
      rows (``make_segment_mask``): attention never crosses from one to another. None: one example per row.

  Returns:
    ``[batch, q_length, heads, head_dim_v]``, and the weights if ``return_weights``.
  """
  kernels = kernels or REFERENCE
  query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
  if (query_segments is None) != (key_segments is None):
    raise ValueError("packed rows need both query_segments and key_segments (in self attention both are the "
                     "row's segments); got only one of them.")
  check_attention_inputs(query, key, value)
  batch, q_length, kv_length = query.shape[0], query.shape[1], key.shape[1]
  for name, values in (("query_valid", query_valid), ("key_valid", key_valid), ("query_segments", query_segments),
                       ("key_segments", key_segments)):
    check_per_position(name, values, batch, q_length if name.startswith("query") else kv_length)
  if kernels.attention_chunk_size and not (return_weights or dropout_rate > 0.0 or mask is not None):
    from transformer.ops.chunked import chunked_dot_product_attention  # loaded by the runs that chunk only
    return chunked_dot_product_attention(
        query, key, value, query_valid, key_valid, causal=causal, window=window, scale=scale,
        query_chunk_size=kernels.attention_chunk_size, key_chunk_size=kernels.attention_chunk_size, kernels=kernels,
        query_segments=query_segments, key_segments=key_segments)
  dense_mask = None
  if query_valid is not None or key_valid is not None:
    dense_mask = make_attention_mask(jnp.ones((batch, q_length), bool) if query_valid is None else query_valid,
                                     jnp.ones((batch, kv_length), bool) if key_valid is None else key_valid)
  if causal:
    dense_mask = combine_masks(dense_mask, make_causal_mask(q_length, kv_length))
  dense_mask = combine_masks(dense_mask, mask)
  if window is not None:
    dense_mask = combine_masks(dense_mask, make_local_mask(q_length, window, kv_length))
  if query_segments is not None:
    dense_mask = combine_masks(dense_mask, make_segment_mask(query_segments, key_segments))
  return dot_product_attention(query, key, value, mask=dense_mask, scale=scale, dropout_rate=dropout_rate,
                               dropout_rng=dropout_rng, return_weights=return_weights,
                               float32_logits=float32_logits, kernels=kernels)
