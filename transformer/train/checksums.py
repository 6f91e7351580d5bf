"""Checksums of what a checkpoint holds: every array of the state, and the JSON ``extra`` item (data position,
metrics window), so that flipped bits or an edited position are caught on restore instead of resumed silently.

The arrays are fingerprinted where they live (``state_fingerprints``): one compiled program hashes every leaf on
its devices, every shard of a sharded leaf included, and only 8 bytes per leaf come to the host, so a save
copies nothing to the host for its checks (orbax's writer copies in the background). A fingerprint is a sum
over elements of a mixed hash of (bits, global position), modulo 2**32, in two independent lanes: the same for
any sharding or number of devices, and changed by any flipped bit or moved value. Checkpoints written before
fingerprints carry SHA-256 digests of each leaf's bytes (``state_checksums``), still verified on restore.
"""
from __future__ import annotations

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

# Odd multipliers of the two lanes' position mixing and of murmur3's finaliser.
_LANES = (0x9E3779B1, 0x85EBCA77)
_FINAL = (0x85EBCA6B, 0xC2B2AE35)


def _words(leaf) -> jax.Array:
  """``leaf``'s bits as a flat uint32 array (narrower types widened, 64-bit ones split in two words)."""
  if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(leaf)
  if leaf.dtype == jnp.bool_:
    leaf = leaf.astype(jnp.uint8)
  width = leaf.dtype.itemsize
  if width == 8:
    return jax.lax.bitcast_convert_type(leaf, jnp.uint32).reshape(-1)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[width]
  return jax.lax.bitcast_convert_type(leaf, unsigned).reshape(-1).astype(jnp.uint32)


def _fingerprint(leaf) -> tuple[jax.Array, jax.Array]:
  """``(lanes, non_finite)``: uint32 ``[2]`` fingerprint of ``leaf`` and whether a float leaf holds NaN/inf."""
  words = _words(leaf)
  position = jnp.arange(words.shape[0], dtype=jnp.uint32)
  lanes = []
  for multiplier in _LANES:
    mixed = words ^ (position * jnp.uint32(multiplier) + jnp.uint32(multiplier >> 7))
    mixed = (mixed ^ (mixed >> 16)) * jnp.uint32(_FINAL[0])
    mixed = (mixed ^ (mixed >> 13)) * jnp.uint32(_FINAL[1])
    lanes.append(jnp.sum(mixed ^ (mixed >> 16), dtype=jnp.uint32))
  inexact = jnp.issubdtype(leaf.dtype, jnp.inexact)
  return jnp.stack(lanes), (~jnp.all(jnp.isfinite(leaf))) if inexact else jnp.zeros((), bool)


@jax.jit
def _fingerprint_leaves(leaves):
  """uint32 ``[leaves, 2]`` and bool ``[leaves]`` of ``_fingerprint`` for every leaf, in one program."""
  lanes, non_finite = zip(*(_fingerprint(leaf) for leaf in leaves))
  return jnp.stack(lanes), jnp.stack(non_finite)


def _on_host(array) -> np.ndarray:
  """A small result of the devices on this host (gathered from every process when it spans several)."""
  if isinstance(array, jax.Array) and not array.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
  return np.asarray(array)


def _dtype_name(leaf) -> str:
  return "key" if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) else np.dtype(leaf.dtype).str


def state_fingerprints(state) -> tuple[dict[str, str], list[str]]:
  """``(fingerprints, non_finite)``: ``"<dtype><shape>:<16 hex digits>"`` of each array leaf by tree path,
  computed on the leaves' devices (every process of a multi-process run calls it, like a save), and the paths
  of floating-point leaves holding a NaN or infinity."""
  named = [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(state)
           if hasattr(leaf, "dtype") and hasattr(leaf, "shape")]
  if not named:
    return {}, []
  lanes, non_finite = _fingerprint_leaves([leaf for _, leaf in named])
  lanes, non_finite = _on_host(lanes), _on_host(non_finite)
  fingerprints = {name: f"{_dtype_name(leaf)}{tuple(leaf.shape)}:{int(lane[0]):08x}{int(lane[1]):08x}"
                  for (name, leaf), lane in zip(named, lanes)}
  return fingerprints, [name for (name, _), bad in zip(named, non_finite) if bad]


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
