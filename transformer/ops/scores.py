"""Score (compatibility) functions: unnormalised attention logits.

Every score function maps queries ``[batch, q_length, heads, d]`` and keys ``[batch, kv_length, heads, d]``
to logits ``[batch, heads, q_length, kv_length]``, which ``attention.attention_weights`` turns into weights.
Single-head users (e.g. the RNN baselines) pass ``heads = 1``.

References: Vaswani et al. 2017 (scaled dot product), Luong et al. 2015 (dot, general, and a cosine
variant as in Graves et al. 2014), Bahdanau et al. 2015 (additive).
"""
from __future__ import annotations

import jax.numpy as jnp

from transformer.ops.heads import head_groups, repeat_kv_heads
from transformer.ops.kernels import REFERENCE, Kernels


def dot_product_scores(query, key, scale: bool | float = True, precision=None, float32_logits: bool = True,
                       kernels: Kernels | None = None):
  """Scaled dot product ``q . k / sqrt(d_k)`` (Vaswani et al., eq. 1).

  The scale keeps the logits' variance near 1 when q and k have unit-variance entries: without it the
  variance of ``q . k`` grows like ``d_k`` and the softmax saturates.

  Args:
    query: ``[batch, q_length, heads, d_k]``.
    key: ``[batch, kv_length, kv_heads, d_k]``, ``kv_heads`` dividing ``heads`` (grouped-query attention).
    scale: True for ``1/sqrt(d_k)``, False for none (Luong "dot" and the ablation), or a float.
    precision: passed to the einsum.
    float32_logits: True (default) accumulates and returns float32 logits whatever the inputs' dtype;
      False returns them in the inputs' dtype, as flax's stock attention does (faster in bfloat16, where
      the logits are the largest tensor of attention; less accurate).
    kernels: a backend-tuned product (``kernels.py``); None for the einsum.

  Returns:
    ``[batch, heads, q_length, kv_length]`` logits, float32 unless ``float32_logits`` is False.
  """
  kernels = kernels or REFERENCE
  if scale is True:
    scale = query.shape[-1] ** -0.5
  elif scale is False:
    scale = None
  if scale is not None:
    # (q / sqrt(d_k)) k^T, as flax: one pass over the queries instead of one over the logits. In bfloat16
    # the scaled query is rounded once more, unless the scale is a power of 2 (d_k a power of 4, e.g. 64).
    query = query * jnp.asarray(scale, query.dtype)
  # Logits accumulate and stay in float32 (as jax.nn does): no rounding between the dot and the softmax.
  logits_dtype = jnp.float32 if float32_logits else None
  if kernels.query_key_product is not None:
    return kernels.query_key_product(query, repeat_kv_heads(key, query.shape[2]), precision=precision,
                                     preferred_element_type=logits_dtype)
  batch, q_length, heads, head_dim = query.shape
  kv_heads = key.shape[2]
  # Grouped-query keys: query head h * groups + g reads key head h (as jax.nn.dot_product_attention).
  query = query.reshape(batch, q_length, kv_heads, head_groups(heads, kv_heads), head_dim)
  logits = jnp.einsum("bqhgd,bkhd->bhgqk", query, key, precision=precision, preferred_element_type=logits_dtype)
  return logits.reshape(batch, heads, q_length, key.shape[1])


def luong_dot_scores(query, key, precision=None, kernels: Kernels | None = None):
  """Luong "dot": ``q . k`` without scaling.  Shapes and ``kernels`` as ``dot_product_scores``."""
  return dot_product_scores(query, key, scale=False, precision=precision, kernels=kernels)


def general_scores(query, key, weight, precision=None, kernels: Kernels | None = None):
  """Luong "general" (bilinear): ``q^T W k``.

  Args:
    query: ``[batch, q_length, heads, d_q]``.
    key: ``[batch, kv_length, heads, d_k]``.
    weight: ``[d_q, d_k]`` (shared by all heads) or ``[heads, d_q, d_k]``.
    kernels: as ``dot_product_scores``.

  Returns:
    ``[batch, heads, q_length, kv_length]`` logits.
  """
  if weight.ndim == 2:
    projected = jnp.einsum("bqhd,de->bqhe", query, weight, precision=precision)
  else:
    projected = jnp.einsum("bqhd,hde->bqhe", query, weight, precision=precision)
  return dot_product_scores(projected, key, scale=False, precision=precision, kernels=kernels)


def cosine_scores(query, key, temperature: float = 1.0, epsilon: float = 1e-8, precision=None,
                  kernels: Kernels | None = None):
  """Cosine similarity ``q . k / (|q| |k|)``, divided by ``temperature``.

  Shapes and ``kernels`` as ``dot_product_scores``. Logits lie in ``[-1/temperature, 1/temperature]``.
  """
  query_norm = jnp.sqrt(jnp.sum(jnp.square(query), axis=-1, keepdims=True) + epsilon)
  key_norm = jnp.sqrt(jnp.sum(jnp.square(key), axis=-1, keepdims=True) + epsilon)
  scores = dot_product_scores(query / query_norm, key / key_norm, scale=False, precision=precision,
                              kernels=kernels)
  return scores / temperature


def additive_scores(query, key, query_weight, key_weight, score_vector, precision=None):
  """Bahdanau additive score ``v^T tanh(W q + U k)``.

  Memory is ``O(batch * heads * q_length * kv_length * d_attn)``: fine for the RNN baselines it serves. A
  decoder that scores many queries against the same keys projects them once (``project_additive_keys``)
  and calls ``additive_scores_projected`` per step.

  Args:
    query: ``[batch, q_length, heads, d_q]``.
    key: ``[batch, kv_length, heads, d_k]``.
    query_weight: ``W``, ``[d_q, d_attn]``.
    key_weight: ``U``, ``[d_k, d_attn]``.
    score_vector: ``v``, ``[d_attn]``.

  Returns:
    ``[batch, heads, q_length, kv_length]`` logits.
  """
  return additive_scores_projected(query, project_additive_keys(key, key_weight, precision), query_weight,
                                   score_vector, precision)


def project_additive_keys(key, key_weight, precision=None):
  """``U k`` of the additive score: ``[batch, kv_length, heads, d_k]`` -> ``[batch, kv_length, heads, d_attn]``."""
  return jnp.einsum("bkhd,da->bkha", key, key_weight, precision=precision)


def additive_scores_projected(query, projected_key, query_weight, score_vector, precision=None):
  """``v^T tanh(W q + U k)`` given ``projected_key`` = ``U k`` ``[batch, kv_length, heads, d_attn]`` (from
  ``project_additive_keys``); other shapes as ``additive_scores``."""
  projected_query = jnp.einsum("bqhd,da->bhqa", query, query_weight, precision=precision)
  # [batch, heads, q_length, kv_length, d_attn]
  hidden = jnp.tanh(projected_query[:, :, :, None, :] + projected_key.transpose(0, 2, 1, 3)[:, :, None, :, :])
  return jnp.einsum("bhqka,a->bhqk", hidden, score_vector, precision=precision)
