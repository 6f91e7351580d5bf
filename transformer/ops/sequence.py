"""Sequence helpers for teacher forcing and packed rows."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def shift_right(tokens, bos_id: int = 1, axis: int = 1, segments=None):
  """Right-shift targets to make decoder inputs for teacher forcing.

  ``[y1, y2, ..., yn] -> [BOS, y1, ..., y(n-1)]``: the decoder at position ``i`` sees only targets before
  ``i`` and is trained to predict ``y_i``.

  Args:
    tokens: int ``[batch, length]`` (any rank; ``axis`` is the time axis).
    bos_id: the beginning-of-sequence id written at position 0.
    segments: packed rows: int ``[batch, length]`` segment ids (``segment_positions``); each segment then starts
      with ``bos_id`` instead of the previous segment's last token. ``axis`` must be the last axis.

  Returns:
    Same shape and dtype as ``tokens``.
  """
  padding = [(0, 0)] * tokens.ndim
  padding[axis] = (1, 0)
  padded = jnp.pad(tokens, padding, constant_values=bos_id)
  shifted = jnp.take(padded, jnp.arange(tokens.shape[axis]), axis=axis)
  if segments is None:
    return shifted
  if axis not in (-1, tokens.ndim - 1):
    raise ValueError(f"shift_right with segments shifts along the last axis, got axis={axis}")
  return jnp.where(segment_positions(segments) == 0, jnp.asarray(bos_id, tokens.dtype), shifted)


def segment_positions(segments):
  """Each position's index within its segment (example) in packed rows.

  Args:
    segments: int ``[batch, length]``: consecutive positions with the same id form one segment (padding, any
      id, forms one too).

  Returns:
    int32 ``[batch, length]``, 0 at each segment's first position: ``[[1, 1, 1, 2, 2, 0]] -> [[0, 1, 2, 0, 1, 0]]``.
  """
  segments = jnp.asarray(segments)
  index = jnp.broadcast_to(jnp.arange(segments.shape[-1], dtype=jnp.int32), segments.shape)
  previous = jnp.concatenate([jnp.full_like(segments[..., :1], -1), segments[..., :-1]], axis=-1)
  starts = jnp.where(segments != previous, index, 0)
  return index - jax.lax.cummax(starts, axis=segments.ndim - 1)
