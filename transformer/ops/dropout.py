"""Dropout as a pure function of an explicit key."""
from __future__ import annotations

import jax
import jax.numpy as jnp

# Masks are drawn as 8-bit random integers, four per 32-bit draw (see random_bytes): a quarter of the
# threefry work of a float32 uniform draw. The drop probability is therefore ``rate`` rounded to a
# multiple of 1/256; the survivors are scaled by that rounded probability, so the expectation is kept
# exactly.
_MASK_LEVELS = 256


def random_bytes(rng, shape):
  """Uniform ``uint8`` of ``shape``, cut from 32-bit random words: one threefry evaluation per 4 bytes.

  ``jax.random.bits(rng, shape, jnp.uint8)`` evaluates threefry once per *element* when
  ``jax_threefry_partitionable`` is on (the default), so asking for bytes alone saves nothing.
  Words are drawn along the last axis (when it divides by 4), so the bytes keep the mask's layout.
  """
  shape = tuple(shape)
  if not shape or shape[-1] % 4:
    return jax.random.bits(rng, shape, jnp.uint8)
  words = jax.random.bits(rng, shape[:-1] + (shape[-1] // 4,), jnp.uint32)
  return jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(shape)  # [..., n // 4, 4] -> [..., n]


def _check_rate_and_key(what: str, rate: float, rng) -> None:
  """The one wording of both dropouts' argument errors: the bad value and the fix."""
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"{what} rate must be in [0, 1), got {rate}")
  if rng is None:
    raise ValueError(f"{what} with rate > 0 needs a key; pass one or set the rate to 0.")


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
  _check_rate_and_key("dropout", rate, rng)
  threshold = round(rate * _MASK_LEVELS)
  if threshold == 0:
    return x
  mask_shape = tuple(1 if axis in broadcast_dims else size for axis, size in enumerate(x.shape))
  with jax.named_scope("dropout"):  # names its ops in compiled HLO and profiles (benchmarks/step_profile.py)
    keep = random_bytes(rng, mask_shape) >= jnp.uint8(threshold)
    scale = _MASK_LEVELS / (_MASK_LEVELS - threshold)
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))


def token_dropout(tokens, rate: float, rng, replacement_id: int, keep_ids=()):
  """Word dropout (Sennrich et al. 2016; Gal & Ghahramani 2016): replace tokens by ``replacement_id``.

  A regulariser of the inputs, not the outputs: the model sees an unknown token where a word was and must
  rely on the rest of the sentence (and, on the decoder side, on the source rather than its own prefix).
  Nothing is rescaled.

  Args:
    tokens: int ``[batch, length]`` (any shape).
    rate: probability of replacing each token, in ``[0, 1)``; 0 returns ``tokens`` unchanged (no key needed).
    rng: a ``jax.random`` key, required when ``rate > 0``.
    replacement_id: the id written in place of a dropped token (e.g. the tokenizer's unknown id).
    keep_ids: ids never replaced (padding, end of sentence).
  """
  if rate == 0.0:
    return tokens
  _check_rate_and_key("token dropout", rate, rng)
  with jax.named_scope("dropout"):
    drop = jax.random.bernoulli(rng, rate, tokens.shape)
    for token_id in keep_ids:
      drop &= tokens != token_id
    return jnp.where(drop, jnp.asarray(replacement_id, tokens.dtype), tokens)
