"""Sequence helpers for teacher forcing."""
from __future__ import annotations

import jax.numpy as jnp


def shift_right(tokens, bos_id: int = 1, axis: int = 1):
  """Right-shift targets to make decoder inputs for teacher forcing.

  ``[y1, y2, ..., yn] -> [BOS, y1, ..., y(n-1)]``: the decoder at position ``i`` sees only targets before
  ``i`` and is trained to predict ``y_i``.

  Args:
    tokens: int ``[batch, length]`` (any rank; ``axis`` is the time axis).
    bos_id: the beginning-of-sequence id written at position 0.

  Returns:
    Same shape and dtype as ``tokens``.
  """
  padding = [(0, 0)] * tokens.ndim
  padding[axis] = (1, 0)
  padded = jnp.pad(tokens, padding, constant_values=bos_id)
  return jnp.take(padded, jnp.arange(tokens.shape[axis]), axis=axis)
