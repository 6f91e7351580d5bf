"""Shared by the decoding tests: Markov-chain step functions and an exhaustive numpy search over them."""
import itertools

import jax.numpy as jnp
import numpy as np

PAD, BOS, EOS = 0, 1, 2


def normalize(log_probs):
  """Rows of a table of logits -> log-probabilities (numpy log-softmax over the last axis)."""
  log_probs = np.asarray(log_probs, np.float64)
  log_probs = log_probs - log_probs.max(-1, keepdims=True)
  return (log_probs - np.log(np.exp(log_probs).sum(-1, keepdims=True))).astype(np.float32)


def markov_step_fn(log_probs):
  """Step function of a Markov chain over ``log_probs``.

  ``[vocab, vocab]`` (order 1): ``log P(next | previous)``. ``[vocab, vocab, vocab]`` (order 2):
  ``log P(next | before_previous, previous)``, where the token before the input lives in the cache, so
  that a beam search that re-gathers the cache wrongly conditions on the wrong history.
  The cache is ``markov_cache(...)``: ``before`` ``[batch]`` and a scalar step counter.
  """
  table = jnp.asarray(log_probs)

  def step_fn(tokens, cache):
    assert cache["before"].shape == tokens.shape[:1] and cache["steps"].shape == (), "cache mis-shaped"
    previous = tokens[:, 0]
    logits = table[previous] if table.ndim == 2 else table[cache["before"], previous]
    return logits[:, None, :], {"before": previous, "steps": cache["steps"] + 1}

  return step_fn


def markov_cache(context):
  """Initial cache: ``context`` ``[batch]`` is the token before BOS (an order-2 chain's 'source')."""
  return {"before": jnp.asarray(context, jnp.int32), "steps": jnp.array(0, jnp.int32)}


def gnmt_penalty(length, alpha):
  return ((5.0 + length) / 6.0) ** alpha


def exhaustive_search(log_probs, context, max_length, alpha, eos_id=EOS, bos_id=BOS, pad_id=PAD):
  """Every hypothesis of a Markov chain, scored by brute force.

  A hypothesis ends at its first EOS (length counts EOS) or is cut at ``max_length`` tokens. Returns a dict
  ``tokens (tuple of max_length, padded with pad_id) -> log P / ((5 + length) / 6) ** alpha``.
  """
  log_probs = np.asarray(log_probs, np.float64)
  vocab = log_probs.shape[-1]
  scores = {}
  for length in range(1, max_length + 1):
    for tokens in itertools.product(range(vocab), repeat=length):
      if eos_id in tokens[:-1] or (length < max_length and tokens[-1] != eos_id):
        continue
      history = (context, bos_id) + tokens
      total = sum(log_probs[history[i + 1], history[i + 2]] if log_probs.ndim == 2
                  else log_probs[history[i], history[i + 1], history[i + 2]] for i in range(length))
      scores[tokens + (pad_id,) * (max_length - length)] = total / gnmt_penalty(length, alpha)
  return scores
