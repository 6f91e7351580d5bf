"""Dropout as a pure function of an explicit key."""
from __future__ import annotations

import jax
import jax.numpy as jnp

# Masks are drawn as 8-bit random integers, a quarter of the random bits of a float32 uniform draw (the
# train step of the small translation model runs about 10% faster on CPU). The drop probability is
# therefore ``rate`` rounded to a multiple of 1/256; the survivors are scaled by that rounded probability,
# so the expectation is kept exactly.
_MASK_LEVELS = 256


def effective_dropout_rate(rate: float) -> float:
  """The drop probability :func:`dropout` applies for ``rate``: the nearest multiple of 1/256 (within 0.002)."""
  return round(rate * _MASK_LEVELS) / _MASK_LEVELS


def dropout(x, rate: float, rng, broadcast_dims=()):
  """Inverted dropout: zero entries with probability ``rate``, scale the rest by ``1 / (1 - rate)``.

  Args:
    x: any shape.
    rate: drop probability in ``[0, 1)``; 0 returns ``x`` unchanged (no key needed). Applied as
      :func:`effective_dropout_rate` (a multiple of 1/256; below 1/512 that is 0).
    rng: a ``jax.random`` key, required when ``rate > 0``.
    broadcast_dims: axes along which one mask is shared (e.g. ``(0, 1)`` for the same mask over batch and heads).
  """
  if rate == 0.0:
    return x
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
  if rng is None:
    raise ValueError("dropout with rate > 0 needs a dropout_rng key; pass one or set the rate to 0.")
  threshold = round(rate * _MASK_LEVELS)
  if threshold == 0:
    return x
  mask_shape = tuple(1 if axis in broadcast_dims else size for axis, size in enumerate(x.shape))
  with jax.named_scope("dropout"):  # names its ops in compiled HLO and profiles (benchmarks/step_profile.py)
    keep = jax.random.bits(rng, mask_shape, jnp.uint8) >= jnp.uint8(threshold)
    scale = _MASK_LEVELS / (_MASK_LEVELS - threshold)
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))
