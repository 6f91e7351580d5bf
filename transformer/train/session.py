"""A run's session: the checks and pieces every mode shares, made once by ``prepare``.

``prepare`` takes a run's ``RunConfig`` (checked when it was resolved) and the workdir (a training run's lock), builds the task,
the parallelism and the checkpointer, and holds the run to its record:

- ``config.json`` is written once, when a run starts; it is never rewritten. A later command (a resume, an
  evaluation) whose settings differ from the record in anything that changes the run's results is refused in
  one line naming each field (``old -> new``). Raising ``num_train_steps`` (to extend a run) and the settings
  that only change what is logged or where data is read are allowed; ``config.accept_changes`` names others
  to allow. Every allowed change is appended to ``config_history.jsonl`` (step, field, old, new), which
  ``RunDirectory.config`` applies on top of ``config.json``.
- Read-only modes (eval, predict, translate) write nothing into a workdir that holds no run.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import os
import shutil
import sys
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from transformer.data.files import write_atomically
from transformer.effects import Effect, effect_of
from transformer.errors import ConfigError, MissingDataError, WorkdirError
from transformer.tasks import TranslatesText, WritesPredictions
from transformer.train.replicas import SWEEPABLE
from transformer.train.run_config import RunConfig, build_task
from transformer.train.checkpoint import Checkpointer
from transformer.train.config import check_workdir, refuse_url_workdir
from transformer.train.parallel import make_strategy
from transformer.train.run_directory import (CONFIG, DATA_FINGERPRINT, HISTORY, LAUNCHES, MODEL_CONFIG,
                                             RunDirectory)
from transformer.train.run_format import require_current_format, write_format
from transformer.train.saved_run import config_differences, record_defaults
from transformer.train.workdir import (check_shared_workdir, check_tokenizers, check_writable, lock_workdir,
                                       refuse_foreign_folder)


@dataclasses.dataclass
class Session:
  """What every mode shares, made by ``prepare``: the run's config, its task and model, the parallelism, the
  checkpointer, and which process this is. ``info`` is where progress lines go (stderr in translate mode, so
  that translations stand alone on stdout)."""
  run_config: RunConfig
  workdir: str
  mode: str
  task: object
  model_config: object
  strategy: object
  checkpointer: Checkpointer
  process_index: int
  process_count: int
  info: object
  lock: object = None  # the workdir's training lock (train mode, main process), released when training ends
  started: float = dataclasses.field(default_factory=time.perf_counter)  # when ``prepare`` began (goodput)

  @property
  def directory(self) -> RunDirectory:
    return RunDirectory(self.workdir)

  @property
  def is_main(self) -> bool:
    return self.process_index == 0

  @property
  def host_batch_size(self) -> int:
    return self.run_config.batch_size // self.process_count

  @property
  def num_replicas(self) -> int:
    return self.run_config.replicas.count

  def say(self, text: str) -> None:
    """Print a progress line from the main process."""
    if self.is_main:
      print(text, file=self.info, flush=True)


def prepare(run_config: RunConfig, workdir: str, mode: str) -> Session:
  """Build ``run_config``'s task, parallelism and checkpointer for ``mode``, and hold the run to its record
  (``config.json``, ``model_config.json``, the tokenizers it trained with)."""
  started = time.perf_counter()
  created = mode == "train" and not os.path.exists(workdir)
  if mode != "train":
    _require_a_run(workdir, mode)  # before anything is created in the workdir
  else:
    refuse_foreign_folder(workdir, run_config.restart)
    check_workdir(workdir)
    check_shared_workdir(workdir)  # before the lock: a workdir per host would give each process its own
  _check_parallelism(run_config, jax.process_count())
  lock = lock_workdir(workdir, mode)  # one training run per workdir (None in other modes)
  try:
    return _build_session(run_config, workdir, mode, lock, started)
  except BaseException:
    if lock is not None:
      lock.release()
    if created and jax.process_count() == 1:  # a start that failed (missing data, ...) leaves nothing behind
      shutil.rmtree(workdir, ignore_errors=True)
    raise


def _build_session(run_config: RunConfig, workdir: str, mode: str, lock, started: float) -> Session:
  task = _build_task_once(run_config)
  _check_task_supports(run_config, task, mode)
  model_config = task.model_config()
  strategy = make_strategy(run_config.parallelism, run_config.replicas.count, run_config.fsdp,
                           run_config.replicas.settings(), run_config.tensor_parallelism)
  _check_batch_divides(run_config, strategy.num_devices, jax.process_count())
  checkpointer = Checkpointer(workdir, keep=run_config.keep_checkpoints, asynchronous=run_config.async_checkpointing,
                              best_metric=run_config.best_metric or None, best_mode=run_config.best_mode,
                              repair=lock is not None, discard_unrestorable=run_config.restart)
  session = Session(run_config, workdir, mode, task, model_config, strategy, checkpointer, jax.process_index(),
                    jax.process_count(), sys.stderr if mode == "translate" else sys.stdout, lock, started)
  has_checkpoints = checkpointer.has_checkpoints()
  check_workdir_model(workdir, model_config, has_checkpoints, write=session.is_main and mode == "train")
  check_tokenizers(workdir, task.trained_tokenizers(), has_checkpoints, write=session.is_main and mode == "train")
  if mode != "train":  # training holds a run to its record once it knows whether it resumes (hold_to_record)
    hold_to_record(session, resuming=True)
  session.say(f"devices: {jax.device_count()} x {jax.devices()[0].platform}, processes: {session.process_count}, "
              f"parallelism: {strategy.name}")
  return session


def _require_a_run(workdir: str, mode: str) -> None:
  """Eval, predict and translate read a run: refuse, writing nothing, where there is none (or at a URL)."""
  refuse_url_workdir(workdir)
  if not os.path.isdir(workdir):
    raise WorkdirError(f"--mode={mode}: --workdir={workdir} does not exist; give the workdir of a trained run.")
  if not RunDirectory(workdir).has_checkpoints():
    raise WorkdirError(f"--mode={mode}: --workdir={workdir} holds no checkpoint (no checkpoints/ or best/); "
                       "train first (--mode=train), or give the workdir of a trained run.")
  if mode in ("eval", "predict"):  # they write their results there: find out before decoding, not after
    check_writable(workdir, f"--mode={mode} writes its results into --workdir")


def _check_task_supports(run_config: RunConfig, task, mode: str) -> None:
  if mode == "translate" and not isinstance(task, TranslatesText):
    raise ConfigError(f"--mode=translate needs a task that translates text; config.task.name="
                      f"{run_config.task.name!r} ({type(task).__name__}) does not. Use --mode=eval or --mode=predict.")
  if mode == "predict" and not isinstance(task, WritesPredictions):
    raise ConfigError(f"--mode=predict needs a task that writes predictions; config.task.name={run_config.task.name!r} "
                      f"({type(task).__name__}) does not. Use --mode=eval.")
  loss_parameters = inspect.signature(task.loss_and_metrics).parameters
  if "label_smoothing" in run_config.replicas.swept and "label_smoothing" not in loss_parameters:
    others = [field for field in SWEEPABLE if field != "label_smoothing"]
    raise ConfigError(f"config.sweep={run_config.sweep!r} sweeps label_smoothing, but the loss of "
                      f"{type(task).__name__} is not label-smoothed; sweep {others} only.")


def _build_task_once(run_config: RunConfig):
  """``build_task(run)``, its data prepared by process 0 alone before the others read it: processes preparing
  the same files at once race on TFDS's renames (and tokenizer training)."""
  if jax.process_count() == 1:
    return build_task(run_config)
  task = None
  if jax.process_index() == 0:
    try:
      task = build_task(run_config)
    finally:  # on an error too: the others must not wait for data that will never come
      prepared = multihost_utils.broadcast_one_to_all(np.int32(task is not None))
  else:
    prepared = multihost_utils.broadcast_one_to_all(np.int32(0))
  if not prepared:
    raise MissingDataError("process 0 could not prepare the data (its output names the problem); fix that and "
                           "rerun every process.")
  return task if task is not None else build_task(run_config)


def _check_parallelism(run_config: RunConfig, process_count: int) -> None:
  """Several processes train one model only on the mesh: ``jit`` would train a model per process and ``pmap``
  holds arrays that no checkpoint can gather across hosts."""
  if process_count > 1 and run_config.parallelism != "mesh":
    raise ConfigError(
        f"config.parallelism={run_config.parallelism!r} does not span processes: with {process_count} processes "
        f"{'each would train its own model' if run_config.parallelism == 'jit' else 'its arrays stay on each host'}. "
        "Use --config.parallelism=mesh (data parallel over every device of every process; add "
        "--config.fsdp=True to shard the parameters)"
        + (", and --config.num_seeds=1 without config.sweep (seeds and variants are vmapped on one "
           "process only)" if run_config.replicas.count > 1 else "") + ".")


def _check_batch_divides(run_config: RunConfig, num_devices: int, process_count: int) -> None:
  if run_config.batch_size % (num_devices * run_config.grad_accum_steps) and run_config.parallelism != "jit":
    raise ConfigError(f"config.batch_size={run_config.batch_size} must be divisible by the {num_devices} "
                      f"devices times grad_accum_steps={run_config.grad_accum_steps} for parallelism="
                      f"{run_config.parallelism!r}.")
  if run_config.batch_size % process_count:
    raise ConfigError(f"config.batch_size={run_config.batch_size} must be divisible by the {process_count} processes.")


def check_workdir_model(workdir: str, model_config, has_checkpoints: bool, write: bool) -> None:
  """A workdir belongs to one model: refuse checkpoints of a different architecture. ``write`` (a training
  run's main process) records ``model_config.json`` when the run starts; it is never rewritten after. A run
  saved in an older format is refused (``run_format``) before its record is compared."""
  directory = RunDirectory(workdir)
  path = directory.path(MODEL_CONFIG)
  current = dataclasses.asdict(model_config)
  if has_checkpoints and os.path.exists(path):
    require_current_format(workdir)
    saved = directory.read_json(MODEL_CONFIG)
    # Dropout, kernels and how the same layers are recomputed (``Effect.LAYOUT``: remat) leave the parameters as
    # they are, so a resumed run may change them.
    ignored = ("deterministic", "decode", "dropout_rate", "attention_dropout_rate", "feed_forward_dropout_rate",
               "kernels", *(field.name for field in dataclasses.fields(model_config)
                            if effect_of(field) is Effect.LAYOUT))
    # A field added since the run was saved compares as its default (which keeps the saved model's behaviour).
    defaults = {field.name: field.default for field in dataclasses.fields(model_config)}
    differences = [f"{k}: {saved.get(k, defaults.get(k))!r} -> {current.get(k)!r}"
                   for k in sorted(set(saved) | set(current))
                   if k not in ignored and saved.get(k, defaults.get(k)) != current.get(k)]
    if differences:
      raise ConfigError(f"--workdir={workdir} holds checkpoints of a different model ({'; '.join(differences)}). "
                        "Use a new --workdir, or set the model back to match.")
    return
  if write:
    write_atomically(path, json.dumps(current, indent=2, sort_keys=True))


def hold_to_record(session: Session, resuming: bool, write_history: bool = False) -> None:
  """A run starting (not ``resuming``) writes its record: ``config.json`` and the data's fingerprint. A resume or
  a read-only mode compares its config and data with the record: a difference that changes results and is
  not accepted is refused; one that is allowed goes to the history with ``write_history`` (training that goes
  on from a restored checkpoint)."""
  _hold_to_config(session, resuming, write_history)
  _hold_to_data(session, resuming, write_history)


def _hold_to_config(session: Session, resuming: bool, write_history: bool) -> None:
  run_config, workdir = session.run_config, session.workdir
  path = session.directory.path(CONFIG)
  if not resuming or not os.path.isfile(path):
    if session.is_main and session.mode == "train":
      write_format(workdir)  # first: config.json without it reads as an older run, to convert
      write_atomically(path, json.dumps(run_config.record, indent=2, sort_keys=True))
      session.say(f"config: {path}")
    return
  defaults = record_defaults(run_config)
  _check_accepted_names(run_config, defaults)
  changes = config_differences(session.directory.config_values(), run_config, session.mode)
  refused = [change for change in changes if not change.allowed and change.field not in run_config.accepted_changes]
  if refused:
    raise ConfigError(
        f"--workdir={workdir} was trained with other settings: "
        + "; ".join(f"{c.field}: {c.old!r} -> {c.new!r}" for c in refused)
        + ". Set them back, use a new --workdir, or accept the change with --config.accept_changes="
        + ",".join(c.field for c in refused) + f" (it is recorded in {HISTORY}).")
  if write_history:
    _append_history(session, [(c.field, c.old, c.new) for c in changes if c.recorded])


def _check_accepted_names(run_config: RunConfig, fields: dict) -> None:
  """``config.accept_changes`` names config fields (``a.b``) or ``data``: a misspelt one would accept nothing."""
  known = set(fields) | {"data"}
  for name in sorted(run_config.accepted_changes - known):
    close = difflib.get_close_matches(name, sorted(known), n=1)
    raise ConfigError(f"config.accept_changes names {name!r}, which is no config field"
                      + (f"; did you mean {close[0]!r}?" if close else "")
                      + " Give the fields as a command's refusal names them, e.g. optimizer.learning_rate, or data.")


def _append_history(session: Session, changes: list[tuple]) -> None:
  """Append ``(field, old, new)`` changes, from the run's latest checkpoint on, to its history (``HISTORY``)."""
  if not changes or not session.is_main or session.mode != "train":
    return
  step = max(session.checkpointer.steps() + [session.checkpointer.best_step() or 0])
  with open(session.directory.path(HISTORY), "a") as f:
    for field, old, new in changes:
      f.write(json.dumps({"step": step, "field": field, "old": old, "new": new}) + "\n")
  session.say(f"{HISTORY}: from step {step}, " + "; ".join(f"{field}: {old!r} -> {new!r}"
                                                              for field, old, new in changes))


def _hold_to_data(session: Session, resuming: bool, write_history: bool) -> None:
  """Record the fingerprint of the data a run starts on; refuse a later command on other data, unless
  ``config.accept_changes`` names ``data`` (recorded in the history like any accepted change)."""
  path = session.directory.path(DATA_FINGERPRINT)
  current = session.task.data_fingerprint()
  if not resuming or not os.path.isfile(path):
    if session.is_main and session.mode == "train" and current:
      write_atomically(path, json.dumps(current, indent=2, sort_keys=True))
    return
  recorded = session.directory.read_json(DATA_FINGERPRINT)
  if recorded == current:
    return
  changed = sorted(name for name in set(recorded) | set(current) if recorded.get(name) != current.get(name))
  if "data" not in session.run_config.accepted_changes:
    raise ConfigError(
        f"--workdir={session.workdir} was trained on other data: {', '.join(changed)} "
        f"({recorded.get(changed[0], 'absent')} then, {current.get(changed[0], 'absent')} now). Point the task "
        "at the run's data, use a new --workdir, or accept it with --config.accept_changes=data.")
  if write_history:
    _append_history(session, [("data", recorded, current)])
    if session.is_main:  # the run goes on with this data: later commands compare with it
      write_atomically(path, json.dumps(current, indent=2, sort_keys=True))


def record_launch(session: Session, step: int) -> None:
  """Append this training launch to the run's ``LAUNCHES``; a launch on other process or device counts than the
  one before says so in one line (the global batch and its order do not depend on them)."""
  launch = {"step": step, "processes": session.process_count, "devices": jax.device_count(),
            "platform": jax.devices()[0].platform, "parallelism": session.strategy.name,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
  launches = session.directory.launches()
  previous = launches[-1] if launches else None
  counts = ("processes", "devices")
  if step and previous and any(previous[name] != launch[name] for name in counts):
    session.say(f"elastic restore: the run's last launch (from step {previous['step']}) had {previous['processes']} "
                f"process(es) x {previous['devices']} devices, this one {launch['processes']} x {launch['devices']}, "
                f"from step {step}: the same global batches in the same order; losses equal up to the order of "
                "the sums.")
  if session.is_main:
    with open(session.directory.path(LAUNCHES), "a") as f:
      f.write(json.dumps(launch) + "\n")
