"""Attention masks.

Convention: a mask is boolean, ``True`` where a query may attend to a key, with shape
``[batch, heads, q_length, kv_length]`` (any of the leading axes may be 1 and broadcast).
This is the convention of ``jax.nn.dot_product_attention`` and ``flax.linen.attention``.
"""
from __future__ import annotations

import operator

import jax
import jax.numpy as jnp

# Masked logits are set to this value rather than -inf: a row with every key masked then gives a finite
# softmax (which we zero out) instead of NaN, and gradients stay finite. exp(-1e9 - x) is exactly 0 in
# float32 for any realistic logit x, so partially masked rows are unaffected.
MASK_VALUE = -1e9


def make_attention_mask(query_valid, key_valid):
  """Pairwise mask from per-position validity.

  Args:
    query_valid: ``[batch, q_length]`` bool (or 0/1), True at real query positions.
    key_valid: ``[batch, kv_length]`` bool (or 0/1), True at real key positions.

  Returns:
    ``[batch, 1, q_length, kv_length]`` bool mask, True where both are valid.
  """
  query_valid = jnp.asarray(query_valid, bool)
  key_valid = jnp.asarray(key_valid, bool)
  return (query_valid[:, None, :, None] & key_valid[:, None, None, :])


def make_segment_mask(query_segments, key_segments):
  """Mask of packed rows: a query sees only the keys of its own segment (example).

  Args:
    query_segments: ``[batch, q_length]`` int segment ids: consecutive positions of one example share an id.
    key_segments: ``[batch, kv_length]`` int, the keys' ids (the source's, for cross attention: a target
      segment reads the source segment with the same id).

  Returns:
    ``[batch, 1, q_length, kv_length]`` bool mask, True where the ids are equal (padding is for the validity
    masks to hide).
  """
  return jnp.asarray(query_segments)[:, None, :, None] == jnp.asarray(key_segments)[:, None, None, :]


def make_padding_mask(query_tokens, key_tokens=None, pad_id: int = 0):
  """Mask that hides padding tokens (``pad_id``) on either side.

  Args:
    query_tokens: ``[batch, q_length]`` int token ids.
    key_tokens: ``[batch, kv_length]`` int token ids; defaults to ``query_tokens`` (self attention).
    pad_id: the padding id.

  Returns:
    ``[batch, 1, q_length, kv_length]`` bool mask.
  """
  if key_tokens is None:
    key_tokens = query_tokens
  return make_attention_mask(query_tokens != pad_id, key_tokens != pad_id)


def make_causal_mask(length: int, kv_length: int | None = None, offset: int = 0):
  """Lower-triangular mask: query ``i`` sees keys ``j <= i + offset``.

  Args:
    length: number of queries, a static int: the mask's shape depends on it, so under ``jax.jit`` it comes
      from an array's shape (``x.shape[1]``) or a static argument, never from a traced value.
    kv_length: number of keys (defaults to ``length``), static as ``length``.
    offset: position of the first query among the keys (used by cached decoding); may be traced.

  Returns:
    ``[1, 1, length, kv_length]`` bool mask.

  Raises:
    ValueError: a ``length`` or ``kv_length`` that is negative (``jnp.arange`` would make an empty mask of it),
      not an integer, or traced.
  """
  kv_length = length if kv_length is None else kv_length
  _check_lengths(length, kv_length)
  query_position = jnp.arange(length)[:, None] + offset
  key_position = jnp.arange(kv_length)[None, :]
  return (key_position <= query_position)[None, None]


def _check_lengths(length, kv_length) -> None:
  """A ValueError naming a number of queries or keys that is traced, not an integer, or negative."""
  for name, value in (("length", length), ("kv_length", kv_length)):
    if jax.export.is_symbolic_dim(value):  # a shape of jax.export's (``target_length``): static, its value later
      continue
    if isinstance(value, jax.core.Tracer):
      raise ValueError(f"a mask's {name} must be a static int (the mask's shape depends on it), got a traced "
                       f"value {value.aval}: under jax.jit take it from an array's shape (x.shape[1]) or pass "
                       "it as a static argument (static_argnums).")
    try:
      value = operator.index(value)  # an int, numpy integer or concrete 0-d integer array; never a float
    except TypeError:
      raise ValueError(f"a mask's {name} must be a static int number of positions, got {value!r} "
                       f"({type(value).__name__}).") from None
    if value < 0:
      raise ValueError(f"a mask's {name} is a number of positions, >= 0; got {value}.")


def _may_equal(size, wanted) -> bool:
  """Whether two axis sizes can be equal: a comparison of ``jax.export``'s symbolic dimensions that cannot be
  decided before their values are known is not refused."""
  try:
    return bool(size == wanted)
  except Exception:  # jax's InconclusiveDimensionOperation
    return True


def check_mask_shape(name: str, shape, expected) -> None:
  """A ValueError naming ``name`` (``mask``, ``bias``) unless an array of ``shape`` broadcasts to ``expected``
  ``[batch, heads, q_length, kv_length]``: checked from static shapes, so at trace time under ``jax.jit``."""
  shape, expected = tuple(shape), tuple(expected)
  axes = ("batch", "heads", "q_length", "kv_length")
  if len(shape) > len(expected):
    raise ValueError(f"{name} has shape {shape}, more axes than [batch, heads, q_length, kv_length] = "
                     f"{expected}.")
  for axis, size, wanted in zip(axes[len(axes) - len(shape):], shape, expected[len(expected) - len(shape):]):
    if not (_may_equal(size, 1) or _may_equal(size, wanted)):
      raise ValueError(f"{name} has shape {shape}, which does not broadcast to [batch, heads, q_length, "
                       f"kv_length] = {expected}: its {axis} axis is {size}, expected {wanted} (or 1); "
                       "make_attention_mask(query_valid, key_valid) builds one of [batch, q_length] and "
                       "[batch, kv_length] validities.")


def check_per_position(name: str, values, batch: int, length: int) -> None:
  """A ValueError naming ``name`` (``query_valid``, ``key_segments``, ...) unless ``values`` is None or of
  shape ``[batch, length]``, the one mask value per position of a query or key."""
  if values is not None and not all(map(_may_equal, jnp.shape(values), (batch, length))):
    raise ValueError(f"{name} must be [batch, length] = {(batch, length)}, got shape {jnp.shape(values)}")


def make_local_mask(length: int, window: int, kv_length: int | None = None, offset=0):
  """Sliding-window (local) mask: query ``i`` sees keys ``j`` with ``|i + offset - j| < window``.

  With ``make_causal_mask`` (``combine_masks``) each query sees itself and the ``window - 1`` keys before it
  (Longformer's and Mistral's causal sliding window); alone, ``window - 1`` keys on either side.

  Args:
    length: number of queries.
    window: positive number of keys on one side, the query's own position included.
    kv_length: number of keys (defaults to ``length``).
    offset: position of the first query among the keys (may be traced: cached decoding).

  Returns:
    ``[1, 1, length, kv_length]`` bool mask.
  """
  if window < 1:
    raise ValueError(f"a local attention window must be a positive number of keys, got {window}")
  kv_length = length if kv_length is None else kv_length
  _check_lengths(length, kv_length)
  distance = jnp.arange(length)[:, None] + offset - jnp.arange(kv_length)[None, :]
  return (jnp.abs(distance) < window)[None, None]


def combine_masks(*masks):
  """Logical AND of masks, ignoring ``None``; ``None`` if all are ``None``.

  Every mask is broadcast to a common ``[batch, heads, q_length, kv_length]`` shape.
  """
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  for m in masks:
    if m.ndim != masks[0].ndim:
      raise ValueError(f"masks must have the same rank, got shapes {[m.shape for m in masks]}")
  combined = jnp.asarray(masks[0], bool)
  for m in masks[1:]:
    combined = jnp.logical_and(combined, jnp.asarray(m, bool))
  return combined
