"""Positional information: sinusoidal encoding, rotary embedding, embedding scaling; each token's position within
its segment of a packed row (``segment_positions``), and teacher forcing's shift by one position (``shift_right``).

A learned position table is a parameter, so it lives in ``transformer.nn`` (``PositionEmbedding``), which
simply indexes it; "none" adds nothing (the ablation).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def sinusoidal_position_encoding(positions, d_model: int, max_timescale: float = 10000.0, dtype=jnp.float32):
  """The paper's encoding (Vaswani et al. 2017, section 3.5).

  ``PE(pos, 2i) = sin(pos / 10000^(2i/d_model))`` and ``PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))``:
  sine on even features, cosine on odd ones, so each (2i, 2i+1) pair rotates with position and
  ``PE(pos + k)`` is a fixed linear map (2x2 rotation blocks) of ``PE(pos)``.

  Args:
    positions: an int array of any shape ``[...]`` (a 0-d array is one position), or a Python ``int`` ``n``,
      which means the ``n`` positions ``0 .. n-1`` (``jnp.arange(n)``), the usual call for a sequence of
      length ``n``. A numpy integer scalar, a bool, a float or a negative int is refused: each reads as
      either meaning, so pass ``int(n)`` or an array.
    d_model: feature size (odd sizes drop the last cosine).
    max_timescale: the 10000 of the formula.

  Returns:
    ``[..., d_model]`` (``[n, d_model]`` for an int ``n``).
  """
  if isinstance(positions, (list, tuple)):
    positions = np.asarray(positions)
  if isinstance(positions, (bool, float, np.generic)) or (
      not isinstance(positions, int) and not jnp.issubdtype(jnp.result_type(positions), jnp.integer)):
    given = (f"{positions!r} ({type(positions).__name__})" if jnp.ndim(positions) == 0 else
             f"an array of {jnp.result_type(positions)} and shape {jnp.shape(positions)}")
    raise ValueError(f"positions must be an int (a length n: positions 0..n-1) or an int array of positions, "
                     f"got {given}; pass int(n) for 0..n-1, or an int array (.astype(jnp.int32)).")
  if isinstance(positions, int):
    if positions < 0:
      raise ValueError(f"positions={positions}: an int is a number of positions 0..n-1, so it must be >= 0.")
    positions = jnp.arange(positions)
  positions = jnp.asarray(positions, jnp.float32)
  num_frequencies = (d_model + 1) // 2
  frequencies = max_timescale ** (-2.0 * jnp.arange(num_frequencies, dtype=jnp.float32) / d_model)
  angles = positions[..., None] * frequencies  # [..., d_model / 2]
  interleaved = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., d_model / 2, 2]
  return interleaved.reshape(*angles.shape[:-1], 2 * num_frequencies)[..., :d_model].astype(dtype)


def apply_rotary_embedding(x, positions, max_timescale: float = 10000.0):
  """Rotary position embedding (Su et al. 2021), applied to queries or keys.

  Feature ``i`` and ``i + head_dim/2`` form a pair rotated by ``position * 10000^(-2i/head_dim)``, so
  ``rotary(q, m) . rotary(k, n)`` depends on positions only through ``m - n``.

  Args:
    x: ``[batch, length, heads, head_dim]`` with an even ``head_dim``.
    positions: ``[batch, length]`` or ``[length]`` int positions.

  Returns:
    ``[batch, length, heads, head_dim]`` in ``x``'s dtype.
  """
  head_dim = x.shape[-1]
  if head_dim % 2:
    raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
  half = head_dim // 2
  frequencies = max_timescale ** (-2.0 * jnp.arange(half, dtype=jnp.float32) / head_dim)
  positions = jnp.asarray(positions, jnp.float32)
  if positions.ndim == 1:
    positions = positions[None]
  angles = positions[:, :, None, None] * frequencies  # [batch, length, 1, half]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  first, second = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  rotated = jnp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)
  return rotated.astype(x.dtype)


def scale_embeddings(embeddings, d_model: int):
  """Multiply embeddings by ``sqrt(d_model)`` (Vaswani et al., section 3.4).

  With embeddings initialised at scale ``1/sqrt(d_model)`` (as when shared with the output projection),
  this brings them to unit scale, comparable to the positional encoding added next.
  """
  return embeddings * jnp.asarray(d_model ** 0.5, embeddings.dtype)


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
