"""Score functions against plain numpy loops, and the variance argument for the 1/sqrt(d_k) scale."""
import jax
import numpy as np
import pytest

from transformer import ops

BATCH, Q_LENGTH, KV_LENGTH, HEADS, DIM = 2, 3, 4, 2, 5


def _query_key(seed=0, d_query=DIM, d_key=DIM):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(BATCH, Q_LENGTH, HEADS, d_query)).astype(np.float32),
          rng.normal(size=(BATCH, KV_LENGTH, HEADS, d_key)).astype(np.float32))


def _loop_scores(query, key, score):
  """``out[b, h, i, j] = score(q[b, i, h], k[b, j, h], h)`` by explicit loops."""
  batch, q_length, heads, _ = query.shape
  out = np.zeros((batch, heads, q_length, key.shape[1]))
  for b in range(batch):
    for h in range(heads):
      for i in range(q_length):
        for j in range(key.shape[1]):
          out[b, h, i, j] = score(query[b, i, h].astype(np.float64), key[b, j, h].astype(np.float64), h)
  return out


@pytest.mark.parametrize("scale, factor", [(True, DIM ** -0.5), (False, 1.0), (0.25, 0.25)])
def test_dot_product_scores_match_loop(scale, factor):
  query, key = _query_key()
  scores = ops.dot_product_scores(query, key, scale=scale)
  assert scores.shape == (BATCH, HEADS, Q_LENGTH, KV_LENGTH)
  np.testing.assert_allclose(scores, _loop_scores(query, key, lambda q, k, h: factor * q @ k), rtol=1e-5,
                             atol=1e-5)


def test_bfloat16_scores_are_float32_logits_within_bfloat16_rounding():
  # The scale is applied to the bfloat16 query (d_k = 5: 1/sqrt(5) is not a power of 2, so q is rounded once
  # more); the logits still come back in float32 and within a few bfloat16 ulps of the exact dot products.
  query, key = _query_key(seed=3)
  query16, key16 = (jax.numpy.asarray(x, jax.numpy.bfloat16) for x in (query, key))
  logits = ops.dot_product_scores(query16, key16)
  assert logits.dtype == jax.numpy.float32
  exact = _loop_scores(np.asarray(query16, np.float32), np.asarray(key16, np.float32),
                       lambda q, k, h: DIM ** -0.5 * q @ k)
  bound = 2 * 2.0 ** -8 * (DIM ** -0.5) * _loop_scores(np.abs(np.asarray(query16, np.float32)),
                                                       np.abs(np.asarray(key16, np.float32)), lambda q, k, h: q @ k)
  assert np.all(np.abs(np.asarray(logits) - exact) <= bound + 1e-6)


def test_luong_dot_scores_are_unscaled_dot_products():
  query, key = _query_key(1)
  np.testing.assert_allclose(ops.luong_dot_scores(query, key), _loop_scores(query, key, lambda q, k, h: q @ k),
                             rtol=1e-5, atol=1e-5)


def test_general_scores_with_shared_weight_match_loop():
  query, key = _query_key(2, d_query=3, d_key=DIM)
  weight = np.random.default_rng(3).normal(size=(3, DIM)).astype(np.float32)
  np.testing.assert_allclose(ops.general_scores(query, key, weight),
                             _loop_scores(query, key, lambda q, k, h: q @ weight @ k), rtol=1e-5, atol=1e-5)


def test_general_scores_with_per_head_weight_match_loop():
  query, key = _query_key(4, d_query=3, d_key=DIM)
  weight = np.random.default_rng(5).normal(size=(HEADS, 3, DIM)).astype(np.float32)
  np.testing.assert_allclose(ops.general_scores(query, key, weight),
                             _loop_scores(query, key, lambda q, k, h: q @ weight[h] @ k), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.1])
def test_cosine_scores_match_loop(temperature):
  query, key = _query_key(6)
  cosine = lambda q, k, h: q @ k / (np.linalg.norm(q) * np.linalg.norm(k)) / temperature
  scores = ops.cosine_scores(query, key, temperature=temperature)
  np.testing.assert_allclose(scores, _loop_scores(query, key, cosine), rtol=1e-5, atol=1e-5)
  assert np.abs(scores).max() <= 1.0 / temperature + 1e-5


def test_additive_scores_match_loop():
  query, key = _query_key(7, d_query=3, d_key=DIM)
  rng = np.random.default_rng(8)
  query_weight = rng.normal(size=(3, 6)).astype(np.float32)
  key_weight = rng.normal(size=(DIM, 6)).astype(np.float32)
  score_vector = rng.normal(size=6).astype(np.float32)
  additive = lambda q, k, h: score_vector @ np.tanh(q @ query_weight + k @ key_weight)
  np.testing.assert_allclose(ops.additive_scores(query, key, query_weight, key_weight, score_vector),
                             _loop_scores(query, key, additive), rtol=1e-5, atol=1e-5)


def test_scale_keeps_logit_variance_near_one():
  """With unit-variance q and k, var(q.k) = d_k and var(q.k / sqrt(d_k)) = 1 (Vaswani et al., footnote 4)."""
  d_k, samples = 64, 20000
  query_key = jax.random.normal(jax.random.key(0), (2, samples, 1, 1, d_k))
  query, key = query_key[0], query_key[1]  # independent pairs: [samples, 1, 1, d_k]
  unscaled = np.asarray(ops.dot_product_scores(query, key, scale=False)).ravel()
  scaled = np.asarray(ops.dot_product_scores(query, key, scale=True)).ravel()
  # The variance estimate's relative standard error is ~sqrt(2 / samples) = 1%; a wrong scale (none,
  # 1/d_k, or 1/d_k^(1/4)) is off by a factor of 2.8 or more.
  np.testing.assert_allclose(unscaled.var(), d_k, rtol=0.1)
  np.testing.assert_allclose(scaled.var(), 1.0, rtol=0.1)


def test_scores_feed_the_attention_core():
  """A non-dot score goes through the same masked softmax: rows sum to 1 over unmasked keys."""
  query, key = _query_key(9)
  mask = ops.make_attention_mask(np.ones((BATCH, Q_LENGTH), bool), np.array([[1, 1, 0, 1], [1, 0, 0, 0]], bool))
  weights = np.asarray(ops.attention_weights(ops.cosine_scores(query, key), mask))
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
  assert (weights[0, :, :, 2] == 0).all() and (weights[1, :, :, 1:] == 0).all()
