"""Orbax checkpoints: the train state, the data iterator's position and the open metrics window.

Two managers share a run directory: ``checkpoints/`` keeps the last ``keep`` periodic checkpoints and
``best/`` keeps the one with the best validation metric. Saves are asynchronous; a save interrupted by a
kill never becomes visible (orbax writes to a temporary directory and renames it when complete), and a
latest checkpoint that fails to restore is skipped, with a warning, for the one before it.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class CheckpointRestoreError(RuntimeError):
  """Checkpoints exist but none could be restored: refusing to silently start from scratch."""


class Checkpointer:
  """Saves and restores ``(state, extra)`` where ``extra`` is a JSON-serialisable dict."""

  def __init__(self, directory: str, keep: int = 3, asynchronous: bool = True, best_metric: str | None = None,
               best_mode: str = "min"):
    directory = os.path.abspath(directory)
    self.directory = directory
    self.best_metric = best_metric
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=asynchronous,
                                           create=True)
    self._latest = ocp.CheckpointManager(os.path.join(directory, "checkpoints"), options=options,
                                         item_names=("state", "extra"))
    self._best = None
    if best_metric:
      best_options = ocp.CheckpointManagerOptions(
          max_to_keep=1, best_fn=lambda metrics: metrics[best_metric], best_mode=best_mode,
          keep_checkpoints_without_metrics=False, enable_async_checkpointing=asynchronous, create=True)
      self._best = ocp.CheckpointManager(os.path.join(directory, "best"), options=best_options,
                                         item_names=("state", "extra"))

  def steps(self) -> list[int]:
    return sorted(self._latest.all_steps())

  def best_step(self) -> int | None:
    """Step of the kept best checkpoint (by ``best_metric``), or None."""
    return self._best.best_step() if self._best is not None else None

  def save(self, step: int, state, extra: dict, metrics: dict | None = None) -> None:
    """Periodic save of step ``step``; with ``metrics`` (containing ``best_metric``) also the best copy."""
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave(extra))
    if step not in self._latest.all_steps():
      self._latest.save(step, args=args, force=True)
    if self._best is not None and metrics is not None and self.best_metric in metrics:
      self._best.save(step, args=args, metrics={self.best_metric: float(metrics[self.best_metric])}, force=True)

  def restore(self, abstract_state, step: int | None = None, best: bool = False) -> tuple[int, Any, dict] | None:
    """Restore onto ``abstract_state`` (ShapeDtypeStructs with the wanted shardings).

    Tries ``step`` (or the newest, or the best), then older ones, warning on each failure. Returns None
    when there is no checkpoint, ``(step, state, extra)`` otherwise.

    Raises:
      CheckpointRestoreError: checkpoints exist but none restores.
    """
    manager = self._best if best else self._latest
    if manager is None:
      raise ValueError("no best-checkpoint manager: set config.best_metric to keep best checkpoints.")
    candidates = sorted(manager.all_steps(), reverse=True)
    if best and manager.best_step() is not None:
      candidates = [manager.best_step()]
    if step is not None:
      candidates = [s for s in candidates if s <= step]
    if not candidates:
      return None
    errors = []
    for candidate in candidates:
      try:
        restored = manager.restore(candidate, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), extra=ocp.args.JsonRestore()))
        if errors:
          log.warning("restored step %d after skipping unreadable checkpoint(s): %s", candidate,
                      "; ".join(errors))
        return candidate, restored["state"], dict(restored["extra"])
      except Exception as error:  # a corrupt or truncated checkpoint: fall back to the previous one
        message = f"step {candidate} in {manager.directory}: {type(error).__name__}: {str(error)[:200]}"
        log.warning("cannot restore checkpoint %s; trying an older one", message)
        errors.append(message)
    raise CheckpointRestoreError(
        "checkpoints exist but none could be restored (" + "; ".join(errors) + "). Refusing to start from "
        "scratch: move the checkpoints away or choose another --workdir.")

  def average_params(self, abstract_state, count: int) -> tuple[list[int], Any]:
    """The mean parameters of the last ``count`` periodic checkpoints (Vaswani et al. 2017 averaged the
    last 5), restored one at a time onto ``abstract_state`` so memory holds two copies at most.

    Returns:
      ``(steps, params)``: the averaged steps, oldest first, and the mean of their ``state.params``.

    Raises:
      ValueError: fewer than ``count`` periodic checkpoints are kept (``config.keep_checkpoints``).
    """
    steps = self.steps()[-count:]
    if count < 1 or len(steps) < count:
      raise ValueError(f"averaging the last {count} checkpoints needs that many in {self._latest.directory}, "
                       f"which holds steps {self.steps()}; train with config.keep_checkpoints >= {count}.")
    mean = None
    for index, step in enumerate(steps):
      restored = self._latest.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state)))
      params = restored["state"].params
      # Running mean: mean_k = mean_{k-1} + (params_k - mean_{k-1}) / k.
      mean = params if mean is None else jax.tree.map(lambda m, p: m + (p - m) / (index + 1), mean, params)
    return steps, mean

  def wait(self) -> None:
    """Block until asynchronous saves have finished."""
    self._latest.wait_until_finished()
    if self._best is not None:
      self._best.wait_until_finished()

  def close(self) -> None:
    self._latest.close()
    if self._best is not None:
      self._best.close()
