"""Checksums of what a checkpoint holds: every array of the state, and the JSON ``extra`` item (data position,
metrics window), so that flipped bits or an edited position are caught on restore instead of resumed silently."""
from __future__ import annotations

import hashlib
import json

import jax
import numpy as np


def _host_array(leaf) -> np.ndarray | None:
  """The whole value of ``leaf`` on this host, or None when this process holds only part of it."""
  if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
    if not leaf.is_fully_replicated:
      return None
    leaf = leaf.addressable_data(0)
  return np.asarray(jax.device_get(leaf))


def state_checksums(state) -> tuple[dict[str, str], list[str]]:
  """``(checksums, non_finite)``: SHA-256 of each leaf's dtype, shape and bytes by tree path, and the paths
  of floating-point leaves holding a NaN or infinity. Leaves this process holds only a shard of are left out."""
  checksums, non_finite = {}, []
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    array = _host_array(leaf)
    if array is None:
      continue
    name = jax.tree_util.keystr(path)
    array = np.ascontiguousarray(array)
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.view(np.uint8).reshape(-1) if array.size else b"")
    checksums[name] = digest.hexdigest()
    if np.issubdtype(array.dtype, np.inexact) and not np.all(np.isfinite(array)):
      non_finite.append(name)
  return checksums, non_finite


def extra_checksum(extra: dict) -> str:
  """SHA-256 of the JSON of a checkpoint's ``extra`` item (data position, metrics window, ...): an edited one
  would resume other data without a word."""
  return hashlib.sha256(json.dumps(extra, sort_keys=True).encode()).hexdigest()
