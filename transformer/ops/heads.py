"""Grouped-query attention's head bookkeeping (Ainslie et al. 2023; multi-query: Shazeer 2019).

Queries have ``heads`` heads, keys and values ``kv_heads`` dividing it; query head ``n`` reads key/value head
``n // (heads // kv_heads)``, the grouping of ``jax.nn.dot_product_attention``.
"""
from __future__ import annotations

import jax.numpy as jnp


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
