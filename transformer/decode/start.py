"""The first step of every search: the log-probabilities of the first new token, after BOS or a prompt.

A search runs over a step function ``(tokens, cache) -> (logits, cache)``. A prompt (a prefix per example
that the output continues) is read by a prefill function ``(tokens, lengths, cache) -> (logits, cache)`` in
one parallel pass, rather than one step per token.

Logits that are no distribution (``non_finite_rows``) end the hypothesis that meets them, in every search
alike: it gets no token at that step (``pad_id`` from there on) and the score NaN, and ranks first among its
example's hypotheses, so a model that fails is not hidden behind another beam or sample (docs/decoding.md).
"""
from __future__ import annotations

import numbers
from typing import Any, Callable

import jax
import jax.numpy as jnp

# (tokens [batch, length] int32, cache) -> (logits [batch, length, vocab], cache); decoding calls it with one
# token per row, the previous output.
StepFunction = Callable[[jax.Array, Any], tuple[jax.Array, Any]]
# (tokens [batch, length] int32, lengths [batch] int32, cache) -> (logits [batch, length, vocab], cache): writes
# the first lengths[b] tokens of row b into the cache in one call (those that follow are padding) and leaves
# the cache ready for row b's next token; logits at i predict the token after input i. It sees one row per
# example, where the step function may see one per beam or sample.
PrefillFunction = Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, Any]]


NO_EOS = -1  # eos_id that asks for no end: every sequence runs to max_length (e.g. to time fixed lengths)


def check_special_ids(vocab_size: int, **ids) -> None:
  """A ValueError naming the id unless every special id given (``bos_id=1, eos_id=2, pad_id=0``) is in
  ``[0, vocab_size)``, the vocabulary of the step function's logits, or ``eos_id`` is ``NO_EOS``. Traced ids
  cannot be checked here."""
  for name, value in ids.items():
    if name == "eos_id" and not isinstance(value, jax.core.Tracer) and int(value) == NO_EOS:
      continue
    if not isinstance(value, jax.core.Tracer) and not 0 <= int(value) < vocab_size:
      raise ValueError(f"{name}={int(value)} is outside the vocabulary [0, {vocab_size}) of the step function's "
                       "logits: the model never emits such an id (an eos_id there never ends a sequence) and "
                       f"cannot read it back; give the id the model was trained with (eos_id={NO_EOS}: no end).")


def check_max_length(max_length, name: str = "max_length") -> None:
  """A ValueError naming ``name`` unless ``max_length`` (tokens to generate at most) is an integer >= 1: a
  search of no or a negative number of tokens has no output, and its cache would have no room.

  A symbolic dimension of ``jax.export`` (e.g. ``source_length + source_length // 2 + 10``) passes: its value
  is known only when the exported search is called, and a search over it still compiles to one loop. It must be
  provably >= 2 (greedy search and sampling scan ``max_length - 1`` steps after the first)."""
  if jax.export.is_symbolic_dim(max_length):
    return
  if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral) or max_length < 1:
    raise ValueError(f"{name} must be an integer >= 1 (tokens to generate at most), got {max_length!r}.")


def non_finite_rows(log_probs):
  """``[rows]`` bool: the rows of ``log_probs`` ``[rows, vocab]`` (a ``log_softmax``) that are no distribution,
  because their logits held a NaN or a +inf, or were all -inf (each makes ``log_softmax`` NaN). Single -inf
  logits, e.g. tokens a model rules out, are a valid distribution."""
  return jnp.any(jnp.isnan(log_probs), axis=-1)


def check_prompt(prompt, prompt_lengths, prefill_fn) -> None:
  """A prompt needs its lengths and a prefill function; a clear error names what is missing."""
  if prompt is None:
    if prompt_lengths is not None:
      raise ValueError("prompt_lengths goes with a prompt; pass prompt=[batch, prompt_length] too.")
    return
  if prompt_lengths is None or prefill_fn is None:
    raise ValueError("a prompt needs prompt_lengths ([batch] int, its real tokens per row) and prefill_fn (which "
                     "writes it into the cache in one pass); pass both.")


def first_log_probs(step_fn: StepFunction, cache, batch_size: int, bos_id: int, prompt=None, prompt_lengths=None,
                    prefill_fn: PrefillFunction | None = None):
  """``(log_probs [batch, vocab] float32, cache)`` of the first generated token, for ``batch_size`` rows (a
  search copies them per beam or sample afterwards).

  ``bos_id``, then the prompt if any (``prompt`` ``[batch, prompt_length]`` int, its first
  ``prompt_lengths[b]`` tokens real in row ``b``), go through ``prefill_fn`` in one call when it is given
  (the logits after each row's last real token are kept), else ``bos_id`` through ``step_fn``.
  """
  check_prompt(prompt, prompt_lengths, prefill_fn)
  bos = jnp.full((batch_size, 1), bos_id, jnp.int32)
  if prefill_fn is None:
    logits, cache = step_fn(bos, cache)
    return jax.nn.log_softmax(logits[:, -1].astype(jnp.float32)), cache
  if prompt is None:
    inputs, lengths = bos, jnp.ones((batch_size,), jnp.int32)
  else:
    inputs = jnp.concatenate([bos, jnp.asarray(prompt, jnp.int32)], axis=1)
    lengths = jnp.asarray(prompt_lengths, jnp.int32) + 1  # BOS first
  logits, cache = prefill_fn(inputs, lengths, cache)
  last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]  # [batch, vocab]
  return jax.nn.log_softmax(last.astype(jnp.float32)), cache
