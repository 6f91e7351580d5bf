"""Greedy decoding over a step function ``(tokens, cache) -> (logits, cache)``; knows nothing of training."""
from __future__ import annotations

from transformer.decode.sampling import sample
from transformer.decode.start import PrefillFunction, StepFunction


def greedy_search(step_fn: StepFunction, cache, batch_size: int, max_length: int, bos_id: int, eos_id: int,
                  pad_id: int = 0, *, prompt=None, prompt_lengths=None, prefill_fn: PrefillFunction | None = None):
  """Pick the most likely token at each step until EOS (or ``max_length`` tokens): ``sample`` at temperature 0.

  Args:
    step_fn: maps the previous tokens ``[batch, 1]`` and a cache to logits ``[batch, 1, vocab]`` and the
      updated cache (e.g. a decoder applied with ``decode=True`` and ``mutable=['cache']``).
    cache: the initial (empty) cache pytree.
    batch_size: number of sequences.
    max_length: number of tokens to generate at most.
    bos_id, eos_id, pad_id: special ids; the first input is ``bos_id``, and after a sequence emits
      ``eos_id`` every later position is ``pad_id``.
    prompt, prompt_lengths, prefill_fn: continue a prefix per example (see ``first_log_probs``).

  Returns:
    ``(tokens, log_probs)``: ``[batch, max_length]`` int32 tokens (EOS included, padded with ``pad_id``) and
    ``[batch]`` float32 ``log P(tokens | prompt)`` (EOS included); a row that met logits that are no
    distribution (a NaN) ends there, padded, with ``log P`` NaN (see ``start``).
  """
  sequences, log_probs = sample(step_fn, cache, batch_size, max_length, bos_id, eos_id, pad_id, temperature=0.0,
                                prompt=prompt, prompt_lengths=prompt_lengths, prefill_fn=prefill_fn)
  return sequences[:, 0], log_probs[:, 0]
