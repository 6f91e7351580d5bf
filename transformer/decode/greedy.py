"""Greedy decoding over a step function ``(tokens, cache) -> (logits, cache)``; knows nothing of training."""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

StepFunction = Callable[[jax.Array, Any], tuple[jax.Array, Any]]


def greedy_search(step_fn: StepFunction, cache, batch_size: int, max_length: int, bos_id: int, eos_id: int,
                  pad_id: int = 0):
  """Pick the most likely token at each step until EOS (or ``max_length`` tokens).

  Args:
    step_fn: maps the previous tokens ``[batch, 1]`` and a cache to logits ``[batch, 1, vocab]`` and the
      updated cache (e.g. a decoder applied with ``decode=True`` and ``mutable=['cache']``).
    cache: the initial (empty) cache pytree.
    batch_size: number of sequences.
    max_length: number of tokens to generate at most.
    bos_id, eos_id, pad_id: special ids; the first input is ``bos_id``, and after a sequence emits
      ``eos_id`` every later position is ``pad_id``.

  Returns:
    ``[batch, max_length]`` int32 tokens, EOS included, padded with ``pad_id``.
  """
  def step(carry, _):
    tokens, cache, finished = carry
    logits, cache = step_fn(tokens, cache)
    next_tokens = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    next_tokens = jnp.where(finished, pad_id, next_tokens)
    finished = finished | (next_tokens == eos_id)
    return (next_tokens[:, None], cache, finished), next_tokens

  initial = (jnp.full((batch_size, 1), bos_id, jnp.int32), cache, jnp.zeros((batch_size,), bool))
  _, tokens = jax.lax.scan(step, initial, None, length=max_length)
  return tokens.T
