"""One entry for every search: ``DecodeSettings`` (what ``config.decode`` holds) and ``search``."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from transformer.decode.beam import FINISH_RULES, beam_search, gather_beams
from transformer.decode.sampling import check_sampling, sample
from transformer.decode.start import PrefillFunction, StepFunction

METHODS = ("greedy", "beam", "sample")


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """How to decode; hashable, so a jitted function can take it as a static argument.

  ``method``: ``greedy``, ``beam`` (``beam_size``, ``length_penalty`` = GNMT alpha, ``finish_rule``: see
  ``beam``) or ``sample`` (``temperature``, ``top_k``, ``top_p``, ``num_samples``, the key from ``seed``).
  """
  method: str = "greedy"
  beam_size: int = 4
  length_penalty: float = 0.6
  finish_rule: str = "within_beam"
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  num_samples: int = 1
  seed: int = 0

  def __post_init__(self):
    if self.method not in METHODS:
      raise ValueError(f"decode method {self.method!r} is unknown; choose one of {list(METHODS)}.")
    if not isinstance(self.beam_size, int) or self.beam_size < 1:
      raise ValueError(f"beam_size must be an integer >= 1, got {self.beam_size!r}.")
    if not self.length_penalty >= 0:
      raise ValueError(f"length_penalty (GNMT alpha) must be >= 0 (0 ranks by log probability), got "
                       f"{self.length_penalty!r}.")
    if self.finish_rule not in FINISH_RULES:
      raise ValueError(f"finish_rule {self.finish_rule!r} is unknown; choose one of {list(FINISH_RULES)}.")
    check_sampling(self.temperature, self.top_k, self.top_p, self.num_samples)
    if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 62:
      raise ValueError(f"decode seed must be an integer in [0, 2**62), got {self.seed!r}.")

  @property
  def copies(self) -> int:
    """Rows per example the step function sees: beams, samples or 1."""
    return {"beam": self.beam_size, "sample": self.num_samples}.get(self.method, 1)


def search(settings: DecodeSettings, step_fn: StepFunction, cache, batch_size: int, max_length: int, bos_id: int,
           eos_id: int, pad_id: int = 0, *, prompt=None, prompt_lengths=None,
           prefill_fn: PrefillFunction | None = None):
  """Decode with ``settings``: ``(sequences int32 [batch, n, max_length], scores float32 [batch, n])``, best first.

  ``n`` is 1 (greedy), ``beam_size`` (every finished beam, scored ``log P / lp``) or ``num_samples`` (scored
  ``log P``). ``step_fn`` takes ``batch * settings.copies`` rows; the other arguments are ``sample``'s. A
  hypothesis that met logits that are no distribution scores NaN and comes first (``check_scores_finite``).
  """
  prompt_args = dict(prompt=prompt, prompt_lengths=prompt_lengths, prefill_fn=prefill_fn)
  if settings.method == "beam":
    return beam_search(step_fn, cache, batch_size, settings.beam_size, max_length, bos_id, eos_id, pad_id,
                       settings.length_penalty, return_all_beams=True, finish_rule=settings.finish_rule,
                       **prompt_args)
  greedy = settings.method == "greedy"
  sequences, log_probs = sample(
      step_fn, cache, batch_size, max_length, bos_id, eos_id, pad_id, rng=jax.random.key(settings.seed),
      temperature=0.0 if greedy else settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
      num_samples=1 if greedy else settings.num_samples, **prompt_args)
  # The likeliest sample first, as beams are; a NaN (logits that were no distribution) before all, as in beams.
  order = jnp.argsort(jnp.where(jnp.isnan(log_probs), -jnp.inf, -log_probs), axis=1)
  return gather_beams(sequences, order), gather_beams(log_probs, order)


def check_scores_finite(scores, what: str = "decoding") -> None:
  """On the host, after a search: a FloatingPointError naming the examples whose hypotheses met logits that
  were no distribution (their NaN scores, ``scores`` ``[batch]`` or ``[batch, n]``), rather than output cut
  short without a word. The searches cannot raise it themselves: they are compiled loops."""
  scores = np.asarray(scores)
  rows = np.flatnonzero(np.isnan(scores.reshape(len(scores), -1)).any(axis=1))
  if len(rows):
    shown = ", ".join(map(str, rows[:10])) + (", ..." if len(rows) > 10 else "")
    raise FloatingPointError(f"{what}: the model's logits were NaN or infinite for {len(rows)} of {len(scores)} "
                             f"examples (rows {shown}); the parameters or the inputs hold non-finite values, "
                             "e.g. a checkpoint saved after the training diverged.")


def override_decode(settings: DecodeSettings, beam_size: int | None = None,
                    length_penalty: float | None = None) -> DecodeSettings:
  """A run's decode settings with a call's overrides: ``beam_size`` 1 is greedy search, more is beam search."""
  if beam_size is not None:
    settings = dataclasses.replace(settings, method="greedy" if beam_size == 1 else "beam", beam_size=beam_size)
  if length_penalty is not None:
    settings = dataclasses.replace(settings, length_penalty=length_penalty)
  return settings
