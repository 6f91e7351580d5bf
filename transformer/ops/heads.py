"""The head layout of attention's inputs: the check every attention path (dense, chunked) runs first, and
grouped-query attention's head bookkeeping (Ainslie et al. 2023; multi-query: Shazeer 2019).

Queries have ``heads`` heads, keys and values ``kv_heads`` dividing it; query head ``n`` reads key/value head
``n // (heads // kv_heads)``, the grouping of ``jax.nn.dot_product_attention``.
"""
from __future__ import annotations

import jax.numpy as jnp


def check_attention_inputs(query, key, value) -> None:
  """Raise a ValueError naming the problem unless query, key and value are float
  ``[batch, length, heads, head_dim]`` arrays that agree as attention needs."""
  if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
    raise ValueError("query, key and value must be [batch, length, heads, head_dim]; got shapes "
                     f"{query.shape}, {key.shape}, {value.shape}")
  if not all(jnp.issubdtype(x.dtype, jnp.floating) for x in (query, key, value)):
    raise ValueError(f"attention needs floating-point query, key and value, got {query.dtype}, {key.dtype}, "
                     f"{value.dtype}; cast them, e.g. with .astype(jnp.float32)")
  if query.shape[-1] != key.shape[-1]:
    raise ValueError(f"query and key head_dim differ: {query.shape[-1]} vs {key.shape[-1]}")
  if key.shape[:3] != value.shape[:3]:
    raise ValueError(f"key and value must agree on [batch, kv_length, heads]: {key.shape} vs {value.shape}")
  if query.shape[0] != key.shape[0] or not key.shape[2] or query.shape[2] % key.shape[2]:
    raise ValueError(f"query and key must agree on batch, and the key's heads must divide the query's "
                     f"(grouped-query attention): {query.shape} vs {key.shape}")


def head_groups(query_heads: int, kv_heads: int) -> int:
  """Query heads per key/value head; a ValueError unless ``kv_heads`` divides ``query_heads``."""
  if kv_heads < 1 or query_heads % kv_heads:
    raise ValueError(f"key/value heads ({kv_heads}) must divide the query heads ({query_heads})")
  return query_heads // kv_heads


def repeat_kv_heads(x, query_heads: int):
  """``[batch, kv_length, kv_heads, head_dim]`` -> ``[batch, kv_length, query_heads, head_dim]``, each head
  repeated for its group: for implementations that need equal head counts (a copy; the einsums avoid it)."""
  groups = head_groups(query_heads, x.shape[2])
  return x if groups == 1 else jnp.repeat(x, groups, axis=2)
