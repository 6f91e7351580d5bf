"""Dropout as a pure function of an explicit key."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def dropout(x, rate: float, rng, broadcast_dims=()):
  """Inverted dropout: zero entries with probability ``rate``, scale the rest by ``1 / (1 - rate)``.

  Args:
    x: any shape.
    rate: drop probability in ``[0, 1)``; 0 returns ``x`` unchanged (no key needed).
    rng: a ``jax.random`` key, required when ``rate > 0``.
    broadcast_dims: axes along which one mask is shared (e.g. ``(0, 1)`` for the same mask over batch and heads).
  """
  if rate == 0.0:
    return x
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
  if rng is None:
    raise ValueError("dropout with rate > 0 needs a dropout_rng key; pass one or set the rate to 0.")
  mask_shape = tuple(1 if axis in broadcast_dims else size for axis, size in enumerate(x.shape))
  keep = jax.random.bernoulli(rng, 1.0 - rate, mask_shape)
  return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))
