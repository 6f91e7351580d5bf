"""Orbax checkpoints with their guards: fingerprints of every array, the fallback to an older checkpoint,
the disk-space check, and the quieting of what a failed save leaves behind.

A checkpoint holds the train state, the data iterator's position and the open metrics window. One orbax
``CheckpointManager`` writes them to ``checkpoints/<step>``, and its preservation policy decides what is kept:
the latest ``keep`` steps and the best by ``best_metric`` (a step saved with a finite evaluation carries it as
the step's metrics). Saves are asynchronous; a save interrupted by a kill never becomes visible (orbax writes to
a temporary directory and renames it when complete).

Every checkpoint records a fingerprint of each array of the state, computed on its devices, and a SHA-256 of
its ``extra`` item (``state_fingerprints``, below), and restore verifies them, so flipped bits are caught like a
truncated file: the checkpoint is skipped, with a warning, for the one before it, and (when the run owns the
workdir, ``repair=True``) renamed aside to ``<step>.damaged-<time>`` once an older one restores, so that later saves of that step and later resumes
do not trip over it. When none restores, nothing is moved: a changed config (another optimizer, another
number of seeds) fails them all alike. Each damaged step is reported in one warning line. A state with a
non-finite value is never saved, and an evaluation whose ``best_metric`` is not finite never becomes the best.

A full disk is one ``WorkdirError`` naming the workdir and the space a checkpoint takes: checked before each
save (against the size of the last checkpoint written), and, when a save still runs out of space, its
half-written temporary directories are removed so that only intact checkpoints remain. A file past the process's
file-size limit (``ulimit -f``, ``EFBIG``) is handled the same way, its line naming the limit.

Parameters are saved per layer (``layer_0``, ``layer_1``, ...) whatever ``config.model.scan_layers`` says: a
scanned stack's ``[layers, ...]`` arrays (and their optimizer moments) are unstacked on save and stacked again on
restore (``transformer.nn.unstack_layers`` / ``stack_layers``), so a run saved with either setting resumes, is
evaluated and loads with the other.

Checksums of what a checkpoint holds: every array of the state, and the JSON ``extra`` item (data position,
metrics window), so that flipped bits or an edited position are caught on restore instead of resumed silently.

The arrays are fingerprinted where they live (``state_fingerprints``): one compiled program hashes every leaf on
its devices, every shard of a sharded leaf included, and only 8 bytes per leaf come to the host, so a save
copies nothing to the host for its checks (orbax's writer copies in the background). A fingerprint is a sum
over elements of a mixed hash of (bits, global position), modulo 2**32, in two independent lanes: the same for
any sharding or number of devices, and changed by any flipped bit or moved value. Checkpoints written before
fingerprints carry SHA-256 digests of each leaf's bytes (``state_checksums``), still verified on restore.

What a failed orbax save or restore leaves behind, silenced: each is a copy of the error ``Checkpointer``
raises or reports in one line (its worker threads' log records, "Event loop is closed" from reads finishing
after orbax closed their loop, coroutines never awaited).
"""
from __future__ import annotations

import gc
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import threading
import time
import warnings
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as preservation
from jax.experimental import multihost_utils

from transformer.data.files import file_too_large_error, format_bytes, is_file_too_large, is_write_refused
from transformer.errors import CheckpointRestoreError, ConfigError, MissingDataError, TrainingDiverged, WorkdirError
from transformer.nn import stack_layers, unstack_layers

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"  # the latest config.keep_checkpoints checkpoints and the best by config.best_metric


@flax.struct.dataclass
class SavedParams:
  """A restore target that reads the ``params`` of a saved train state alone: the optimizer state, step and
  key stay on disk (orbax's partial restore). Its tree paths (``.params[...]``) are the train state's, so the
  checksums recorded at save time check it."""
  params: Any


def _one_line(error: Exception) -> str:
  """The error's type and first line, without TensorStore's pointer to its details (a repr of a bound method)."""
  text = str(error).strip().splitlines()
  first = text[0].split(" See full TensorStore details")[0] if text else ""
  return f"{type(error).__name__}: {first[:200]}"


def _allocated_bytes(directory: str) -> int:
  """Disk space the files under ``directory`` take (allocated blocks, as ``du``), 0 when it is missing."""
  total = 0
  for root, _, names in os.walk(directory):
    for name in names:
      try:
        stat = os.stat(os.path.join(root, name))
      except OSError:
        continue
      total += getattr(stat, "st_blocks", 0) * 512 or stat.st_size
  return total


def _state_bytes(state) -> int:
  """Bytes of the arrays of ``state``: what a first checkpoint takes at least."""
  return sum(int(getattr(leaf, "nbytes", 0)) for leaf in jax.tree_util.tree_leaves(state))


class CheckpointOfAnotherRun(WorkdirError):
  """A checkpoint whose run identity is not the workdir's: refused, never resumed or evaluated as this run's."""


def _kept_policy(keep: int, best_metric: str | None, best_mode: str):
  """What the one manager keeps: the latest ``keep`` checkpoints, and the best by ``best_metric`` (orbax's
  preservation policies); a step saved without metrics (no evaluation, or a non-finite one) is never the best."""
  policies = [preservation.LatestN(keep)]
  if best_metric:
    policies.append(preservation.BestN(get_metric_fn=lambda metrics: metrics[best_metric], reverse=best_mode == "min",
                                       n=1, keep_checkpoints_without_metrics=False))
  return preservation.AnyPreservationPolicy(policies)


class Checkpointer:
  """Saves and restores ``(state, extra)`` where ``extra`` is a JSON-serialisable dict, in ``checkpoints/``.

  ``repair``: the caller owns the workdir (a training run holding its lock): damaged checkpoints are moved
  aside and orbax's leftover temporary directories are removed. Off for readers (eval, predict, another
  run's ``restore_from``), which must never change a directory a training run may be writing.
  ``discard_unrestorable`` (with ``repair``; ``config.restart``): when no checkpoint restores, move them all
  aside and report none instead of raising. ``run``: the identity of the run (``workdir.record_identity``), which
  every save records and every restore compares: a checkpoint of another run is refused (None: not checked).
  ``layer_axis``: the axis of a scanned stack's layers in the state's arrays (1 under a leading replica axis).
  """

  def __init__(self, directory: str, keep: int = 3, asynchronous: bool = True, best_metric: str | None = None,
               best_mode: str = "min", repair: bool = False, discard_unrestorable: bool = False,
               run: str | None = None, layer_axis: int = 0):
    directory = os.path.abspath(directory)
    self.directory = directory
    self.layer_axis = layer_axis
    self.run = run
    self.keep = keep
    self.best_metric = best_metric
    self.repair = repair
    self.discard_unrestorable = discard_unrestorable
    self._checkpoint_sizes: dict[str, int] = {}  # step directory -> bytes on disk, measured once it is complete
    self._state_size = 0
    self._failed = False  # a save ran out of space: closing must not raise the same error again
    quiet_orbax_aftermath()
    folder = os.path.join(directory, CHECKPOINTS)
    if os.path.exists(folder) and not os.path.isdir(folder):
      raise WorkdirError(f"{folder} is a file, not the run's checkpoint folder: move it away (or use another "
                         "--workdir) and rerun.")
    # Leftovers of interrupted saves are removed here, at once (_remove_unfinished): orbax's own cleanup runs on a
    # thread that outlived a start refused right after, and printed a traceback when the workdir went with it.
    options = ocp.CheckpointManagerOptions(
        enable_async_checkpointing=asynchronous, create=True, cleanup_tmp_directories=False,
        best_fn=(lambda metrics: metrics[best_metric]) if best_metric else None, best_mode=best_mode,
        preservation_policy=_kept_policy(keep, best_metric, best_mode),
        # orbax names its multi-host barriers by step alone: a prefix keeps them apart from any other manager's
        multiprocessing_options=ocp.options.MultiprocessingOptions(barrier_sync_key_prefix=CHECKPOINTS))
    self._manager = ocp.CheckpointManager(folder, options=options, item_names=("state", "extra"))
    if repair:
      self._remove_unfinished()

  def steps(self) -> list[int]:
    """Steps of the kept checkpoints (the latest ``keep`` and the best), oldest first."""
    return sorted(self._manager.all_steps())

  def best_step(self) -> int | None:
    """Step of the best kept checkpoint (by ``best_metric``), or None when none was saved with a finite one."""
    return self._manager.best_step() if self.best_metric else None

  def has_checkpoints(self) -> bool:
    """Whether any checkpoint is kept."""
    return bool(self.steps())

  def prepare(self, state) -> None:
    """Compile the save's fingerprint program for ``state``'s shapes and shardings now, at start, so that the
    first save (perhaps a preemption's, inside its grace window) does not compile it. Every process calls it."""
    state_fingerprints(unstack_layers(state, self.layer_axis))

  def save(self, step: int, state, extra: dict, metrics: dict | None = None) -> None:
    """Save step ``step``; ``metrics`` (containing ``best_metric``) make it a candidate for the best, unless that
    metric is not finite (a NaN evaluation is never the best). Orbax's preservation policy then removes what
    is neither among the latest ``keep`` nor the best.

    A step already kept (an earlier attempt of this run got that far before falling back) is replaced.

    Raises:
      TrainingDiverged: the state holds a NaN or infinity; nothing is saved.
      WorkdirError: the disk is full; the message names the workdir and the space a checkpoint needs. No
        half-written checkpoint is left and the earlier ones are kept.
    """
    state = unstack_layers(state, self.layer_axis)
    fingerprints, non_finite = state_fingerprints(state)
    if non_finite:
      self.wait()
      raise TrainingDiverged(
          f"refusing to save a non-finite state at step {step} ({', '.join(non_finite[:3])}"
          f"{', ...' if len(non_finite) > 3 else ''} hold NaN or infinity); the checkpoints saved so far are kept. "
          "Lower config.optimizer.learning_rate or set --config.skip_nonfinite_steps=True.")
    best_value = None
    if metrics is not None and self.best_metric and self.best_metric in metrics:
      best_value = float(metrics[self.best_metric])
      if not math.isfinite(best_value):
        log.warning("step %d is not kept as the best checkpoint: its %s is %s", step, self.best_metric, best_value)
        best_value = None
    extra = {**extra, "run": self.run} if self.run else extra
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave(
        {**extra, "fingerprints": fingerprints, "extra_checksum": extra_checksum(extra)}))
    self._state_size = _state_bytes(state)
    self._check_space(step)
    try:
      if step in self._manager.all_steps():  # an earlier attempt of this run got this far: replaced
        self._manager.wait_until_finished()
        self._manager.delete(step)
      self._manager.save(step, args=args, metrics=None if best_value is None else {self.best_metric: best_value},
                         force=True)
      return
    except Exception as error:  # an asynchronous save reports a full disk here, at the next save, or in wait()
      if not is_write_refused(error):
        raise
      too_large = is_file_too_large(error)
    raise self._out_of_space(step, too_large)  # outside the except block: see collect_orbax_leftovers

  def _checkpoint_size(self) -> int:
    """Bytes on disk of the newest complete checkpoint, or of the state's arrays before the first one."""
    for step in sorted(self._manager.all_steps(), reverse=True):
      path = os.path.join(str(self._manager.directory), str(step))
      if path not in self._checkpoint_sizes and os.path.isdir(path):  # in flight, it has a temporary name
        self._checkpoint_sizes[path] = _allocated_bytes(path)
      if self._checkpoint_sizes.get(path):
        return self._checkpoint_sizes[path]
    return self._state_size

  def _check_space(self, step: int) -> None:
    """Refuse to start a save that cannot fit, before it writes anything (a best-effort check: another
    process may fill the disk meanwhile, which the save itself then reports). Single-process runs only:
    hosts that saw different free space would part ways at orbax's save barriers."""
    if jax.process_count() > 1:
      return
    try:
      free = shutil.disk_usage(self.directory).free
    except OSError:
      return
    if free < self._checkpoint_size():
      self.wait()  # the earlier checkpoints are complete before the error says which one is the latest
      raise self._out_of_space(step)

  def _remove_unfinished(self) -> list[int]:
    """Remove orbax's temporary directories (saves that never completed); returns their steps."""
    removed = []
    if jax.process_index() != 0:
      return removed
    directory = str(self._manager.directory)
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
      if ".orbax-checkpoint-tmp" in name:
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
        prefix = name.split(".")[0]
        removed += [int(prefix)] if prefix.isdigit() else []
    self._manager.reload()
    return removed

  def _remove_unfinished_for_good(self, quiet: float = 1.0, timeout: float = 10.0) -> list[int]:
    """``_remove_unfinished`` until no temporary directory has come back for ``quiet`` seconds (``timeout`` at
    most): the other writes of a failed save go on in tensorstore's own threads, which no Python handle reaches,
    and each recreates the folders it writes into (seen under load: a ``<step>.orbax-checkpoint-tmp`` back
    within 3 s of its removal)."""
    removed = self._remove_unfinished()
    if jax.process_index() != 0:
      return removed
    deadline, last_seen = time.monotonic() + timeout, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - last_seen < quiet:
      time.sleep(0.1)
      again = self._remove_unfinished()
      if again:
        removed += again
        last_seen = time.monotonic()
    return sorted(set(removed))

  def _out_of_space(self, step: int | None, too_large: bool = False) -> WorkdirError:
    """After a save found the disk full (or, ``too_large``, a file past the process's file-size limit, ``ulimit
    -f``): wait out the save in flight, remove every half-written checkpoint and return the one-line error (the
    workdir, the space needed and free or the limit, the step to resume)."""
    self._failed = True
    try:
      self._manager.wait_until_finished()
    except Exception:  # the same full disk: reported once, below
      pass
    join_orbax_workers()
    collect_orbax_leftovers()
    removed = self._remove_unfinished_for_good()
    failed = sorted(set(removed) | ({step} if step is not None else set()))
    needed = self._checkpoint_size()
    try:
      free = shutil.disk_usage(self.directory).free
    except OSError:
      free = 0
    latest = max(self.steps(), default=None)
    what = f"checkpoint step {', '.join(map(str, failed))}" if failed else "a checkpoint"
    # Before the first checkpoint is measured, ``needed`` counts the arrays alone and may be below what is free.
    space = (f"it needs about {format_bytes(needed)} and {format_bytes(free)} are free" if free < needed
             else f"it needs more than the {format_bytes(free)} that are free")
    then = (f"rerun the same command to resume from the latest intact checkpoint, step {latest}" if latest is not None
            else "rerun with --config.restart=True to start again (no checkpoint was saved)")
    if too_large:
      error = file_too_large_error(str(self._manager.directory), what, then)
      return WorkdirError(f"{error} Nothing half-written was kept.")
    return WorkdirError(
        f"no space left on the disk of {self.directory} to save {what}: {space}; nothing half-written was kept. "
        f"Free space there (or move the workdir to a larger disk), then {then}.")

  def _restore_verified(self, step: int, abstract_state) -> tuple[Any, dict]:
    """Restore ``step`` (only the parameters for a ``SavedParams`` target) and check each restored array
    against the checksum recorded when it was saved; scanned stacks of the target are read per layer and
    stacked."""
    target, abstract_state = abstract_state, unstack_layers(abstract_state, self.layer_axis)
    if isinstance(abstract_state, SavedParams):
      state_args = ocp.args.PyTreeRestore(item=abstract_state, partial_restore=True,
                                          restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state))
    else:
      state_args = ocp.args.StandardRestore(abstract_state)
    restored = self._manager.restore(step, args=ocp.args.Composite(state=state_args, extra=ocp.args.JsonRestore()))
    state, extra = restored["state"], dict(restored["extra"])
    # A partial restore hands back the target's own leaf where the checkpoint lacks an array.
    missing = [jax.tree_util.keystr(path) for path, leaf in jax.tree_util.tree_leaves_with_path(state)
               if isinstance(leaf, jax.ShapeDtypeStruct)]
    if missing:
      raise ValueError(f"the checkpoint holds no {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}")
    # Checkpoints written before device fingerprints hold SHA-256 digests of the leaves' bytes; older ones neither.
    expected = extra.pop("fingerprints", None) or {}
    digests = extra.pop("checksums", None) or {}
    recorded = extra.pop("extra_checksum", None)
    if recorded is not None and recorded != extra_checksum(extra):
      raise ValueError("checksum mismatch: its data position or metrics window (the extra item) changed since it "
                       "was saved")
    if self.run and extra.get("run", self.run) != self.run:
      raise CheckpointOfAnotherRun(
          f"checkpoint step {step} in {self._manager.directory} belongs to another run (its record is not "
          f"{os.path.join(self.directory, 'config.json')}'s): was it copied from another workdir? Move it out of "
          "checkpoints/ (back to its own run), or give that run's --workdir.")
    actual, _ = state_fingerprints(state) if expected or not digests else state_checksums(state)
    expected = expected or digests
    changed = [name for name, digest in actual.items() if name in expected and expected[name] != digest]
    if changed:
      raise ValueError(f"checksum mismatch: the data of {len(changed)} array(s) changed since they were "
                       f"saved ({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''})")
    if target is not abstract_state:  # stacked where the target is, placed as the target says
      state = jax.tree.map(lambda leaf, like: jax.device_put(leaf, like.sharding) if like.sharding else leaf,
                           stack_layers(state, target, self.layer_axis), target)
    return state, extra

  def _move_aside(self, step: int) -> str:
    """Rename a damaged step directory to ``<step>.damaged-<UTC time>`` (never deleted: it may be rescued);
    returns what became of it, for the warning line."""
    if not self.repair or jax.process_index() != 0:
      return "left in place"
    source = os.path.join(str(self._manager.directory), str(step))
    target = f"{source}.damaged-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    try:
      os.rename(source, target)
    except OSError as error:
      return f"could not move it aside ({_one_line(error)})"
    self._manager.reload()
    return f"moved the damaged checkpoint to {os.path.basename(target)}"

  def restore(self, abstract_state, step: int | None = None, best: bool = False) -> tuple[int, Any, dict] | None:
    """Restore onto ``abstract_state`` (ShapeDtypeStructs with the wanted shardings).

    ``best=False`` (resuming): the newest checkpoint, then older ones. ``best=True`` (evaluating): the best
    checkpoint, then the others, newest first. ``step``: consider only steps up to it. Each failure
    (unreadable, truncated, checksum mismatch) is one warning line once the outcome is known (which step is
    used instead, whether it was moved aside: with ``repair``, once an older checkpoint restores). Returns None
    when there is no checkpoint (or none restores and ``discard_unrestorable``), ``(step, state, extra)``
    otherwise.

    Raises:
      CheckpointRestoreError: checkpoints exist but none restores.
    """
    candidates = sorted(self._manager.all_steps(), reverse=True)
    best_step = self.best_step() if best else None
    if best_step is not None:
      candidates = [best_step] + [s for s in candidates if s != best_step]
    if step is not None:
      candidates = [c for c in candidates if c <= step]
    if not candidates:
      return None
    failed = []  # (step, error line)
    for candidate in candidates:
      restored = None
      try:
        restored = self._restore_verified(candidate, abstract_state)
      except CheckpointOfAnotherRun as error:  # not damage: nothing to fall back to, unless starting over
        if not (self.discard_unrestorable and self.repair):
          raise
        failed.append((candidate, _one_line(error)))
      except Exception as error:  # a corrupt, truncated or altered checkpoint: fall back to the previous one
        failed.append((candidate, _one_line(error)))
      if restored is None:
        collect_orbax_leftovers()  # outside the except block, which keeps the failed reads alive
        continue
      state, extra = restored
      where = f"step {candidate} in {self._manager.directory}"
      using = (f"the best checkpoint is damaged; using the latest good checkpoint, {where}"
               if best_step is not None and candidate != best_step else f"restored {where} instead")
      for failed_step, error in failed:  # this one restoring shows the others are damaged
        log.warning("cannot restore checkpoint step %d in %s (%s); %s; %s", failed_step, self._manager.directory,
                    error, self._move_aside(failed_step), using)
      return candidate, state, extra
    if self.discard_unrestorable and self.repair:
      for failed_step, error in failed:
        log.warning("cannot restore checkpoint step %d in %s (%s); %s; none restores: starting again "
                    "(config.restart)", failed_step, self._manager.directory, error, self._move_aside(failed_step))
      return None
    raise CheckpointRestoreError(
        "checkpoints exist but none could be restored (" + "; ".join(
            f"step {s} in {self._manager.directory}: {e}" for s, e in failed) + "). Refusing to start from scratch. "
        "If the config changed since they were saved (optimizer, number of seeds), set it back; if they are "
        "damaged, " + ("rerun with --config.restart=True to move them aside and start again, or choose another "
        "--workdir." if self.repair else "no model of this run can be read: train it again (--mode=train with "
        "--config.restart=True moves them aside)."))

  def average_params(self, abstract_state, count: int) -> tuple[list[int], Any]:
    """The mean parameters of the last ``count`` kept checkpoints (Vaswani et al. 2017 averaged the last 5),
    restored one at a time onto ``abstract_state`` so memory holds two copies at most.

    Returns:
      ``(steps, params)``: the averaged steps, oldest first, and the mean of their ``state.params``.

    Raises:
      ConfigError: ``count`` is below 1.
      MissingDataError: fewer than ``count`` checkpoints are kept; the message names the kept steps.
      CheckpointRestoreError: one of them is damaged (its checksum does not match).
    """
    kept = self.steps()
    if count < 1:
      raise ConfigError(f"config.average_checkpoints={count}: give how many of the last checkpoints to average "
                        "(>= 1), or 0 to use the best checkpoint alone.")
    if len(kept) < count:
      fix = (f"train with config.keep_checkpoints >= {count} (this run keeps {self.keep})" if self.keep < count
             else f"train longer, until {count} checkpoints exist")
      raise MissingDataError(
          f"config.average_checkpoints={count}, but the run in {self.directory} has only {len(kept)} checkpoint(s) "
          f"(steps {', '.join(map(str, kept)) or 'none'}): give --config.average_checkpoints={len(kept)} or fewer, "
          f"or {fix}.")
    steps = kept[-count:]
    mean = None
    for index, step in enumerate(steps):
      try:
        state, _ = self._restore_verified(step, abstract_state)
      except CheckpointOfAnotherRun:
        raise
      except Exception as error:
        raise CheckpointRestoreError(f"cannot average step {step} in {self._manager.directory}: "
                                     f"{_one_line(error)}") from error
      params = state.params
      # Running mean: mean_k = mean_{k-1} + (params_k - mean_{k-1}) / k.
      mean = params if mean is None else jax.tree.map(lambda m, p: m + (p - m) / (index + 1), mean, params)
    return steps, mean

  def wait(self) -> None:
    """Block until asynchronous saves have finished.

    Raises:
      WorkdirError: one of them found the disk full (see ``save``).
    """
    try:
      self._manager.wait_until_finished()
      return
    except Exception as error:
      if not is_write_refused(error):
        raise
      too_large = is_file_too_large(error)
    raise self._out_of_space(None, too_large)

  def close(self) -> None:
    """Wait for the saves in flight (raising as ``wait``) and release orbax's threads."""
    try:
      if not self._failed:
        self.wait()
    finally:
      try:
        self._manager.close()
      except Exception:
        if not self._failed:  # after a full disk, closing raises that error again: it was reported
          raise


_LANES = (0x9E3779B1, 0x85EBCA77)
_FINAL = (0x85EBCA6B, 0xC2B2AE35)


def _words(leaf) -> jax.Array:
  """``leaf``'s bits as a flat uint32 array (narrower types widened, 64-bit ones split in two words)."""
  if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(leaf)
  if leaf.dtype == jnp.bool_:
    leaf = leaf.astype(jnp.uint8)
  width = leaf.dtype.itemsize
  if width == 8:
    return jax.lax.bitcast_convert_type(leaf, jnp.uint32).reshape(-1)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[width]
  return jax.lax.bitcast_convert_type(leaf, unsigned).reshape(-1).astype(jnp.uint32)


def _fingerprint(leaf) -> tuple[jax.Array, jax.Array]:
  """``(lanes, non_finite)``: uint32 ``[2]`` fingerprint of ``leaf`` and whether a float leaf holds NaN/inf."""
  words = _words(leaf)
  position = jnp.arange(words.shape[0], dtype=jnp.uint32)
  lanes = []
  for multiplier in _LANES:
    mixed = words ^ (position * jnp.uint32(multiplier) + jnp.uint32(multiplier >> 7))
    mixed = (mixed ^ (mixed >> 16)) * jnp.uint32(_FINAL[0])
    mixed = (mixed ^ (mixed >> 13)) * jnp.uint32(_FINAL[1])
    lanes.append(jnp.sum(mixed ^ (mixed >> 16), dtype=jnp.uint32))
  inexact = jnp.issubdtype(leaf.dtype, jnp.inexact)
  return jnp.stack(lanes), (~jnp.all(jnp.isfinite(leaf))) if inexact else jnp.zeros((), bool)


@jax.jit
def _fingerprint_leaves(leaves):
  """uint32 ``[leaves, 2]`` and bool ``[leaves]`` of ``_fingerprint`` for every leaf, in one program."""
  lanes, non_finite = zip(*(_fingerprint(leaf) for leaf in leaves))
  return jnp.stack(lanes), jnp.stack(non_finite)


def _on_host(array) -> np.ndarray:
  """A small result of the devices on this host (gathered from every process when it spans several)."""
  if isinstance(array, jax.Array) and not array.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
  return np.asarray(array)


def _dtype_name(leaf) -> str:
  return "key" if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) else np.dtype(leaf.dtype).str


def state_fingerprints(state) -> tuple[dict[str, str], list[str]]:
  """``(fingerprints, non_finite)``: ``"<dtype><shape>:<16 hex digits>"`` of each array leaf by tree path,
  computed on the leaves' devices (every process of a multi-process run calls it, like a save), and the paths
  of floating-point leaves holding a NaN or infinity."""
  named = [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(state)
           if hasattr(leaf, "dtype") and hasattr(leaf, "shape")]
  if not named:
    return {}, []
  lanes, non_finite = _fingerprint_leaves([leaf for _, leaf in named])
  lanes, non_finite = _on_host(lanes), _on_host(non_finite)
  fingerprints = {name: f"{_dtype_name(leaf)}{tuple(leaf.shape)}:{int(lane[0]):08x}{int(lane[1]):08x}"
                  for (name, leaf), lane in zip(named, lanes)}
  return fingerprints, [name for (name, _), bad in zip(named, non_finite) if bad]


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


def extra_checksum(extra: dict) -> str:
  """SHA-256 of the JSON of a checkpoint's ``extra`` item (data position, metrics window, ...): an edited one
  would resume other data without a word."""
  return hashlib.sha256(json.dumps(extra, sort_keys=True).encode()).hexdigest()


def _is_closed_loop_error(error: BaseException | None) -> bool:
  return isinstance(error, RuntimeError) and str(error) == "Event loop is closed"


class _OrbaxAftermathFilter(logging.Filter):
  """Drops the log records that a failed orbax save or restore leaves behind in its worker threads, each a
  copy of the error that ``Checkpointer`` raises or reports in one line: asyncio's "Task (or Future)
  exception was never retrieved" / "Task was destroyed but it is pending" for orbax's tasks, and orbax's own
  tracebacks of a full disk (it logs one per background thread, then raises the same error in
  ``wait_until_finished``). Also orbax's warning at every save without metrics when a best metric is tracked:
  a step saved without an evaluation is expected, not a mistake."""

  def filter(self, record: logging.LogRecord) -> bool:
    if str(record.msg).startswith("Requested `tracked_metric`; did not provide metrics"):
      return False
    if record.name == "asyncio":
      message = str(record.msg)
      first_line = message.split("\n", 1)[0]
      leftover = first_line.endswith(("exception was never retrieved", "was destroyed but it is pending!"))
      return not (leftover and ("orbax" in message or (record.exc_info and is_write_refused(record.exc_info[1]))))
    from_orbax = f"{os.sep}orbax{os.sep}checkpoint{os.sep}" in (record.pathname or "")
    return not (from_orbax and record.exc_info and is_write_refused(record.exc_info[1]))


_aftermath_filter = _OrbaxAftermathFilter()


def quiet_orbax_aftermath() -> None:
  """Silence what a failed orbax save or restore prints after the error itself (idempotent).

  Orbax runs each save or restore on a fresh event loop and closes it as soon as the first tensorstore read
  or write fails; the other reads and writes of that checkpoint still finish later and call
  ``loop.call_soon_threadsafe`` on the closed loop. Each such call prints a "RuntimeError: Event loop is
  closed" traceback through ``sys.unraisablehook`` (hundreds for one damaged checkpoint) long after the
  checkpoint was skipped. Nothing can be done on a closed loop, so those, and only those, are dropped.
  """
  if getattr(sys.unraisablehook, "_drops_closed_loop_errors", False):
    return
  previous = sys.unraisablehook

  def hook(unraisable):
    if not _is_closed_loop_error(unraisable.exc_value):
      previous(unraisable)

  hook._drops_closed_loop_errors = True
  sys.unraisablehook = hook
  for name in ("absl", "asyncio"):
    logger = logging.getLogger(name)
    if _aftermath_filter not in logger.filters:
      logger.addFilter(_aftermath_filter)


def join_orbax_workers(timeout: float = 60.0) -> None:
  """Wait (up to ``timeout`` seconds in all) for orbax's worker threads to end.

  When one write of an asynchronous save fails, orbax raises at once, while its other writes of that
  checkpoint go on in their own threads (and recreate the temporary directory a cleanup just removed, or fail
  at interpreter exit with more tracebacks). Orbax keeps no handle to them for a caller, so they are found by
  their class's module."""
  deadline = time.monotonic() + timeout
  for thread in threading.enumerate():
    if thread is not threading.current_thread() and type(thread).__module__.startswith("orbax."):
      # The base class's join: orbax's own re-raises the thread's error, which is being reported already.
      threading.Thread.join(thread, max(deadline - time.monotonic(), 0))


def collect_orbax_leftovers() -> None:
  """Collect now the coroutines a failed orbax operation created and never awaited (the writes or reads
  after the one that failed), so that their "coroutine ... was never awaited" warnings, copies of the error
  already reported, are dropped here instead of printed at exit. Call it once the error is no longer
  referenced (outside its ``except`` block): its traceback keeps them alive."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
    gc.collect()
