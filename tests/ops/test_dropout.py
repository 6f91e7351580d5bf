"""Inverted dropout: zero rate is the identity, the expectation is kept, masks broadcast as asked."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops


def test_zero_rate_is_identity_without_a_key():
  x = jnp.arange(6.0).reshape(2, 3)
  assert ops.dropout(x, 0.0, None) is x


def test_dropout_keeps_expectation_and_drops_at_the_rate():
  rate = 0.3
  x = jnp.ones((200, 500), jnp.float32)
  y = np.asarray(ops.dropout(x, rate, jax.random.key(0)))
  kept = y != 0
  applied = ops.effective_dropout_rate(rate)  # a multiple of 1/256 (8-bit masks)
  assert abs(applied - rate) <= 1 / 512
  # Survivors are scaled by exactly 1 / (1 - applied rate), so the expectation is exactly kept.
  np.testing.assert_allclose(y[kept], 1.0 / (1.0 - applied), rtol=1e-6)
  # 100k Bernoulli draws: the standard error of the kept fraction is ~0.0015.
  assert abs(kept.mean() - (1.0 - rate)) < 0.01
  assert abs(y.mean() - 1.0) < 0.015


def test_dropout_is_a_function_of_the_key():
  x = jnp.ones((8, 8))
  a = ops.dropout(x, 0.5, jax.random.key(1))
  np.testing.assert_array_equal(a, ops.dropout(x, 0.5, jax.random.key(1)))
  assert not np.array_equal(a, ops.dropout(x, 0.5, jax.random.key(2)))


def test_broadcast_dims_share_one_mask():
  y = np.asarray(ops.dropout(jnp.ones((3, 4, 50)), 0.5, jax.random.key(3), broadcast_dims=(0, 1)))
  for b in range(3):
    for h in range(4):
      np.testing.assert_array_equal(y[b, h], y[0, 0])
  assert 0 < (y[0, 0] == 0).sum() < 50


def test_bad_rate_or_missing_key_is_an_error():
  with pytest.raises(ValueError, match=r"\[0, 1\)"):
    ops.dropout(jnp.ones(3), 1.0, jax.random.key(0))
  with pytest.raises(ValueError, match="dropout with rate > 0 needs a key"):
    ops.dropout(jnp.ones(3), 0.1, None)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_effective_rate_is_the_nearest_multiple_of_a_256th(rate):
  applied = ops.effective_dropout_rate(rate)
  assert applied * 256 == round(applied * 256) and abs(applied - rate) <= 1 / 512
  y = np.asarray(ops.dropout(jnp.ones((400, 500)), rate, jax.random.key(4)))
  assert abs((y == 0).mean() - applied) < 0.005  # 200k draws: standard error <= 0.0012


def test_token_dropout_replaces_at_the_rate_and_never_touches_kept_ids():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 50, size=(200, 400)).astype(np.int32)  # ids 0 (pad) and 2 (eos) among them
  dropped = np.asarray(ops.token_dropout(jnp.asarray(tokens), 0.2, jax.random.key(1), replacement_id=3,
                                         keep_ids=(0, 2)))
  assert dropped.dtype == tokens.dtype and dropped.shape == tokens.shape
  changed = dropped != tokens
  kept = np.isin(tokens, (0, 2))
  assert not changed[kept].any()
  assert (dropped[changed] == 3).all()
  # Droppable tokens that were already 3 cannot show a change; count replacements among the others.
  eligible = ~kept & (tokens != 3)
  assert abs(changed[eligible].mean() - 0.2) < 0.01  # ~77k draws: standard error ~0.0015


def test_token_dropout_zero_rate_is_identity_and_errors_are_clear():
  tokens = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
  assert ops.token_dropout(tokens, 0.0, None, replacement_id=3) is tokens
  with pytest.raises(ValueError, match="needs a key"):
    ops.token_dropout(tokens, 0.1, None, replacement_id=3)
  with pytest.raises(ValueError, match=r"in \[0, 1\)"):
    ops.token_dropout(tokens, 1.0, jax.random.key(0), replacement_id=3)


@pytest.mark.parametrize("shape", [(64, 4096), (3, 50, 7)])  # four bytes per 32-bit word, and the fallback
def test_random_bytes_are_uniform_and_independent(shape):
  from transformer.ops.dropout import random_bytes
  draws = np.asarray(random_bytes(jax.random.key(3), shape))
  assert draws.dtype == np.uint8 and draws.shape == shape
  counts = np.bincount(draws.ravel(), minlength=256)
  expected = draws.size / 256
  chi_square = ((counts - expected) ** 2 / expected).sum()
  assert chi_square < 255 + 5 * np.sqrt(2 * 255)  # 255 degrees of freedom: mean 255, sd ~22.6
  # Bytes cut from one word must not be related: neighbours along the last axis are uncorrelated.
  flat = draws.reshape(-1, shape[-1]).astype(np.float64)
  correlation = np.corrcoef(flat[:, :-1].ravel(), flat[:, 1:].ravel())[0, 1]
  assert abs(correlation) < 5 / np.sqrt(flat[:, 1:].size)
  assert not np.array_equal(draws, np.asarray(random_bytes(jax.random.key(4), shape)))
