"""Score (compatibility) functions: unnormalised attention logits.

Every score function maps queries ``[batch, q_length, heads, d]`` and keys ``[batch, kv_length, heads, d]``
to logits ``[batch, heads, q_length, kv_length]``, which ``attention.attention_weights`` turns into weights.
Single-head users (e.g. the RNN baselines) pass ``heads = 1``.

References: Vaswani et al. 2017 (scaled dot product), Luong et al. 2015 (dot, general, and a cosine
variant as in Graves et al. 2014), Bahdanau et al. 2015 (additive).
"""
from __future__ import annotations

import jax.numpy as jnp

from transformer.ops.dense import batched_matmul


def dot_product_scores(query, key, scale: bool | float = True, precision=None, float32_logits: bool = True):
  """Scaled dot product ``q . k / sqrt(d_k)`` (Vaswani et al., eq. 1).

  The scale keeps the logits' variance near 1 when q and k have unit-variance entries: without it the
  variance of ``q . k`` grows like ``d_k`` and the softmax saturates.

  Args:
    query: ``[batch, q_length, heads, d_k]``.
    key: ``[batch, kv_length, heads, d_k]``.
    scale: True for ``1/sqrt(d_k)``, False for none (Luong "dot" and the ablation), or a float.
    precision: passed to ``jnp.matmul``.
    float32_logits: True (default) accumulates and returns float32 logits whatever the inputs' dtype;
      False returns them in the inputs' dtype, as flax's stock attention does (faster in bfloat16, where
      the logits are the largest tensor of attention; less accurate).

  Returns:
    ``[batch, heads, q_length, kv_length]`` logits, float32 unless ``float32_logits`` is False.
  """
  if scale is True:
    scale = query.shape[-1] ** -0.5
  elif scale is False:
    scale = None
  if scale is not None:
    # Scaling the query (as flax does) is one pass over [batch, q_length, heads, d_k] instead of one over the
    # [batch, heads, q_length, kv_length] logits, forward and backward: about 5% of the forward+backward time
    # at 512-1024 tokens. In bfloat16 the scaled query is rounded once more, unless the scale is a power of 2
    # (d_k a power of 4, e.g. 64).
    query = query * jnp.asarray(scale, query.dtype)
  # Logits accumulate and stay in float32 (as jax.nn does): no rounding between the dot and the softmax.
  # Heads moved next to batch before the dot (not inside the einsum): XLA then runs a plain batched
  # matmul over [batch * heads] instead of choosing strided layouts; on CPU this made the float32
  # forward at 128-256 tokens 1.7-2.5x faster (benchmarks/attention.py). batched_matmul's backward runs
  # in the inputs' dtype (bfloat16 stays bfloat16) and as plain matmuls (see its docstring).
  query, key = jnp.swapaxes(query, 1, 2), jnp.swapaxes(key, 1, 2)
  logits_dtype = jnp.float32 if float32_logits else None
  if query.shape[2] == 1:
    # One query (an RNN decoder step inside a scan): as in batched_matmul, plain autodiff; the einsum also
    # keeps the key's transpose folded into the dot (written as batched_matmul's b it made a 30-step scan
    # of Luong attention 1.5x slower forward+backward on CPU).
    return jnp.einsum("bhqd,bhkd->bhqk", query, key, precision=precision, preferred_element_type=logits_dtype)
  return batched_matmul(query, jnp.swapaxes(key, -1, -2), precision=precision,
                        preferred_element_type=logits_dtype)


def luong_dot_scores(query, key, precision=None):
  """Luong "dot": ``q . k`` without scaling.  Shapes as ``dot_product_scores``."""
  return dot_product_scores(query, key, scale=False, precision=precision)


def general_scores(query, key, weight, precision=None):
  """Luong "general" (bilinear): ``q^T W k``.

  Args:
    query: ``[batch, q_length, heads, d_q]``.
    key: ``[batch, kv_length, heads, d_k]``.
    weight: ``[d_q, d_k]`` (shared by all heads) or ``[heads, d_q, d_k]``.

  Returns:
    ``[batch, heads, q_length, kv_length]`` logits.
  """
  if weight.ndim == 2:
    projected = jnp.einsum("bqhd,de->bqhe", query, weight, precision=precision)
  else:
    projected = jnp.einsum("bqhd,hde->bqhe", query, weight, precision=precision)
  return dot_product_scores(projected, key, scale=False, precision=precision)


def cosine_scores(query, key, temperature: float = 1.0, epsilon: float = 1e-8, precision=None):
  """Cosine similarity ``q . k / (|q| |k|)``, divided by ``temperature``.

  Shapes as ``dot_product_scores``. Logits lie in ``[-1/temperature, 1/temperature]``.
  """
  query_norm = jnp.sqrt(jnp.sum(jnp.square(query), axis=-1, keepdims=True) + epsilon)
  key_norm = jnp.sqrt(jnp.sum(jnp.square(key), axis=-1, keepdims=True) + epsilon)
  scores = dot_product_scores(query / query_norm, key / key_norm, scale=False, precision=precision)
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
