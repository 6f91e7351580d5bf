"""The training loop: ``Trainer``, its metrics window and where its time goes (goodput).

One loop for every experiment.

A run starts (or resumes exactly: parameters, optimizer, data position, metrics window) in ``Trainer``, then
steps through a short loop over periodic actions (``transformer.train.actions``, in the manner of CLU's): after
each compiled call, the preemption check, logging every ``log_every`` steps, evaluation every ``eval_every``
and each of ``config.evaluators`` on its own split and period, a checkpoint every ``checkpoint_every`` (and
after each evaluation, and when a signal asks to stop), and a ``jax.profiler`` trace of ``config.profile_steps``
steps. Each action reads what the actions before it returned in the same tick. Between actions the host never
waits for the device: batches are placed on it ahead of their step (``prefetch_to_device``), the train state's
buffers are donated to the step, and metrics stay on the device until an action reads them (``MetricsWindow``).
Each logging line carries where its window's time went (``time/step``, ``time/data``, ``time/evaluate``, ...).
With ``config.steps_per_call`` = k > 1, one compiled call runs k steps (a ``lax.scan`` over k stacked batches)
and the actions, due at multiples of k, run between calls; the results are those of one step per call.

The metrics of a logging window, kept on the device between the loop's actions.

A step's ``name -> (sum, weight)`` metrics stay where the step left them: ``add`` only keeps a reference (no
dispatch, no wait). When an action needs them (log, save, evaluate), one compiled call folds the window's
steps into their sums, in step order (the same additions, in the same order, as adding them one by one), and
finds the first step whose loss or gradient norm was not finite; the host then reads the result. A compiled
call of several steps (``config.steps_per_call``) hands over its steps' metrics stacked ``[steps, ...]``: they
are folded one step after the other, as if added one by one, so the sums are the same.

Goodput: the share of a run's time spent on steps that count, the rest split by where it went.

MaxText measures goodput from a cluster's event log (``ml-goodput-measurement``, which reads Google Cloud
Logging); here the loop times its own phases, so the figure needs no cloud service:

- ``launch``: from the process's start to the session's (imports, the ``jax.distributed`` join, the config);
- ``startup``: from the session's start to the first step (restore, data, the first placements);
- ``compile``: calls of the train step that traced a new program (their time is almost all compilation);
- ``data``: the loop waiting for its next batches (drawn and placed on the device ahead of their step);
- ``evaluate`` and ``checkpoint``: the loop's evaluation and saves (waits for asynchronous saves included);
- ``profile``: starting and stopping a ``config.profile_steps`` trace (writing it);
- ``step``: the rest of the loop, the productive part;
- ``redone``: steps trained again after a kill, an estimate: the steps logged past the checkpoint a run
  resumed from, at the run's mean step time (that session's time after its last checkpoint was never saved,
  so it is added here, not taken from ``step``);
- ``between_launches``: the rest of the job's wall time since its first launch's process started: a killed
  launch's time past its last checkpoint (beyond ``redone``), and the wait until the next launch (queue, requeue,
  restart). The wait after a run that finished, before it was extended, is idle, not the job's.

Sums carry over resumes in the checkpoint (``saved``); ``goodput.json`` in the workdir holds the latest, and the
goodput share is ``step`` over the whole job's time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import json
import os
import sys
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from transformer.data.files import write_atomically
from transformer.data.hosts import HostShard
from transformer.data.prefetch import BatchGroups, prefetch_to_device, stack_batches
from transformer.errors import ConfigError, TrainingDiverged
from transformer.train.actions import PREEMPT, Every, PreemptionCheck, Profile, Tick, WallClock, due_actions
from transformer.train.checkpoint import state_fingerprints
from transformer.train.config import RunConfig
from transformer.train.multihost import Preemption, launched_at
from transformer.train.state import initial_state, run_optimizer, run_schedules, state_factory
from transformer.train.step import all_finite, make_evaluator, make_train_step, means, replica_means
from transformer.train.workdir import (CHECKPOINTS, CONFIG, GOODPUT, METRICS, PROFILE, TENSORBOARD, RunDirectory, Session,
                                       check_fresh_start, hold_to_record, record_identity, record_launch)
from transformer.train.writers import (MetricWriter, StepCost, final_lines, log_line, progress_bar, shown_metrics,
                                       variant_tables)


@dataclasses.dataclass
class RunOutput:
  """What ``run`` returns: the last step, its evaluation metrics, the final (canonical) state, how many times
  the train step was compiled (1 unless shapes changed), a mode's text outputs (translations), and the signal
  that stopped training early (``"SIGINT"``, ``"SIGTERM"``; None when it ran to the end)."""
  step: int
  metrics: dict
  state: object
  train_step_compilations: int = 0
  outputs: list | None = None
  interrupted: str | None = None


def host_iterator(session: Session) -> HostShard:
  """This process's rows of the task's global training batches; refuses, before any step, batch shapes whose
  rows do not split over the devices (of every process)."""
  iterator = HostShard(session.task.train_iterator(session.run_config.batch_size, session.run_config.order_seed),
                       session.process_index, session.process_count)
  devices = session.strategy.num_devices
  uneven = sorted({shape[0] for shape in getattr(iterator.iterator, "batch_shapes", []) if shape[0] % devices})
  if uneven:
    iterator.close()
    raise ConfigError(f"batches of {', '.join(map(str, uneven))} rows do not split over the {devices} devices "
                      f"(of {session.process_count} process(es)); set --config.task.batch_size_multiple to a "
                      f"multiple of {devices}.")
  return iterator


def call_sizes(step: int, total: int, steps_per_call: int):
  """Steps of each compiled call from ``step`` to ``total``: ``steps_per_call`` each, every call ending at a
  multiple of it (where the actions are due), except single steps up to the first multiple (a run resumed
  from a checkpoint of another setting) and after the last (``total`` not a multiple)."""
  while step < total:
    size = steps_per_call if step % steps_per_call == 0 and step + steps_per_call <= total else 1
    step += size
    yield size


class CompiledCalls(NamedTuple):
  """The compiled train step: ``one_step(state, batch)``, and ``several_steps(state, stacked)`` running
  ``steps_per_call`` steps in one call (None when that is 1)."""
  one_step: Callable
  several_steps: Callable | None
  steps_per_call: int


class Trainer:
  """One training run: its state and data position, the compiled step, and the periodic actions."""

  def __init__(self, session: Session):
    self.session, self.run_config, self.task = session, session.run_config, session.task
    self.strategy, self.checkpointer = session.strategy, session.checkpointer
    self.model = self.task.build_model(session.model_config)
    self.optimizer = run_optimizer(self.run_config)
    self.iterator = host_iterator(session)
    create, abstract_state = state_factory(session, self.model, self.optimizer,
                                           self.task.init_inputs(self._first_batch_rows()))
    self.cost = step_cost(session, abstract_state.params)  # parameters, FLOPs per batch, the device's peak
    checked = self.checkpointer.has_checkpoints() and not self.run_config.restart
    if checked:  # before restoring: a changed setting is named, not reported as checkpoints that do not fit
      hold_to_record(session, resuming=True)
    restored = self.checkpointer.restore(abstract_state)
    if restored is None:  # never start over on an earlier run's outputs (unless config.restart)
      check_fresh_start(session.workdir, self.run_config.restart, self.run_config.checkpoint_every)
      if session.directory.has(CONFIG):  # starting over an earlier start that saved nothing: with its settings
        hold_to_record(session, resuming=True)
      hold_to_record(session, resuming=False)
      self.checkpointer.run = record_identity(self.run_config.record)  # the record just written
      self.step, self.state, extra = 0, initial_state(session, create), {}
    else:
      if not checked:
        hold_to_record(session, resuming=True)
      self.step, canonical, extra = restored
      self.state = self.strategy.from_canonical(canonical)
      self.iterator.set_state(extra["iterator"])
    self.checkpointer.prepare(self.strategy.to_canonical(self.state))
    self.start_step, self.position = self.step, self.iterator.get_state()
    session_started = time.time() - (time.perf_counter() - session.started)
    process_started = launched_at() or session_started  # a run started in a Python session counts no launch
    record_launch(session, self.step, process_started)
    self.wall_seconds_before = extra.get("wall_seconds", 0.0)  # of earlier (interrupted) sessions of this run
    self.window = MetricsWindow(self.strategy.fetch, extra)
    self.goodput = Goodput(extra.get("goodput"))
    finished_at = (session.directory.read_json(GOODPUT).get("finished_at")
                   if restored is not None and session.directory.has(GOODPUT) else None)
    self.goodput.start_launch(process_started, session_started, finished_at)
    if restored is not None:  # before the writer drops the lines past this step: the steps to train again
      self.goodput.redone(session.directory.metrics().last_step - self.step)
    self.results = {}

  def _first_batch_rows(self) -> dict:
    """Rows of the first batch, the shapes parameters are initialised for (the iterator is rewound)."""
    start = self.iterator.get_state()
    rows = max(1, self.session.host_batch_size // self.run_config.grad_accum_steps)
    self.first_batch = next(self.iterator)  # whole: the step's cost is announced at its shape
    batch = {k: np.asarray(v)[:rows] for k, v in self.first_batch.items()}
    self.iterator.set_state(start)
    return batch

  def report_finished(self) -> RunOutput:
    """A finished run: report it, train nothing."""
    self.session.say(f"already done: {self.session.workdir} is trained to step {self.step} (config.num_train_steps="
                     f"{self.run_config.num_train_steps}); raise --config.num_train_steps to train further.")
    self.results = self.session.directory.metrics().last_evaluation()
    _print_summary(self.session, self.step, self.results)
    self.checkpointer.close()
    return RunOutput(self.step, self.results, self.strategy.to_canonical(self.state))

  def train(self) -> RunOutput:
    """Train to ``config.num_train_steps`` or until a signal asks to stop; the outputs of the last step.

    The state was restored or initialised by ``__init__``; then: open the outputs, compile, and loop over the
    batch groups (placed on the devices ahead of their step), each one compiled call followed by the periodic
    actions due (``actions.py``: preemption check, log, evaluate, checkpoint, profile, stop); then finish."""
    if self.step:
      self.session.say(f"resumed from step {self.step} in {self.session.workdir}")
    self._open_outputs()
    self.calls, self.evaluators = self._compile(), self._evaluators()
    if self.step:  # the run goes on: its accepted changes enter the history now, not when a start fails
      hold_to_record(self.session, resuming=True, write_history=True)
    total = self.run_config.num_train_steps
    groups = BatchGroups(self.iterator, call_sizes(self.step, total, self.calls.steps_per_call))
    with Preemption() as preemption:
      actions = self._actions(preemption)
      try:
        self.goodput.start_loop(self.session.started)
        waiting = time.perf_counter()
        for host_batches, placed, position in prefetch_to_device(groups, self._place):
          self.goodput.add("data", time.perf_counter() - waiting)  # drawing (and placing) the batches ahead
          self._call(host_batches, placed)  # the steps: one compiled call
          self.position = position
          tick, outputs = Tick(self.step, last=self.step == total), {}
          for action in due_actions(actions, tick, outputs):  # in order: each reads what those before returned
            with self.goodput.timed(action.phase):
              outputs[action.name] = action.run(tick, outputs)
          self.results = outputs.get("eval", self.results)
          if tick.last or outputs.get(PREEMPT):
            break
          waiting = time.perf_counter()
      except TrainingDiverged:
        self.checkpointer.wait()  # the saves before the divergence are the run's last finite states
        raise
      finally:
        for action in actions:  # a profiler trace still running (the loop ended by an error)
          getattr(action, "close", lambda: None)()
    self.bar.close()
    self._finish(preemption.requested)
    return RunOutput(self.step, self.results, self.strategy.to_canonical(self.state), self.strategy.trace_count,
                     interrupted=preemption.requested)

  def _open_outputs(self) -> None:
    """Where the run reports: the progress bar (or a line per log), ``metrics.jsonl`` and TensorBoard."""
    run_config, session = self.run_config, self.session
    self.bar = progress_bar(run_config.num_train_steps, self.step, run_config.quiet or not session.is_main)
    self.writer = MetricWriter(session.workdir, resume_step=self.step, enabled=session.is_main,
                               tensorboard=run_config.tensorboard)
    self.run_start = time.perf_counter()
    if not run_config.quiet:
      session.say(self.cost.describe(self.first_batch))  # parameters, FLOPs per step, the device's peak
    # Bucketed data (translation) compiles the step once per batch shape: say so, or the first minutes are silent.
    self.seen_shapes = set()

  def _compile(self) -> CompiledCalls:
    """The train step, compiled for one step per call and for ``config.steps_per_call`` (traced when first run)."""
    run_config = self.run_config
    self.schedules = run_schedules(run_config)  # one per variant of config.sweep
    train_step = make_train_step(
        self.task, self.model, self.optimizer, run_config.grad_accum_steps, getattr(self.strategy, "axis_name", None),
        skip_nonfinite_steps=run_config.skip_nonfinite_steps,
        frozen_params=run_config.optimizer.frozen_params,
        variant_schedules=self.schedules if run_config.replicas.sweeps_schedule else None)
    several = (self.strategy.compile_train_step(train_step, run_config.steps_per_call)
               if run_config.steps_per_call > 1 else None)
    return CompiledCalls(self.strategy.compile_train_step(train_step), several, run_config.steps_per_call)

  def _evaluators(self) -> dict:
    """``name -> evaluate(state)``: ``"eval"`` (the eval split, the task's own evaluation), and a split's loss
    metrics for each of ``config.evaluators``."""
    session = self.session
    eval_model = self.task.build_model(session.model_config.replace(deterministic=True))
    evaluators = {"eval": make_evaluator(session, eval_model, write=self.bar.write)}
    evaluators.update({split: _split_evaluator(session, eval_model, split)
                       for split in _checked_evaluator_splits(self.task, self.run_config)})
    return evaluators

  def _actions(self, preemption: Preemption) -> list:
    """The periodic actions, in the order they run at a tick (each reads the results of those before it)."""
    run_config, session = self.run_config, self.session
    actions = [PreemptionCheck(preemption),
               Every("log", run_config.log_every, self.log),
               Every("eval", run_config.eval_every, self.evaluate, phase="evaluate")]
    actions += [Every(split, every, functools.partial(self.evaluate_split, split), phase="evaluate")
                for split, every in run_config.extra_evaluators]
    return actions + [
        Every("checkpoint", run_config.checkpoint_every, self.checkpoint, phase="checkpoint", on_stop=True,
              after=("eval",), clock=WallClock(run_config.checkpoint_every_seconds, run_config.log_every)),
        Profile(session.directory.path(PROFILE), run_config.profile_start, run_config.profile_steps,
                ready=lambda: self.state),
        Every("stop", 0, self.stop, phase="checkpoint", at_last=False, on_stop=True)]

  def _place(self, host_batches: list):
    """A call's batches on the device: stacked ``[steps_per_call, ...]`` for a several-step call, else a list
    (bucketed batches of different shapes, or a call of a single step)."""
    stacked = stack_batches(host_batches) if len(host_batches) == self.calls.steps_per_call > 1 else None
    if stacked is not None:
      return self.strategy.put_batches(stacked)
    return [self.strategy.put_batch(batch) for batch in host_batches]

  def _call(self, host_batches: list, placed) -> None:
    """Run the steps of one group of batches: one compiled call of several steps, or one call per step; a call
    that traced a new program counts as compilation."""
    compilations, start = self.strategy.trace_count, time.perf_counter()
    if not isinstance(placed, list):
      self._announce_compilation(host_batches[0], stacked=len(host_batches))
      self.state, metrics = self.calls.several_steps(self.state, placed)
      self.step += len(host_batches)
      tokens = sum(self.task.count_tokens(batch) for batch in host_batches)
      flops = sum(self.cost.flops(batch) or 0.0 for batch in host_batches)
      self.window.add(metrics, self.step, tokens, stacked=len(host_batches), flops=flops)
    else:
      for host_batch, batch in zip(host_batches, placed):
        self._announce_compilation(host_batch)
        self.state, metrics = self.calls.one_step(self.state, batch)
        self.step += 1
        self.window.add(metrics, self.step, self.task.count_tokens(host_batch),
                        flops=self.cost.flops(host_batch) or 0.0)
    self.bar.update(len(host_batches))
    if self.strategy.trace_count > compilations:
      seconds = time.perf_counter() - start
      self.goodput.add("compile", seconds)
      self.window.add_compilation(len(host_batches), seconds)  # the ETA's pace leaves compiling out

  def _announce_compilation(self, batch, stacked: int = 0) -> None:
    shape = " ".join(sorted({"x".join(map(str, np.shape(value))) for value in batch.values()}))
    shape += f", {stacked} steps per call" if stacked else ""
    if shape in self.seen_shapes:
      return
    self.seen_shapes.add(shape)
    if self.session.is_main and not self.run_config.quiet:
      known = getattr(self.iterator, "batch_shapes", None)
      of = f"/{max(len(known), len(self.seen_shapes))}" if known else ""
      self.bar.write(f"compiling the train step for batch shape {len(self.seen_shapes)}{of} ({shape})")
      sys.stdout.flush()

  def wall_seconds(self) -> float:
    return self.wall_seconds_before + time.perf_counter() - self.run_start

  def log(self, tick: Tick, outputs: dict) -> None:
    """Read the window's metrics (the host's one wait on the device between actions), write and show them."""
    run_config = self.run_config
    if not run_config.skip_nonfinite_steps:
      self.window.check_finite()
    sums, steps, tokens, seconds, pace, flops = self.window.read()
    logged = means(_unmeasured_as_nan(sums, steps), "train", run_config.num_seeds)
    rates = [float(schedule(self.step - 1)) for schedule in self.schedules]
    logged.update(replica_means("train/learning_rate", np.repeat(rates, run_config.num_seeds)
                                if run_config.replicas.sweeps_schedule else rates[0], run_config.num_seeds))
    logged["train/steps_per_second"] = steps / seconds
    if self.session.process_count > 1:  # each process counted its own rows; logging is due on all at once
      tokens = int(np.sum(multihost_utils.process_allgather(np.int64(tokens))))
    logged["train/tokens_per_second"] = tokens / seconds
    logged.update(self.cost.log_metrics(flops, seconds))  # TFLOP/s per device, MFU where the peak is known
    logged["wall_seconds"] = self.wall_seconds()
    logged.update(self.goodput.window())
    self.writer.write(self.step, logged)
    skipped = logged.get("train/skipped_steps")
    postfix = {"loss": f"{logged['train/loss']:.4f}", "tok_s": f"{logged['train/tokens_per_second']:.0f}"}
    self.bar.set_postfix(postfix if not skipped else {**postfix, "skipped": f"{skipped:g}/{steps}"})
    if self.bar.disable and self.session.is_main and not run_config.quiet:  # a log file: a line per logging step
      print(log_line(self.step, run_config.num_train_steps, logged, pace, steps), flush=True)
    if skipped is not None and skipped > run_config.max_skipped_share * steps:
      raise TrainingDiverged(
          f"training stopped at step {self.step}: {skipped:g} of the last {steps} steps were skipped (non-finite "
          f"loss or gradient), more than config.max_skipped_share={run_config.max_skipped_share}. The "
          "latest checkpoint is kept; lower config.optimizer.learning_rate (or set "
          "config.optimizer.grad_clip_norm), or raise config.max_skipped_share.")

  def evaluate(self, tick: Tick, outputs: dict) -> dict:
    """Evaluate the state, write and print the metrics; a best_metric the task lacks stops, saved."""
    if not self.run_config.skip_nonfinite_steps:
      self.window.check_finite()  # never spend an evaluation on a diverged state
    if tick.last:
      self.bar.close()  # on a terminal: the final evaluation prints below the finished bar, not inside it
    evaluated = self.evaluators["eval"](self.state)
    self._write_evaluation(evaluated)
    best_metric = self.run_config.best_metric
    if best_metric and best_metric not in evaluated:
      self.checkpoint(tick, {})  # keep the work: the fixed command resumes from here
      self.checkpointer.wait()
      reported = list(shown_metrics(evaluated))
      raise ConfigError(f"config.best_metric={best_metric!r} is not a metric this task reports; choose one of "
                        f"{reported} (step {self.step} is saved; rerun with the fix to resume).")
    return evaluated

  def evaluate_split(self, split: str, tick: Tick, outputs: dict) -> dict:
    """The loss metrics of ``split`` (an evaluator of ``config.evaluators``), written and printed."""
    if not self.run_config.skip_nonfinite_steps:
      self.window.check_finite()
    evaluated = self.evaluators[split](self.state)
    self._write_evaluation(evaluated)
    return evaluated

  def _write_evaluation(self, evaluated: dict) -> None:
    self.writer.write(self.step, {**evaluated, "wall_seconds": self.wall_seconds()})
    if self.session.is_main:
      self.bar.write(" ".join(f"{k}={v:.4f}" for k, v in shown_metrics(evaluated).items()) + f" (step {self.step})")
      sys.stdout.flush()

  def checkpoint(self, tick: Tick, outputs: dict) -> None:
    """Checkpoint the state, the data position and the metrics window (and the best copy, after an evaluation
    in the same tick)."""
    if not self.run_config.skip_nonfinite_steps:
      self.window.check_finite()  # never save a state after a non-finite step
    extra = {"wall_seconds": self.wall_seconds(), "iterator": self.position, **self.window.saved(),
             "goodput": self.goodput.saved(self.step - self.start_step)}
    self.checkpointer.save(self.step, self.strategy.to_canonical(self.state), extra, outputs.get("eval"))

  def stop(self, tick: Tick, outputs: dict) -> None:
    """A signal asked to stop: the checkpoint just saved is written, and the user told how to go on."""
    signal_name = outputs[PREEMPT]
    self.checkpointer.wait()
    self.bar.close()  # on a terminal the line below would be glued to the bar
    self.session.say(f"{signal_name}: saved a checkpoint at step {self.step}; rerun the same command to resume.")

  def _finish(self, interrupted: str | None) -> None:
    session = self.session
    if session.process_count > 1:  # lock-step check across hosts: every process prints a digest of its parameters
      print(f"params checksum (process {session.process_index} of {session.process_count}): "
            f"{_params_digest(self.strategy.to_canonical(self.state).params)}", flush=True)
    with self.goodput.timed("checkpoint"):
      self.checkpointer.wait()
    self.writer.close()
    record, line = self.goodput.summary(self.step - self.start_step)
    if session.is_main:
      finished = not interrupted and self.step >= self.run_config.num_train_steps
      write_goodput(session.workdir, {**record, **({"finished_at": time.time()} if finished else {})})
    if not interrupted:
      _print_summary(session, self.step, self.results, line)
    self.checkpointer.close()


def step_cost(session: Session, params_shapes) -> StepCost:
  """The run's ``StepCost`` (``writers``) over the devices that compute this process's rows: a mesh's model axis
  computes them too, and pmap's devices are this process's own."""
  strategy = session.strategy
  mesh = getattr(strategy, "mesh", None)
  devices = mesh.size // session.process_count if mesh is not None else strategy.num_devices
  return StepCost.of(session.run_config.model_name, session.model_config, params_shapes,
                     session.run_config.replicas.count, devices)


def _checked_evaluator_splits(task, run_config: RunConfig) -> list[str]:
  """The splits of ``config.evaluators``, if the task evaluates other splits than its eval split."""
  splits = [split for split, _ in run_config.extra_evaluators]
  if splits and "split" not in inspect.signature(task.eval_batches).parameters:
    raise ConfigError(f"config.evaluators={run_config.evaluators!r}: the {run_config.task.name!r} task evaluates "
                      "only its own eval split; leave config.evaluators empty for it.")
  return splits


def _split_evaluator(session: Session, eval_model, split: str):
  try:
    return make_evaluator(session, eval_model, split=split)
  except KeyError:
    raise ConfigError(f"config.evaluators={session.run_config.evaluators!r}: the {session.run_config.task.name!r} "
                      f"task has no split {split!r} loaded; name one of its splits (translation: the eval split or "
                      "one of config.task.test_splits).") from None


def _unmeasured_as_nan(sums: dict, steps: int) -> dict:
  """A replica whose every step of the window was skipped (non-finite) measured no loss: NaN, not 0."""
  if "skipped_steps" not in sums:
    return sums
  all_skipped = np.asarray(sums["skipped_steps"][0]) >= steps
  return {name: pair if name == "skipped_steps" else (np.where(all_skipped, np.nan, pair[0]), pair[1])
          for name, pair in sums.items()}


def _params_digest(params) -> str:
  """SHA-1 over the fingerprint of every parameter (``checkpoint.state_fingerprints``: each computed where its
  shards live, so nothing gathers the whole model onto a device; every process calls it, like a save)."""
  return hashlib.sha1(json.dumps(state_fingerprints(params)[0], sort_keys=True).encode()).hexdigest()


def _tensorboard_command(folder: str) -> str:
  """How to view ``folder``'s event files: the viewer is an extra the quick start does not install."""
  if importlib.util.find_spec("tensorboard") is not None:
    return f"tensorboard --logdir {folder}"
  return f'tensorboard --logdir {folder} (after pip install -e ".[tensorboard]")'


def _print_summary(session: Session, step: int, results: dict, goodput: str = "") -> None:
  """The end of a training run in a few lines: final and best metrics, where the outputs are, how to see them."""
  if not session.is_main:
    return
  run_config, directory = session.run_config, session.directory
  lines = [f"done: step {step} of {run_config.num_train_steps}"]
  lines += final_lines({name: value for name, value in shown_metrics(results).items() if "/variant_" not in name})
  tables = variant_tables(results, run_config.replicas.variant_names())  # a sweep: each variant's, not only the mean
  lines += [tables] if tables else []
  best_step = session.checkpointer.best_step()
  if run_config.best_metric and best_step is not None:
    values = [value for step, value in directory.metrics().values(run_config.best_metric) if step == best_step]
    value = f"={values[-1]:.4f}" if values else ""
    lines.append(f"best: {run_config.best_metric}{value} at step {best_step}: "
                 f"{os.path.join(directory.path(CHECKPOINTS), str(best_step))}")
  lines += [goodput] if goodput else []
  lines.append(f"checkpoints: {directory.path(CHECKPOINTS)}")
  lines.append(f"metrics: {directory.path(METRICS)}")
  tensorboard = directory.path(TENSORBOARD)
  if run_config.tensorboard:
    lines.append(f"tensorboard: {tensorboard}")
  lines.append(f"curves: python -m transformer.plot {directory.workdir}"
               + (f"  or  {_tensorboard_command(tensorboard)}" if run_config.tensorboard else ""))
  session.say("\n".join(lines))


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
    self.flops = 0.0  # model FLOPs of this process's steps since the window (re)started, not saved: see read
    self.compiled_steps, self.compile_seconds = 0, 0.0
    if saved and saved.get("window"):
      # Each half of a (sum, count) pair is one array: a vector with a value per seed when they are vmapped.
      self._sums = {k: tuple(jnp.asarray(half) for half in pair) for k, pair in saved["window"].items()}
      self.steps, self.tokens = saved["window_steps"], saved["window_tokens"]

  def add(self, metrics, step: int, tokens: int, stacked: int = 0, flops: float = 0.0) -> None:
    """Keep the metrics of step ``step`` (counted from 1), or with ``stacked`` > 0 those of the ``stacked`` steps
    up to ``step``, stacked ``[stacked, ...]``, and their ``tokens`` and model ``flops``; dispatches nothing, waits
    for nothing."""
    self._pending.append((step, metrics, stacked))
    self.steps += max(stacked, 1)
    self.tokens += tokens
    self.flops += flops

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

  def read(self) -> tuple[dict, int, int, float, float | None, float]:
    """``(sums on the host, steps, tokens, seconds, pace, flops)`` of the window, which starts anew. ``pace``:
    seconds per step of the steps outside calls that compiled (None if every step was in one), for an ETA that
    does not count compilation as the pace of the steps to come. ``flops``: of the steps this session ran (a
    resumed window's restored steps ran before its clock started, so they are left out of its rate)."""
    self._fold_pending()
    sums, steps, tokens, flops = self._fetch(self._sums), self.steps, self.tokens, self.flops
    seconds = time.perf_counter() - self.start
    compiled = min(self.compiled_steps, steps)  # a resumed window's restored steps were not timed here
    pace = (seconds - self.compile_seconds) / (steps - compiled) if steps > compiled else None
    self._sums, self.steps, self.tokens, self.start, self.flops = None, 0, 0, time.perf_counter(), 0.0
    self.compiled_steps, self.compile_seconds = 0, 0.0
    return sums, steps, tokens, seconds, pace, flops

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


PHASES = ("step", "compile", "data", "launch", "startup", "evaluate", "checkpoint", "profile", "redone",
          "between_launches")
LOOP_PHASES = ("step", "compile", "data", "evaluate", "checkpoint")  # logged per window as time/<phase>


class Goodput:
  """Seconds per phase, summed over the run's sessions, the steps they trained, and the job's wall clock: when
  its first launch's process started (``job_started``, epoch seconds) and the idle time since then that is not
  the job's (``idle_seconds``: waits after the run had finished)."""

  def __init__(self, saved: dict | None = None, clock: Callable[[], float] = time.time):
    saved = saved or {}
    self.seconds = {phase: float(saved.get("seconds", {}).get(phase, 0.0)) for phase in PHASES}
    self.steps = int(saved.get("steps", 0))
    self.job_started = saved.get("job_started")
    self.idle_seconds = float(saved.get("idle_seconds", 0.0))
    self._clock = clock
    self._loop_start = None
    self._timed = 0.0  # seconds of this session's loop spent in the other phases
    self._window_start = {}  # the sums at the last logging step

  def add(self, phase: str, seconds: float) -> None:
    self.seconds[phase] += seconds
    if self._loop_start is not None:
      self._timed += seconds

  @contextlib.contextmanager
  def timed(self, phase: str):
    start = time.perf_counter()
    try:
      yield
    finally:
      self.add(phase, time.perf_counter() - start)

  def start_launch(self, process_started: float, session_started: float, finished_before: float | None) -> None:
    """This launch's process started at ``process_started`` and its session at ``session_started`` (epoch
    seconds): the time between is ``launch``. ``finished_before``: when the run's previous launch ended having
    trained every step (``goodput.json``'s ``finished_at``), so the wait since then is idle."""
    self.add("launch", max(session_started - process_started, 0.0))
    if self.job_started is None:
      self.job_started = process_started
    elif finished_before is not None:
      self.idle_seconds += max(process_started - finished_before, 0.0)

  def start_loop(self, session_start: float) -> None:
    """The first step is about to run: the time since ``session_start`` (``perf_counter``) was start-up."""
    self.add("startup", time.perf_counter() - session_start)
    self._loop_start, self._timed = time.perf_counter(), 0.0
    self._window_start = dict(self.seconds)

  def window(self) -> dict[str, float]:
    """``{"time/<phase>": seconds}`` of each of ``LOOP_PHASES`` since the last call (the first: since the loop
    started): where a logging window's time went."""
    now = self.saved(0)["seconds"]
    window = {f"time/{phase}": now[phase] - self._window_start.get(phase, 0.0) for phase in LOOP_PHASES}
    self._window_start = now
    return window

  def redone(self, steps: int) -> None:
    """``steps`` trained before a kill and lost with it, at the mean step time of the run so far."""
    if steps > 0 and self.steps:
      self.add("redone", steps * self.seconds["step"] / self.steps)

  def saved(self, steps_trained: int) -> dict:
    """The sums up to now (the loop's untimed rest counted as ``step``), for a checkpoint's ``extra``."""
    seconds = dict(self.seconds)
    if self._loop_start is not None:
      seconds["step"] += time.perf_counter() - self._loop_start - self._timed
    return {"seconds": seconds, "steps": self.steps + steps_trained, "job_started": self.job_started,
            "idle_seconds": self.idle_seconds}

  def summary(self, steps_trained: int) -> tuple[dict, str]:
    """``(record, line)``: the phases, ``between_launches`` (the job's wall time since its first launch started,
    less idle waits, that no phase holds), their total and the goodput share; one line for the end of a run."""
    record = self.saved(steps_trained)
    seconds = record["seconds"]
    if self.job_started is not None:
      job = self._clock() - self.job_started - self.idle_seconds
      seconds["between_launches"] = max(job - sum(v for k, v in seconds.items() if k != "between_launches"), 0.0)
    total = sum(seconds.values())
    record.update(total_seconds=total, goodput=seconds["step"] / total if total > 0 else 0.0)
    parts = ", ".join(f"{PHASE_NAMES.get(phase, phase)} {seconds[phase]:.1f} s" for phase in PHASES if seconds[phase])
    return record, f"goodput: {100 * record['goodput']:.1f}% of {total:.1f} s ({parts})"


PHASE_NAMES = {"step": "productive steps", "between_launches": "between launches"}


def write_goodput(workdir: str, record: dict) -> None:
  """``goodput.json``: ``record`` (``Goodput.summary``'s) and when this launch ended (``finished_at``, epoch
  seconds, only when it trained every step: a later launch extending the run does not count the wait)."""
  write_atomically(RunDirectory(workdir).path(GOODPUT), json.dumps(record, indent=2, sort_keys=True))
