"""The metrics of a logging window, kept on the device between the loop's actions.

A step's ``name -> (sum, weight)`` metrics stay where the step left them: ``add`` only keeps a reference (no
dispatch, no wait). When an action needs them (log, save, evaluate), one compiled call folds the window's
steps into their sums, in step order (the same additions, in the same order, as adding them one by one), and
finds the first step whose loss or gradient norm was not finite; the host then reads the result. A compiled
call of several steps (``config.steps_per_call``) hands over its steps' metrics stacked ``[steps, ...]``: they
are folded one step after the other, as if added one by one, so the sums are the same.
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from transformer.errors import TrainingDiverged
from transformer.train.step import all_finite


@functools.partial(jax.jit, static_argnames="counts")
def _fold(sums, entries: list, counts: tuple[int, ...]):
  """``(sums + step 1 + step 2 + ..., index of the first non-finite step or -1)``; ``sums`` None: none yet.

  ``entries[i]`` holds one step's metrics (``counts[i]`` 0) or ``counts[i]`` steps' metrics stacked along a
  leading axis."""
  steps = []
  for metrics, count in zip(entries, counts):
    steps += [metrics] if count == 0 else [jax.tree.map(lambda x, i=i: x[i], metrics) for i in range(count)]
  nonfinite = jnp.stack([~all_finite(metrics) for metrics in steps])
  first = jnp.where(jnp.any(nonfinite), jnp.argmax(nonfinite), -1)
  for metrics in steps:
    sums = metrics if sums is None else jax.tree.map(jnp.add, sums, metrics)
  return sums, first


class MetricsWindow:
  """Sums of the train metrics since the last log, the steps and tokens they cover (and which of them were in a
  call that compiled), and the first step since the run (re)started whose loss or gradient norm was not finite."""

  def __init__(self, fetch, saved: dict | None = None):
    self._fetch = fetch  # device tree -> host numpy (the strategy's fetch)
    self._sums, self._pending, self._first_nonfinite = None, [], None
    self.steps, self.tokens, self.start = 0, 0, time.perf_counter()
    self.compiled_steps, self.compile_seconds = 0, 0.0
    if saved and saved.get("window"):
      # Each half of a (sum, count) pair is one array: a vector with a value per seed when they are vmapped.
      self._sums = {k: tuple(jnp.asarray(half) for half in pair) for k, pair in saved["window"].items()}
      self.steps, self.tokens = saved["window_steps"], saved["window_tokens"]

  def add(self, metrics, step: int, tokens: int, stacked: int = 0) -> None:
    """Keep the metrics of step ``step`` (counted from 1), or with ``stacked`` > 0 those of the ``stacked`` steps
    up to ``step``, stacked ``[stacked, ...]``; dispatches nothing, waits for nothing."""
    self._pending.append((step, metrics, stacked))
    self.steps += max(stacked, 1)
    self.tokens += tokens

  def add_compilation(self, steps: int, seconds: float) -> None:
    """The last ``steps`` added ran in a call that compiled, which took ``seconds``: left out of the pace."""
    self.compiled_steps += steps
    self.compile_seconds += seconds

  def _fold_pending(self) -> None:
    if not self._pending:
      return
    steps = []  # the number of each step folded, in order
    for last, _, stacked in self._pending:
      steps += range(last - max(stacked, 1) + 1, last + 1)
    self._sums, first = _fold(self._sums, [metrics for _, metrics, _ in self._pending],
                              tuple(stacked for _, _, stacked in self._pending))
    self._pending = []
    if self._first_nonfinite is None:
      index = int(np.asarray(first.addressable_data(0)))
      self._first_nonfinite = steps[index] if index >= 0 else None

  def read(self) -> tuple[dict, int, int, float, float | None]:
    """``(sums on the host, steps, tokens, seconds, pace)`` of the window, which starts anew. ``pace``: seconds
    per step of the steps outside calls that compiled (None if every step was in one), for an ETA that does not
    count compilation as the pace of the steps to come."""
    self._fold_pending()
    sums, steps, tokens = self._fetch(self._sums), self.steps, self.tokens
    seconds = time.perf_counter() - self.start
    compiled = min(self.compiled_steps, steps)  # a resumed window's restored steps were not timed here
    pace = (seconds - self.compile_seconds) / (steps - compiled) if steps > compiled else None
    self._sums, self.steps, self.tokens, self.start = None, 0, 0, time.perf_counter()
    self.compiled_steps, self.compile_seconds = 0, 0.0
    return sums, steps, tokens, seconds, pace

  def saved(self) -> dict:
    """What a checkpoint keeps of the window, so that a resumed run logs the same lines."""
    self._fold_pending()
    fetched = self._fetch(self._sums) if self._sums is not None else None
    return {"window": {k: [np.asarray(v).tolist() for v in pair] for k, pair in fetched.items()} if fetched else None,
            "window_steps": self.steps, "window_tokens": self.tokens}

  def check_finite(self) -> None:
    """Raises ``TrainingDiverged`` naming the first non-finite step since the run (re)started."""
    self._fold_pending()
    if self._first_nonfinite is None:
      return
    raise TrainingDiverged(
        f"training diverged at step {self._first_nonfinite}: the loss or gradient norm is not finite. Nothing "
        "from this step on was saved; the latest checkpoint is the last finite state. Lower "
        "config.optimizer.learning_rate (or set config.optimizer.grad_clip_norm), or set "
        "--config.skip_nonfinite_steps=True to skip such steps.")
