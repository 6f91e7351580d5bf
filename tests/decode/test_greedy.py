"""Greedy search: follows the argmax of a Markov chain (checked by a numpy walk), pads after EOS."""
import functools

import jax
import numpy as np
import pytest

from tests.decode import BOS, EOS, PAD, markov_cache, markov_step_fn, normalize
from transformer.decode import greedy_search

VOCAB, MAX_LENGTH, BATCH = 5, 6, 4


def _numpy_greedy(log_probs, context, max_length):
  history, tokens = [context, BOS], []
  while len(tokens) < max_length and EOS not in tokens:
    tokens.append(int(np.argmax(log_probs[history[-2], history[-1]])))
    history.append(tokens[-1])
  return tokens + [PAD] * (max_length - len(tokens))


@functools.partial(jax.jit, static_argnums=2)
def _greedy(log_probs, context, max_length):
  return greedy_search(markov_step_fn(log_probs), markov_cache(context), context.shape[0], max_length, BOS, EOS,
                       PAD)[0]


@pytest.mark.parametrize("seed", range(3))
def test_greedy_follows_the_argmax_and_pads_after_eos(seed):
  rng = np.random.default_rng(seed)
  log_probs = normalize(2.0 * rng.normal(size=(VOCAB,) * 3))
  context = np.arange(BATCH) % VOCAB
  tokens = np.asarray(_greedy(log_probs, context, MAX_LENGTH))
  assert tokens.shape == (BATCH, MAX_LENGTH) and tokens.dtype == np.int32
  expected = [_numpy_greedy(log_probs, int(c), MAX_LENGTH) for c in context]
  np.testing.assert_array_equal(tokens, expected)


def test_greedy_stops_at_immediate_eos():
  log_probs = np.full((VOCAB, VOCAB, VOCAB), -5.0)
  log_probs[..., EOS] = 0.0
  tokens = np.asarray(_greedy(normalize(log_probs), np.zeros(2, np.int32), MAX_LENGTH))
  np.testing.assert_array_equal(tokens, [[EOS] + [PAD] * (MAX_LENGTH - 1)] * 2)
