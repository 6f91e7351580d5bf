"""Sampling: t5x's cases (a one-hot distribution, zero temperature, EOS then padding), top-k and top-p
supports, the same key giving the same samples, and log-probabilities checked by a numpy walk."""
import functools

import jax
import numpy as np
import pytest

from tests.decode import BOS, EOS, PAD, markov_cache, markov_step_fn, normalize
from transformer.decode import greedy_search, sample, top_k_logits, top_p_logits

VOCAB, MAX_LENGTH = 6, 5


@functools.partial(jax.jit, static_argnames=("temperature", "top_k", "top_p", "num_samples", "max_length"))
def _sample(log_probs, context, rng, *, temperature=1.0, top_k=0, top_p=1.0, num_samples=1, max_length=MAX_LENGTH):
  return sample(markov_step_fn(log_probs), markov_cache(context), context.shape[0], max_length, BOS, EOS, PAD,
                rng=rng, temperature=temperature, top_k=top_k, top_p=top_p, num_samples=num_samples)


def _random_chain(seed, scale=2.0):
  return normalize(scale * np.random.default_rng(seed).normal(size=(VOCAB,) * 3))


def _numpy_log_prob(log_probs, context, tokens):
  """log P of ``tokens`` up to and including the first EOS under the order-2 chain."""
  history, total = [context, BOS], 0.0
  for token in tokens:
    total += log_probs[history[-2], history[-1], token]
    history.append(token)
    if token == EOS:
      break
  return total


def test_one_hot_distribution_is_sampled_exactly():
  """t5x: a distribution with all mass on one token gives that token whatever the key."""
  chain = np.full((VOCAB, VOCAB), -1e9)
  chain[:, 3] = 0.0  # always token 3
  for seed in range(3):
    sequences, _ = _sample(chain, np.zeros(2, np.int32), jax.random.key(seed), num_samples=2)
    np.testing.assert_array_equal(sequences, np.full((2, 2, MAX_LENGTH), 3))


@pytest.mark.parametrize("seed", range(2))
def test_zero_temperature_is_greedy(seed):
  chain, context = _random_chain(seed), np.arange(4, dtype=np.int32) % VOCAB
  sequences, log_probs = _sample(chain, context, jax.random.key(seed), temperature=0.0)
  greedy, greedy_log_probs = greedy_search(markov_step_fn(chain), markov_cache(context), 4, MAX_LENGTH, BOS, EOS, PAD)
  np.testing.assert_array_equal(sequences[:, 0], greedy)
  np.testing.assert_allclose(log_probs[:, 0], greedy_log_probs, rtol=1e-5)
  np.testing.assert_allclose(greedy_log_probs, [_numpy_log_prob(chain, c, g) for c, g in zip(context, np.asarray(greedy))],
                             rtol=1e-5)


def test_eos_then_padding_and_exact_log_probs():
  """After EOS every token is PAD (t5x), and the returned score is the sequence's log P under the model
  (temperature 1, no cut), EOS included, whatever temperature drew it."""
  chain = _random_chain(5, scale=1.0)
  chain[..., EOS] += 1.0  # EOS often, so both ended and cut-off samples occur
  chain = normalize(chain)
  context = np.arange(8, dtype=np.int32) % VOCAB
  sequences, log_probs = map(np.asarray, _sample(chain, context, jax.random.key(1), temperature=0.7, num_samples=4,
                                                  max_length=8))
  ended = 0
  for row, before in enumerate(context):
    for tokens, log_prob in zip(sequences[row], log_probs[row]):
      eos = np.flatnonzero(tokens == EOS)
      if eos.size:
        ended += 1
        assert np.all(tokens[eos[0] + 1:] == PAD)
      np.testing.assert_allclose(log_prob, _numpy_log_prob(chain, before, tokens), rtol=1e-4)
  assert 0 < ended < sequences.shape[0] * sequences.shape[1]


def test_same_key_same_samples_other_key_other_samples():
  chain, context = _random_chain(3, scale=0.3), np.zeros(4, np.int32)
  first = _sample(chain, context, jax.random.key(7), num_samples=3)[0]
  np.testing.assert_array_equal(first, _sample(chain, context, jax.random.key(7), num_samples=3)[0])
  assert not np.array_equal(first, _sample(chain, context, jax.random.key(8), num_samples=3)[0])
  assert len({tuple(s) for s in np.asarray(first).reshape(-1, MAX_LENGTH)}) > 1  # samples of one input differ


@pytest.mark.slow
def test_first_tokens_follow_the_tempered_and_cut_distribution():
  """10000 first tokens: frequencies match softmax(logits / T) restricted to the top-k or the nucleus."""
  logits = np.log(np.array([0.0, 0.0, 0.05, 0.1, 0.25, 0.6]) + 1e-30)
  chain = np.tile(logits, (VOCAB, 1))
  context = np.zeros(10000, np.int32)

  def frequencies(**settings):
    sequences, _ = _sample(chain, context, jax.random.key(0), max_length=1, **settings)
    return np.bincount(np.asarray(sequences[:, 0, 0]), minlength=VOCAB) / len(context)

  def expected(temperature=1.0, keep=None):
    p = np.exp((logits - logits.max()) / temperature)
    if keep is not None:
      p = np.where(np.isin(np.arange(VOCAB), keep), p, 0.0)
    return p / p.sum()

  np.testing.assert_allclose(frequencies(), expected(), atol=0.02)
  np.testing.assert_allclose(frequencies(temperature=2.0), expected(2.0), atol=0.02)
  np.testing.assert_allclose(frequencies(top_k=2), expected(keep=[4, 5]), atol=0.02)
  np.testing.assert_allclose(frequencies(top_p=0.8), expected(keep=[4, 5]), atol=0.02)  # 0.6 < 0.8 <= 0.85
  np.testing.assert_allclose(frequencies(top_p=0.9), expected(keep=[3, 4, 5]), atol=0.02)


def test_top_k_and_top_p_keep_the_expected_support():
  logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]]))
  np.testing.assert_array_equal(np.isfinite(top_k_logits(logits, 2)), [[0, 0, 1, 1], [1, 1, 1, 1]])  # ties kept
  np.testing.assert_array_equal(np.isfinite(top_p_logits(logits, 0.5)), [[0, 0, 1, 1], [1, 0, 0, 0]])
  np.testing.assert_array_equal(np.isfinite(top_p_logits(logits, 1e-6)), [[0, 0, 0, 1], [1, 0, 0, 0]])


@pytest.mark.parametrize("settings, message", [({"temperature": -1.0}, "temperature"), ({"top_k": -1}, "top_k"),
                                               ({"top_p": 0.0}, "top_p"), ({"num_samples": 0}, "num_samples")])
def test_bad_settings_are_refused(settings, message):
  with pytest.raises(ValueError, match=message):
    sample(markov_step_fn(_random_chain(0)), markov_cache(np.zeros(1, np.int32)), 1, 2, BOS, EOS, PAD,
           rng=jax.random.key(0), **settings)


def test_sampling_needs_a_key():
  with pytest.raises(ValueError, match="rng"):
    sample(markov_step_fn(_random_chain(0)), markov_cache(np.zeros(1, np.int32)), 1, 2, BOS, EOS, PAD)
