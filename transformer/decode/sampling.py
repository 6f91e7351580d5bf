"""Sampling and greedy decoding over a step function ``(tokens, cache) -> (logits, cache)``.

Each step draws the next token from the model's distribution reshaped by a temperature (0: the most likely
token, i.e. greedy search), then cut to the ``top_k`` most likely tokens and to the nucleus (``top_p``,
Holtzman et al. 2020). Randomness comes from one explicit key: the same key gives the same samples.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from transformer.decode.beam import expand_to_beams, map_batch_leaves, unflatten_beams
from transformer.decode.start import (PrefillFunction, StepFunction, check_max_length, check_special_ids,
                                      first_log_probs, non_finite_rows)


def top_k_logits(logits, top_k: int):
  """``[..., vocab]`` logits with all but the ``top_k`` largest set to ``-inf`` (ties with the k-th kept)."""
  kth_largest = jax.lax.top_k(logits, top_k)[0][..., -1:]
  return jnp.where(logits < kth_largest, -jnp.inf, logits)


def top_p_logits(logits, top_p: float):
  """``[..., vocab]`` logits outside the nucleus set to ``-inf``: the nucleus is the fewest most likely tokens
  whose probabilities sum to at least ``top_p`` (ties with its least likely token kept)."""
  sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  # The most likely token always stays (mass_before is 0 there), so the nucleus is never empty.
  threshold = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(logits < threshold, -jnp.inf, logits)


def check_sampling(temperature: float, top_k: int, top_p: float, num_samples: int) -> None:
  """Reject settings that would sample nothing or silently ignore themselves."""
  if not temperature >= 0:
    raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}.")
  if not isinstance(top_k, int) or top_k < 0:
    raise ValueError(f"top_k must be an integer >= 0 (0 = no cut), got {top_k!r}.")
  if not 0 < top_p <= 1:
    raise ValueError(f"top_p must be in (0, 1] (1 = no cut), got {top_p!r}.")
  if not isinstance(num_samples, int) or num_samples < 1:
    raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}.")


def sample_logits(rng, logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
  """One token per row of ``logits`` ``[batch, vocab]`` -> int32 ``[batch]``: the argmax when ``temperature``
  is 0, else a draw from ``softmax(logits / temperature)`` cut to ``top_k`` tokens (0: all) and to the
  ``top_p`` nucleus (1: all), in that order."""
  if temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits.astype(jnp.float32) / temperature
  if top_k:
    logits = top_k_logits(logits, min(top_k, logits.shape[-1]))
  if top_p < 1:
    logits = top_p_logits(logits, top_p)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def sample(step_fn: StepFunction, cache, batch_size: int, max_length: int, bos_id: int, eos_id: int,
           pad_id: int = 0, *, rng=None, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           num_samples: int = 1, prompt=None, prompt_lengths=None, prefill_fn: PrefillFunction | None = None):
  """``num_samples`` sequences per example, drawn token by token (see the module docstring).

  Jit-compatible (a ``lax.scan`` of ``max_length - 1`` steps after the first).

  Args:
    step_fn: maps the previous tokens ``[batch * num_samples, 1]`` and a cache to logits
      ``[batch * num_samples, 1, vocab]`` and the updated cache (a decoder applied with ``decode=True`` and
      ``mutable=['cache']``).
    cache: the initial cache for ``batch_size`` rows. After BOS or the prompt, leaves whose leading axis has
      ``batch_size`` entries are repeated per sample (the prompt is read once per example).
    batch_size, max_length: examples, and tokens to generate at most (after the prompt).
    bos_id, eos_id, pad_id: special ids; after a sequence emits ``eos_id`` every later token is ``pad_id``.
    rng: a PRNG key (needed unless ``temperature`` is 0); step ``t`` draws with ``fold_in(rng, t)``.
    temperature, top_k, top_p: see ``sample_logits``; Python numbers (they choose the program).
    num_samples: sequences per example.
    prompt, prompt_lengths, prefill_fn: continue a prefix per example (see ``first_log_probs``); the output
      holds only the continuation.

  Returns:
    ``(sequences, log_probs)``: int32 ``[batch, num_samples, max_length]`` (EOS included, then ``pad_id``) and
    float32 ``[batch, num_samples]`` ``log P(sequence | prompt)`` under the model itself (temperature 1, no
    cut), EOS included, for reranking. A sequence that met logits that are no distribution (a NaN) ends
    there, padded, with ``log_probs`` NaN (see ``start``).

  Raises:
    ValueError: a bad setting, or ``bos_id``, ``eos_id`` or ``pad_id`` outside the vocabulary of the logits.
  """
  check_sampling(temperature, top_k, top_p, num_samples)
  check_max_length(max_length)
  if rng is None and temperature != 0:
    raise ValueError("sampling with temperature > 0 needs rng=jax.random.key(...); temperature=0 is greedy.")
  rng = jax.random.key(0) if rng is None else rng  # unused by greedy choices
  log_probs, cache = first_log_probs(step_fn, cache, batch_size, bos_id, prompt, prompt_lengths, prefill_fn)
  check_special_ids(log_probs.shape[-1], bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
  rows = batch_size * num_samples
  cache = map_batch_leaves(lambda x: expand_to_beams(x, num_samples), cache, batch_size)
  log_probs = expand_to_beams(log_probs, num_samples)  # [rows, vocab]

  choose = functools.partial(_choose_tokens, rng, temperature=temperature, top_k=top_k, top_p=top_p,
                             eos_id=eos_id, pad_id=pad_id)

  def step(carry, step_index):
    log_probs, cache, finished, total = carry
    tokens, finished, total = choose(step_index, log_probs, finished, total)
    logits, cache = step_fn(tokens[:, None], cache)
    return (jax.nn.log_softmax(logits[:, -1].astype(jnp.float32)), cache, finished, total), tokens

  initial = (log_probs, cache, jnp.zeros((rows,), bool), jnp.zeros((rows,), jnp.float32))
  # The last token is chosen outside the scan: no step is run on it, so the cache needs no room for it.
  (log_probs, _, finished, total), tokens = jax.lax.scan(step, initial, jnp.arange(max_length - 1))
  last, _, total = choose(max_length - 1, log_probs, finished, total)
  tokens = jnp.concatenate([tokens, last[None]], axis=0).T  # [rows, max_length]
  return unflatten_beams(tokens, num_samples), unflatten_beams(total, num_samples)


def _choose_tokens(rng, step, log_probs, finished, total, *, temperature: float, top_k: int, top_p: float,
                   eos_id: int, pad_id: int):
  """Token ``step`` of ``sample``: ``log_probs`` ``[rows, vocab]``, ``finished`` ``[rows]`` bool and the running
  ``total`` ``[rows]`` float32 -> ``(tokens [rows] int32, finished, total)``; ended rows get ``pad_id``."""
  # A row that meets logits that are no distribution ends here without a token, its total NaN.
  broken = ~finished & non_finite_rows(log_probs)
  ended = finished | broken
  tokens = sample_logits(jax.random.fold_in(rng, step), log_probs, temperature, top_k, top_p)
  tokens = jnp.where(ended, pad_id, tokens)
  total = total + jnp.where(ended, 0.0, jnp.take_along_axis(log_probs, tokens[:, None], axis=1)[:, 0])
  total = jnp.where(broken, jnp.nan, total)
  return tokens, ended | (tokens == eos_id), total
