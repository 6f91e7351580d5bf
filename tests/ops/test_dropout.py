"""Inverted dropout: zero rate is the identity, the exact rate and expectation, masks broadcast as asked
(the CPU kernel's 8-bit masks: tests/ops/test_kernels.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops


def test_zero_rate_is_identity_without_a_key():
  x = jnp.arange(6.0).reshape(2, 3)
  assert ops.dropout(x, 0.0, None) is x


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.9])
def test_dropout_drops_at_exactly_the_rate_and_keeps_the_expectation(rate):
  """The reference mask is Bernoulli at ``rate`` itself (0.3 stays 0.3; the CPU kernel's 8-bit masks round it:
  tests/ops/test_kernels.py); survivors are scaled by exactly ``1 / (1 - rate)``."""
  y = np.asarray(ops.dropout(jnp.ones((400, 500), jnp.float32), rate, jax.random.key(4)))
  kept = y != 0
  np.testing.assert_allclose(y[kept], 1.0 / (1.0 - rate), rtol=1e-6)
  # 200k Bernoulli draws: the standard error of the dropped fraction is at most 0.0011; 0.3008 (the 8-bit
  # rate of 0.3) lies 0.7 standard errors away, so exactness is checked against a finer grid below.
  assert abs((y == 0).mean() - rate) < 0.005
  assert abs(y.mean() - 1.0) < 0.015


def test_dropout_rate_is_not_rounded_to_a_256th():
  """Over 16M draws (standard error 0.000115) the dropped fraction at 0.3 is within 4 standard errors of 0.3,
  which excludes the 8-bit kernel's 0.30078 (6.8 standard errors away)."""
  y = ops.dropout(jnp.ones((4000, 4000), jnp.float32), 0.3, jax.random.key(5))
  assert abs(float(jnp.mean(y == 0)) - 0.3) < 4 * 0.000115


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
