"""Dropout as a pure function of an explicit key."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer.ops.kernels import REFERENCE, Kernels


def _check_rate_and_key(what: str, rate: float, rng) -> None:
  """The one wording of both dropouts' argument errors: the bad value and the fix."""
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"{what} rate must be in [0, 1), got {rate}")
  if rng is None:
    raise ValueError(f"{what} with rate > 0 needs a key; pass one or set the rate to 0.")


def dropout(x, rate: float, rng, broadcast_dims=(), kernels: Kernels | None = None):
  """Inverted dropout: zero entries with probability ``rate``, scale the rest by ``1 / (1 - rate)``.

  Args:
    x: any shape.
    rate: drop probability in ``[0, 1)``; 0 returns ``x`` unchanged (no key needed).
    rng: a ``jax.random`` key, required when ``rate > 0``.
    broadcast_dims: axes along which one mask is shared (e.g. ``(0, 1)`` for the same mask over batch and heads).
    kernels: a backend-tuned mask (``kernels.py``; on CPU 8-bit draws at ``kernels.effective_dropout_rate``);
      None for a Bernoulli mask at exactly ``rate``.
  """
  if rate == 0.0:
    return x
  _check_rate_and_key("dropout", rate, rng)
  kernels = kernels or REFERENCE
  if kernels.dropout is not None:
    return kernels.dropout(x, rate, rng, broadcast_dims)
  mask_shape = tuple(1 if axis in broadcast_dims else size for axis, size in enumerate(x.shape))
  with jax.named_scope("dropout"):  # names its ops in compiled HLO and profiles (benchmarks/step_profile.py)
    keep = jax.random.bernoulli(rng, 1.0 - rate, mask_shape)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


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
