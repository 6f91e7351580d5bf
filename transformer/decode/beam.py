"""Beam search over a step function ``(tokens, cache) -> (logits, cache)``; knows nothing of training.

Two sets of ``beam_size`` hypotheses are kept per example, as in flax's ``examples/wmt`` and t5x: *alive*
ones, which can still grow, and *finished* ones, which have ended (with EOS, or cut at ``max_length``) and
keep their score. Each step extends every alive hypothesis by every token, keeps the ``2 * beam_size`` most
likely extensions (at most ``beam_size`` of them end in EOS, one per parent, so at least ``beam_size`` are
left to grow), finishes those that end, and carries the best ``beam_size`` of the rest on. The search stops
early once no alive hypothesis can beat the worst finished one.

Which ending candidates may finish is the ``finish_rule``:

- ``"within_beam"`` (default, as fairseq and Hugging Face): only those ranked within the first
  ``beam_size`` of the ``2 * beam_size``; an EOS ranked lower is dropped. This makes ``beam_size=1`` with
  ``length_penalty=0`` exactly greedy search.
- ``"any"`` (flax's ``examples/wmt`` and t5x): every ending candidate among the ``2 * beam_size`` competes
  for the finished set, so a hypothesis that a narrow beam would drop can still win; beam 1 is then no
  longer greedy.

Hypotheses are ranked by ``log P(y) / lp(y)`` with the GNMT length penalty ``lp`` (Wu et al. 2016, eq. 14);
``len(y)`` counts the EOS token. A hypothesis that reaches ``max_length`` tokens without EOS is finished
there with length ``max_length``; one whose next-token logits are no distribution (a NaN) is finished
without a token, with the score NaN, ranked first (as greedy search and sampling end such a row).

Layout: beams of one example are contiguous when flattened, ``[batch * beam]`` index ``b * beam + k``.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from transformer.decode.start import (PrefillFunction, StepFunction, check_max_length, check_special_ids,
                                      first_log_probs, non_finite_rows)

FINISH_RULES = ("within_beam", "any")
# The finished score of a hypothesis that met logits that are no distribution, while searching: above every
# real score (log P <= 0), so it ranks first; returned as NaN.
BROKEN = jnp.inf


def gnmt_length_penalty(length, alpha: float):
  """``lp(Y) = ((5 + |Y|) / 6) ** alpha`` (Wu et al. 2016, eq. 14); ``alpha = 0`` ranks by log probability."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def flatten_beams(x: jax.Array) -> jax.Array:
  """``[batch, beam, ...]`` -> ``[batch * beam, ...]``."""
  return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def unflatten_beams(x: jax.Array, beam_size: int) -> jax.Array:
  """``[batch * beam, ...]`` -> ``[batch, beam, ...]``."""
  return x.reshape((x.shape[0] // beam_size, beam_size) + x.shape[1:])


def expand_to_beams(x: jax.Array, beam_size: int) -> jax.Array:
  """``[batch, ...]`` -> ``[batch * beam, ...]``: each example repeated once per beam."""
  return flatten_beams(jnp.broadcast_to(x[:, None], (x.shape[0], beam_size) + x.shape[1:]))


def gather_beams(x: jax.Array, beam_indices: jax.Array) -> jax.Array:
  """Pick beams per example: ``x`` ``[batch, beams_in, ...]``, ``beam_indices`` int ``[batch, beams_out]``
  -> ``[batch, beams_out, ...]`` with ``out[b, k] = x[b, beam_indices[b, k]]``."""
  return jax.vmap(lambda beams, indices: beams[indices])(x, beam_indices)


def map_batch_leaves(fn, tree, leading_size: int):
  """Apply ``fn`` to the leaves of ``tree`` whose leading axis has ``leading_size`` entries (the batch
  axis); other leaves (e.g. the scalar ``cache_index``) are shared by all beams and left alone."""
  return jax.tree.map(lambda x: fn(x) if x.ndim and x.shape[0] == leading_size else x, tree)


def _gather_cache(cache, beam_indices: jax.Array, beam_size: int):
  """Each beam's cache from its parent: batch leaves ``[batch * beam, ...]``, ``beam_indices`` int
  ``[batch, beam]`` (the parent of each new beam)."""
  return map_batch_leaves(lambda x: flatten_beams(gather_beams(unflatten_beams(x, beam_size), beam_indices)),
                           cache, beam_indices.shape[0] * beam_size)


class _BeamState(NamedTuple):
  step: jax.Array  # int32 scalar: tokens generated so far
  alive_sequences: jax.Array  # int32 [batch, beam, max_length], pad_id after ``step``
  alive_log_probs: jax.Array  # float32 [batch, beam], sorted descending; -inf for empty beams
  next_log_probs: jax.Array  # float32 [batch, beam, vocab]: each alive hypothesis's next-token distribution
  finished_sequences: jax.Array  # int32 [batch, beam, max_length], pad_id after EOS
  finished_scores: jax.Array  # float32 [batch, beam], sorted descending; -inf for empty slots
  cache: Any  # batch leaves [batch * beam, ...]


def beam_search(step_fn: StepFunction, cache, batch_size: int, beam_size: int, max_length: int, bos_id: int,
                eos_id: int, pad_id: int = 0, length_penalty: float = 0.6, return_all_beams: bool = False, *,
                finish_rule: str = "within_beam", prompt=None, prompt_lengths=None,
                prefill_fn: PrefillFunction | None = None):
  """The ``beam_size`` best-scoring sequences found per example (see the module docstring).

  Jit-compatible: shapes are static and the loop is a ``lax.while_loop``.

  Args:
    step_fn: maps the previous tokens ``[batch * beam, 1]`` and a cache to logits
      ``[batch * beam, 1, vocab]`` and the updated cache (e.g. a decoder applied with ``decode=True`` and
      ``mutable=['cache']``, whose encoder outputs were repeated with ``expand_to_beams``).
    cache: the initial cache for ``batch_size`` sequences. After BOS or the prompt, leaves whose leading axis
      has ``batch_size`` entries are repeated per beam and, every step, re-gathered from the parent beams;
      other leaves (a scalar step counter) are left alone.
    batch_size: number of examples.
    beam_size: hypotheses kept per example; 1 with ``length_penalty=0`` is greedy search ("within_beam").
    max_length: number of tokens to generate at most (after the prompt).
    bos_id, eos_id, pad_id: special ids; the first input is ``bos_id``, and after a hypothesis emits
      ``eos_id`` every later position is ``pad_id``.
    length_penalty: ``alpha`` of the GNMT length penalty (0.6 in GNMT; 0 ranks by log probability); a
      float or a traced scalar.
    return_all_beams: return every finished hypothesis (the n best, to rerank), not only the best.
    finish_rule: ``"within_beam"`` or ``"any"`` (see the module docstring).
    prompt, prompt_lengths, prefill_fn: continue a prefix per example, read once per example before the
      beams split (see ``first_log_probs``); the output holds only the continuation.

  Returns:
    ``(sequences, scores)``: int32 ``[batch, max_length]`` tokens (EOS included, padded with ``pad_id``) and
    float32 ``[batch]`` scores ``log P / lp`` of the best hypothesis; with ``return_all_beams``,
    ``[batch, beam, max_length]`` and ``[batch, beam]`` sorted best first (``-inf`` scores mark slots no
    hypothesis filled, e.g. a beam wider than the number of possible sequences). A hypothesis that met
    logits that are no distribution (a NaN) is finished there, padded, with the score NaN, ranked first.

  Raises:
    ValueError: a bad setting, or ``bos_id``, ``eos_id`` or ``pad_id`` outside the vocabulary of the logits.
  """
  _check_beam_settings(beam_size, max_length, finish_rule)
  log_probs, cache = first_log_probs(step_fn, cache, batch_size, bos_id, prompt, prompt_lengths, prefill_fn)
  check_special_ids(log_probs.shape[-1], bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
  state = _initial_state(log_probs, cache, batch_size, beam_size, max_length, pad_id)
  state = jax.lax.while_loop(
      lambda state: _can_improve(state, max_length, length_penalty),
      lambda state: _beam_step(state, step_fn, beam_size, max_length, eos_id, length_penalty, finish_rule),
      state)
  scores = jnp.where(state.finished_scores == BROKEN, jnp.nan, state.finished_scores)
  if return_all_beams:
    return state.finished_sequences, scores
  return state.finished_sequences[:, 0], scores[:, 0]


def _check_beam_settings(beam_size: int, max_length: int, finish_rule: str) -> None:
  """A ValueError naming the setting unless ``beam_search`` can run with it."""
  if not isinstance(beam_size, int) or beam_size < 1:
    raise ValueError(f"beam_search needs beam_size >= 1, got {beam_size!r}.")
  check_max_length(max_length)
  if finish_rule not in FINISH_RULES:
    raise ValueError(f"beam_search's finish_rule={finish_rule!r} is unknown; choose one of {list(FINISH_RULES)}.")


def _initial_state(log_probs, cache, batch_size: int, beam_size: int, max_length: int, pad_id: int) -> _BeamState:
  """The search before its first step: one live beam per example, whose next-token distribution is
  ``log_probs`` ``[batch, vocab]``; ``cache`` has ``batch_size`` rows, repeated here per beam."""
  empty_sequences = jnp.full((batch_size, beam_size, max_length), pad_id, jnp.int32)
  # All beams start as the same prefix; only the first is live, or the top-k would pick duplicates.
  # -inf (not a large negative number) marks empty beams: it stays -inf under every update and can never
  # outrank a real hypothesis, however long; log-probabilities are never +inf, so no NaN arises.
  initial_log_probs = jnp.where(jnp.arange(beam_size) == 0, 0.0, -jnp.inf).astype(jnp.float32)
  return _BeamState(
      step=jnp.array(0, jnp.int32),
      alive_sequences=empty_sequences,
      alive_log_probs=jnp.broadcast_to(initial_log_probs, (batch_size, beam_size)),
      next_log_probs=unflatten_beams(expand_to_beams(log_probs, beam_size), beam_size),
      finished_sequences=empty_sequences,
      finished_scores=jnp.full((batch_size, beam_size), -jnp.inf, jnp.float32),
      cache=map_batch_leaves(lambda x: expand_to_beams(x, beam_size), cache, batch_size))


def _can_improve(state: _BeamState, max_length: int, length_penalty) -> jax.Array:
  """Whether another step may change the result: ``[]`` bool, the ``while_loop``'s condition."""
  # An upper bound on any score the alive hypotheses can still reach: log P only falls as they grow, and
  # dividing a negative log P by the largest penalty of a length still possible raises it the most.
  largest_penalty = jnp.maximum(gnmt_length_penalty(state.step + 1, length_penalty),
                                gnmt_length_penalty(max_length, length_penalty))
  best_alive_bound = state.alive_log_probs[:, 0] / largest_penalty
  return (state.step < max_length) & jnp.any(best_alive_bound > state.finished_scores[:, -1])


def _beam_step(state: _BeamState, step_fn: StepFunction, beam_size: int, max_length: int, eos_id: int,
               length_penalty, finish_rule: str) -> _BeamState:
  """One token more: the ``2 * beam_size`` best extensions, those that end finished, the best
  ``beam_size`` others carried on with their caches and next-token distributions."""
  batch_size, _, vocab_size = state.next_log_probs.shape
  # A live hypothesis whose next-token logits are no distribution ends here without a token and is
  # finished with the score BROKEN (NaN once returned). None of its extensions may be chosen: such a row of
  # log_softmax holds only NaN and -inf, and the NaN become -inf before the top-k (which ranks NaN first).
  broken = non_finite_rows(state.next_log_probs) & (state.alive_log_probs > -jnp.inf)  # [batch, beam]
  candidate_log_probs = (state.alive_log_probs[:, :, None] + state.next_log_probs).reshape(
      batch_size, beam_size * vocab_size)  # not -1: a batch of 0 has no size to infer it from
  candidate_log_probs = jnp.where(jnp.isnan(candidate_log_probs), -jnp.inf, candidate_log_probs)
  num_candidates = min(2 * beam_size, beam_size * vocab_size)
  top_log_probs, top_indices = jax.lax.top_k(candidate_log_probs, num_candidates)  # [batch, candidates]
  parents, tokens = top_indices // vocab_size, top_indices % vocab_size
  sequences = gather_beams(state.alive_sequences, parents).at[:, :, state.step].set(tokens)
  length = state.step + 1

  is_eos = tokens == eos_id
  ends = is_eos | (length == max_length)  # everything still alive finishes at max_length
  if finish_rule == "within_beam":
    ends = ends & (jnp.arange(num_candidates) < beam_size)
  new_scores = jnp.where(ends, top_log_probs / gnmt_length_penalty(length, length_penalty), -jnp.inf)
  broken_scores = jnp.where(broken, BROKEN, -jnp.inf)
  # Earlier finished hypotheses come first, so top_k keeps them on ties.
  finished_scores, keep = jax.lax.top_k(
      jnp.concatenate([state.finished_scores, broken_scores, new_scores], axis=1), beam_size)
  finished_sequences = gather_beams(
      jnp.concatenate([state.finished_sequences, state.alive_sequences, sequences], axis=1), keep)

  alive_log_probs, keep = jax.lax.top_k(jnp.where(is_eos, -jnp.inf, top_log_probs), beam_size)
  alive_sequences = gather_beams(sequences, keep)
  cache = _gather_cache(state.cache, gather_beams(parents, keep), beam_size)
  logits, cache = step_fn(flatten_beams(alive_sequences[:, :, state.step])[:, None], cache)
  next_log_probs = unflatten_beams(jax.nn.log_softmax(logits[:, -1].astype(jnp.float32)), beam_size)
  return _BeamState(length, alive_sequences, alive_log_probs, next_log_probs, finished_sequences,
                    finished_scores, cache)
