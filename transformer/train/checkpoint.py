"""Orbax checkpoints: the train state, the data iterator's position and the open metrics window.

Two managers share a run directory: ``checkpoints/`` keeps the last ``keep`` periodic checkpoints and
``best/`` keeps the one with the best validation metric. Saves are asynchronous; a save interrupted by a
kill never becomes visible (orbax writes to a temporary directory and renames it when complete).

Every checkpoint records a SHA-256 of each array of the state (in its JSON ``extra`` item) and restore
verifies it, so flipped bits are caught like a truncated file: the checkpoint is skipped, with a warning,
for the one before it, and (when the run owns the workdir, ``repair=True``) renamed aside to
``<step>.damaged-<time>`` once an older one restores, so that later saves of that step and later resumes
do not trip over it. When none restores, nothing is moved: a changed config (another optimizer, another
number of seeds) fails them all alike. A state with a non-finite value is never saved.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from transformer.errors import CheckpointRestoreError, ConfigError, MissingDataError, TrainingDiverged

log = logging.getLogger(__name__)

__all__ = ["CheckpointRestoreError", "Checkpointer", "state_checksums"]


def _host_array(leaf) -> np.ndarray | None:
  """The whole value of ``leaf`` on this host, or None when this process holds only part of it."""
  if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
    if not leaf.is_fully_replicated:
      return None
    leaf = leaf.addressable_data(0)
  return np.asarray(jax.device_get(leaf))


def state_checksums(state) -> tuple[dict[str, str], list[str]]:
  """``(checksums, non_finite)``: SHA-256 of each leaf's dtype, shape and bytes by tree path, and the paths
  of floating-point leaves holding a NaN or infinity. Leaves this process holds only a shard of are left out."""
  checksums, non_finite = {}, []
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    array = _host_array(leaf)
    if array is None:
      continue
    name = jax.tree_util.keystr(path)
    array = np.ascontiguousarray(array)
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.view(np.uint8).reshape(-1) if array.size else b"")
    checksums[name] = digest.hexdigest()
    if np.issubdtype(array.dtype, np.inexact) and not np.all(np.isfinite(array)):
      non_finite.append(name)
  return checksums, non_finite


def _one_line(error: Exception) -> str:
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0][:200] if text else ''}"


class Checkpointer:
  """Saves and restores ``(state, extra)`` where ``extra`` is a JSON-serialisable dict.

  ``repair``: the caller owns the workdir (a training run holding its lock): damaged checkpoints are moved
  aside and orbax's leftover temporary directories are removed. Off for readers (eval, predict, another
  run's ``restore_from``), which must never change a directory a training run may be writing.
  ``discard_unrestorable`` (with ``repair``; ``config.restart``): when no checkpoint restores, move them all
  aside and report none instead of raising.
  """

  def __init__(self, directory: str, keep: int = 3, asynchronous: bool = True, best_metric: str | None = None,
               best_mode: str = "min", repair: bool = False, discard_unrestorable: bool = False):
    directory = os.path.abspath(directory)
    self.directory = directory
    self.keep = keep
    self.best_metric = best_metric
    self.repair = repair
    self.discard_unrestorable = discard_unrestorable
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=asynchronous,
                                           create=True, cleanup_tmp_directories=repair)
    self._latest = ocp.CheckpointManager(os.path.join(directory, "checkpoints"), options=options,
                                         item_names=("state", "extra"))
    self._best = None
    if best_metric or os.path.isdir(os.path.join(directory, "best")):
      # Also without best_metric when best/ exists: its checkpoint can still be resumed from.
      best_options = ocp.CheckpointManagerOptions(
          max_to_keep=1, best_fn=(lambda metrics: metrics[best_metric]) if best_metric else None,
          best_mode=best_mode,
          keep_checkpoints_without_metrics=False, enable_async_checkpointing=asynchronous, create=True,
          cleanup_tmp_directories=repair)
      self._best = ocp.CheckpointManager(os.path.join(directory, "best"), options=best_options,
                                         item_names=("state", "extra"))

  def steps(self) -> list[int]:
    """Steps of the kept periodic checkpoints, oldest first."""
    return sorted(self._latest.all_steps())

  def best_step(self) -> int | None:
    """Step of the kept best checkpoint (by ``best_metric``), or None."""
    if self._best is None:
      return None
    steps = self._best.all_steps()
    return (self._best.best_step() if self.best_metric else None) or (max(steps) if steps else None)

  def has_checkpoints(self) -> bool:
    """Whether any periodic or best checkpoint is kept."""
    return bool(self.steps()) or self.best_step() is not None

  def save(self, step: int, state, extra: dict, metrics: dict | None = None) -> None:
    """Periodic save of step ``step``; with ``metrics`` (containing ``best_metric``) also the best copy.

    A step already kept (an earlier attempt of this run got that far before falling back) is replaced.

    Raises:
      TrainingDiverged: the state holds a NaN or infinity; nothing is saved.
    """
    checksums, non_finite = state_checksums(state)
    if non_finite:
      self.wait()
      raise TrainingDiverged(
          f"refusing to save a non-finite state at step {step} ({', '.join(non_finite[:3])}"
          f"{', ...' if len(non_finite) > 3 else ''} hold NaN or infinity); the checkpoints saved so far are kept. "
          "Lower config.optimizer.learning_rate or set --config.skip_nonfinite_steps=True.")
    args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                              extra=ocp.args.JsonSave({**extra, "checksums": checksums}))
    self._replace(self._latest, step, args)
    if self._best is not None and metrics is not None and self.best_metric and self.best_metric in metrics:
      self._replace(self._best, step, args, metrics={self.best_metric: float(metrics[self.best_metric])})

  @staticmethod
  def _replace(manager, step, args, metrics=None) -> None:
    if step in manager.all_steps():
      manager.wait_until_finished()
      manager.delete(step)
    manager.save(step, args=args, metrics=metrics, force=True)

  def _restore_verified(self, manager, step: int, abstract_state) -> tuple[Any, dict]:
    """Restore ``step`` and check each array against the checksum recorded when it was saved."""
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), extra=ocp.args.JsonRestore()))
    state, extra = restored["state"], dict(restored["extra"])
    expected = extra.pop("checksums", None) or {}  # checkpoints written before checksums were recorded: none
    actual, _ = state_checksums(state)
    changed = [name for name, digest in actual.items() if name in expected and expected[name] != digest]
    if changed:
      raise ValueError(f"checksum mismatch: the data of {len(changed)} array(s) changed since they were "
                       f"saved ({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''})")
    return state, extra

  def _move_aside(self, manager, step: int) -> str | None:
    """Rename a damaged step directory to ``<step>.damaged-<UTC time>`` (never deleted: it may be rescued)."""
    if not self.repair or jax.process_index() != 0:
      return None
    source = os.path.join(str(manager.directory), str(step))
    target = f"{source}.damaged-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    try:
      os.rename(source, target)
    except OSError as error:
      log.warning("could not move the damaged checkpoint %s aside: %s", source, error)
      return None
    log.warning("moved the damaged checkpoint %s to %s", source, target)
    manager.reload()
    return target

  def restore(self, abstract_state, step: int | None = None, best: bool = False) -> tuple[int, Any, dict] | None:
    """Restore onto ``abstract_state`` (ShapeDtypeStructs with the wanted shardings).

    ``best=False`` (resuming): the newest checkpoint, periodic or best (both hold the whole state), then
    older ones. ``best=True`` (evaluating): the best checkpoint, then the periodic ones, newest first.
    ``step``: consider only steps up to it. Each failure (unreadable, truncated, checksum mismatch) is
    warned about and, with ``repair``, moved aside once an older checkpoint restores. Returns None when
    there is no checkpoint (or none restores and ``discard_unrestorable``), ``(step, state, extra)`` otherwise.

    Raises:
      CheckpointRestoreError: checkpoints exist but none restores.
    """
    if best and self._best is None:
      raise ValueError("no best-checkpoint manager: set config.best_metric to keep best checkpoints.")
    periodic = [(s, self._latest) for s in sorted(self._latest.all_steps(), reverse=True)]
    best_step = self.best_step()
    kept_best = [(best_step, self._best)] if best_step is not None else []
    # Newest first; at equal steps the periodic copy first (the best one is kept for evaluation).
    candidates = kept_best + periodic if best else sorted(periodic + kept_best, key=lambda c: -c[0])
    if step is not None:
      candidates = [c for c in candidates if c[0] <= step]
    if not candidates:
      return None
    errors, failed = [], []
    for candidate, manager in candidates:
      where = f"step {candidate} in {manager.directory}"
      try:
        state, extra = self._restore_verified(manager, candidate, abstract_state)
      except Exception as error:  # a corrupt, truncated or altered checkpoint: fall back to the previous one
        log.warning("cannot restore checkpoint %s (%s); trying an older one", where, _one_line(error))
        errors.append(f"{where}: {_one_line(error)}")
        failed.append((manager, candidate))
        continue
      if errors:
        log.warning("restored %s after skipping unreadable checkpoint(s): %s", where, "; ".join(errors))
      for failed_manager, failed_step in failed:  # this one restoring shows the others are damaged
        self._move_aside(failed_manager, failed_step)
      if best and kept_best and manager is not self._best:
        log.warning("the best checkpoint is damaged; using the latest good periodic checkpoint, %s", where)
      if not best and manager is self._best:
        log.warning("resuming from the best checkpoint, %s: no newer periodic checkpoint restores", where)
      return candidate, state, extra
    if self.discard_unrestorable and self.repair:
      for failed_manager, failed_step in failed:
        self._move_aside(failed_manager, failed_step)
      return None
    raise CheckpointRestoreError(
        "checkpoints exist but none could be restored (" + "; ".join(errors) + "). Refusing to start from "
        "scratch. If the config changed since they were saved (optimizer, number of seeds), set it back; if "
        "they are damaged, rerun with --config.restart=True to move them aside and start again, or choose "
        "another --workdir.")

  def average_params(self, abstract_state, count: int) -> tuple[list[int], Any]:
    """The mean parameters of the last ``count`` periodic checkpoints (Vaswani et al. 2017 averaged the
    last 5), restored one at a time onto ``abstract_state`` so memory holds two copies at most.

    Returns:
      ``(steps, params)``: the averaged steps, oldest first, and the mean of their ``state.params``.

    Raises:
      ConfigError: ``count`` is below 1.
      MissingDataError: fewer than ``count`` periodic checkpoints are kept; the message names the kept steps.
      CheckpointRestoreError: one of them is damaged (its checksum does not match).
    """
    kept = self.steps()
    if count < 1:
      raise ConfigError(f"config.average_checkpoints={count}: give how many of the last checkpoints to average "
                        "(>= 1), or 0 to use the best checkpoint alone.")
    if len(kept) < count:
      fix = (f"train with config.keep_checkpoints >= {count} (this run keeps {self.keep})" if self.keep < count
             else f"train longer, until {count} periodic checkpoints exist")
      raise MissingDataError(
          f"config.average_checkpoints={count}, but the run in {self.directory} has only {len(kept)} checkpoint(s) "
          f"(steps {', '.join(map(str, kept)) or 'none'}): give --config.average_checkpoints={len(kept)} or fewer, "
          f"or {fix}.")
    steps = kept[-count:]
    mean = None
    for index, step in enumerate(steps):
      try:
        state, _ = self._restore_verified(self._latest, step, abstract_state)
      except Exception as error:
        raise CheckpointRestoreError(f"cannot average step {step} in {self._latest.directory}: "
                                     f"{_one_line(error)}") from error
      params = state.params
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
