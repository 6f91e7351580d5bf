"""``run(config, workdir, mode)``: the setup every mode shares (``prepare``, building a ``Session``) and the
modes themselves: train (the loop), eval, predict, translate.

The modes that read a trained run: ``run_eval``, ``run_predict``, ``run_translate``; and ``run``, which
dispatches ``launch.py --mode=...`` to its function (training, ``run_train``, runs ``loop.Trainer``).

Each restores the checkpoint chosen on validation (``best_metric``) when the run kept one, else the latest;
with ``config.average_checkpoints=N`` the mean parameters of the last N checkpoints, whose outputs go
to ``WORKDIR/average_last_N``. None of them writes into a workdir that holds no run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import shutil
import sys
import tempfile
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from transformer.data.files import write_atomically
from transformer.errors import ConfigError, MissingDataError, WorkdirError
from transformer.tasks import TranslatesText, WritesPredictions, WritesTestOutputs
from transformer.train.checkpoint import Checkpointer
from transformer.train.config import (SWEEPABLE, RunConfig, build_task, check_workdir, refuse_url_workdir,
                                      validate_config)
from transformer.train.loop import RunOutput, Trainer
from transformer.train.mesh import make_strategy
from transformer.train.multihost import check_same_settings
from transformer.train.state import run_optimizer, state_factory, with_params
from transformer.train.step import make_evaluator
from transformer.train.workdir import (EVAL_RESULTS, PREDICT_RESULTS, RunDirectory, Session, check_shared_workdir,
                                       check_tokenizers, check_workdir_model, check_writable, hold_to_record,
                                       lock_workdir, record_identity, refuse_foreign_folder)
from transformer.train.writers import results_table, variant_tables


def prepare(run_config: RunConfig, workdir: str, mode: str) -> Session:
  """Build ``run_config``'s task, parallelism and checkpointer for ``mode``, and hold the run to its record
  (``config.json``, ``model_config.json``, the tokenizers it trained with)."""
  started = time.perf_counter()
  check_same_settings(run_config.record)  # before anything a process would do on its own settings
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
    return dataclasses.replace(_build_session(run_config, workdir, mode, lock, started), created=created)
  except BaseException:
    if lock is not None:
      lock.release()
    _remove_if_created(workdir, created)
    raise


def _remove_if_created(workdir: str, created: bool) -> None:
  """A start that failed (missing data, a setting the task refuses, ...) in a workdir it created leaves nothing
  behind: the rerun with the fix is a fresh start, not a resume of nothing."""
  if created and jax.process_count() == 1:
    shutil.rmtree(workdir, ignore_errors=True)


def _build_session(run_config: RunConfig, workdir: str, mode: str, lock, started: float) -> Session:
  task = _build_task_once(run_config, training=mode == "train")
  _check_task_supports(run_config, task, mode)
  model_config = task.model_config()
  strategy = make_strategy(run_config.parallelism, run_config.replicas.count, run_config.replicas.settings(),
                           run_config.tensor_parallelism, run_config.logical_axis_rules, run_config.hybrid_mesh)
  _check_batch_divides(run_config, strategy.num_devices, jax.process_count())
  # A fresh run is identified by the record it is about to write; one that exists, by the record it wrote.
  run_identity = RunDirectory(workdir).run_identity() or (record_identity(run_config.record) if mode == "train"
                                                         else None)
  checkpointer = Checkpointer(workdir, keep=run_config.keep_checkpoints, asynchronous=run_config.async_checkpointing,
                              best_metric=run_config.best_metric or None, best_mode=run_config.best_mode,
                              repair=lock is not None, discard_unrestorable=run_config.restart, run=run_identity,
                              layer_axis=int(run_config.replicas.count > 1))
  session = Session(run_config, workdir, mode, task, model_config, strategy, checkpointer, jax.process_index(),
                    jax.process_count(), sys.stderr if mode == "translate" else sys.stdout, lock, started)
  has_checkpoints = checkpointer.has_checkpoints()
  check_workdir_model(workdir, model_config, has_checkpoints, write=session.is_main and mode == "train")
  check_tokenizers(workdir, task.trained_tokenizers(), has_checkpoints, write=session.is_main and mode == "train")
  if mode != "train":  # training holds a run to its record once it knows whether it resumes (hold_to_record)
    hold_to_record(session, resuming=True)
  mesh = getattr(strategy, "mesh", None)  # a multi-device mesh's axes: how the layout came out
  layout = f" ({' x '.join(f'{axis} {size}' for axis, size in mesh.shape.items())})" if mesh and mesh.size > 1 else ""
  session.say(f"devices: {jax.device_count()} x {jax.devices()[0].platform}, processes: {session.process_count}, "
              f"parallelism: {strategy.name}{layout}")
  return session


def _require_a_run(workdir: str, mode: str) -> None:
  """Eval, predict and translate read a run: refuse, writing nothing, where there is none (or at a URL)."""
  refuse_url_workdir(workdir)
  if not os.path.isdir(workdir):
    raise WorkdirError(f"--mode={mode}: --workdir={workdir} does not exist; give the workdir of a trained run.")
  if not RunDirectory(workdir).has_checkpoints():
    raise WorkdirError(f"--mode={mode}: --workdir={workdir} holds no checkpoint (no checkpoints/); "
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


def _build_task_once(run_config: RunConfig, training: bool):
  """``build_task(run)``, its data prepared by process 0 alone before the others read it: processes preparing
  the same files at once race on TFDS's renames (and tokenizer training); with ``training`` also the tokenized
  training split, which the others then memory-map instead of each tokenizing the whole text."""
  if jax.process_count() == 1:
    return build_task(run_config)
  task = None
  if jax.process_index() == 0:
    try:
      task = build_task(run_config)
      task.prepare_data(training)  # a task reads its data on first use: the others would prepare it at the same time
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


@dataclasses.dataclass
class Restored:
  """A checkpoint restored for eval/predict/translate: its step, the state, where outputs go and, when
  averaged, ``{"averaged_steps": [...]}`` for the results file."""
  step: int
  state: object
  output_dir: str
  averaged: dict


def restore_for_inference(session: Session) -> Restored:
  """The best checkpoint when the run kept one, else the latest; or the average of the last N."""
  run_config, checkpointer, workdir, task = session.run_config, session.checkpointer, session.workdir, session.task
  _, abstract_state = state_factory(session, task.build_model(session.model_config), run_optimizer(run_config),
                                    task.placeholder_inputs())
  use_best = checkpointer.best_step() is not None
  restored = checkpointer.restore(abstract_state, best=use_best)
  if restored is None:
    raise ConfigError(f"--mode={session.mode} needs a checkpoint, but {workdir} has none yet; train first.")
  step, canonical, _ = restored
  state = session.strategy.from_canonical(canonical)
  session.say(f"{'restored the best checkpoint, step' if use_best else 'resumed from step'} {step} in {workdir}")
  if not run_config.average_checkpoints:
    return Restored(step, state, workdir, {})
  steps, params = checkpointer.average_params(abstract_state, run_config.average_checkpoints)
  output_dir = session.directory.output_dir(run_config.average_checkpoints)
  os.makedirs(output_dir, exist_ok=True)
  session.say(f"averaged the parameters of steps {steps}; outputs go to {output_dir}")
  return Restored(steps[-1], with_params(session, state, params), output_dir, {"averaged_steps": steps})


def _file_times(folder: str) -> dict:
  return {name: os.path.getmtime(os.path.join(folder, name)) for name in os.listdir(folder)
          if os.path.isfile(os.path.join(folder, name))}


def run_eval(run_config: RunConfig, workdir: str) -> RunOutput:
  """Validation metrics of the best (or averaged) checkpoint, and the task's test splits scored and written
  (``WritesTestOutputs``): printed as a table and written to ``<output dir>/eval_results.json``."""
  session = prepare(run_config, workdir, "eval")
  restored = restore_for_inference(session)
  before = _file_times(restored.output_dir)
  evaluate = make_evaluator(session, session.task.build_model(session.model_config.replace(deterministic=True)))
  results = evaluate(restored.state)
  if isinstance(session.task, WritesTestOutputs):
    with session.strategy.evaluating(restored.state) as params, _written_by(session, restored.output_dir) as folder:
      tests = session.task.write_test_outputs(session.model_config, params, folder, results)
    results.update({f"{split}/{k}": v for split, metrics in tests.items() for k, v in metrics.items()})
  if session.is_main:
    summary = {"step": restored.step, **restored.averaged, **results}
    write_atomically(os.path.join(restored.output_dir, EVAL_RESULTS), json.dumps(summary, indent=2))
    written = sorted(name for name, time_ in _file_times(restored.output_dir).items() if before.get(name) != time_)
    tables = variant_tables(results, run_config.replicas.variant_names())  # a sweep: each variant's, not only the mean
    print("\n".join([f"step {restored.step}:", results_table(results), *([tables] if tables else []),
                     f"written: {', '.join(os.path.join(restored.output_dir, name) for name in written)}"]),
          flush=True)
  session.checkpointer.close()
  return RunOutput(restored.step, results, session.strategy.to_canonical(restored.state))


def run_train(run_config: RunConfig, workdir: str) -> RunOutput:
  """Train ``run_config``, resuming from the latest checkpoint in ``workdir`` (exactly: data position, metrics
  window)."""
  session, trainer = prepare(run_config, workdir, "train"), None
  try:
    trainer = Trainer(session)
    return trainer.report_finished() if trainer.step >= run_config.num_train_steps else trainer.train()
  except BaseException:
    if trainer is None or trainer.step == 0:  # refused before its first step (a bad evaluator, ...)
      try:
        session.checkpointer.close()
      finally:
        _remove_if_created(workdir, session.created)
    raise
  finally:  # also on an error, so that a notebook or test can start the fixed run in the same process
    if session.lock is not None:
      session.lock.release()


def run_predict(run_config: RunConfig, workdir: str) -> RunOutput:
  """The task's predictions of the best (or averaged) checkpoint written to a file (``WritesPredictions``: one
  line or row per example), whose path is printed and recorded in ``<output dir>/predict_results.json``."""
  session = prepare(run_config, workdir, "predict")
  restored = restore_for_inference(session)
  with session.strategy.evaluating(restored.state) as params, _written_by(session, restored.output_dir) as folder:
    path = session.task.write_predictions(session.model_config, params, folder)
  if session.is_main:
    write_atomically(os.path.join(restored.output_dir, PREDICT_RESULTS),
                     json.dumps({"step": restored.step, **restored.averaged, "predictions": path}, indent=2))
    print(f"predictions of step {restored.step}: {path}", flush=True)
  session.checkpointer.close()
  return RunOutput(restored.step, {}, session.strategy.to_canonical(restored.state))


@contextlib.contextmanager
def _written_by(session: Session, output_dir: str):
  """Where this process writes what a task's eval or predict writes: ``output_dir`` in the main process, a
  temporary folder elsewhere. Every process decodes (its rows of one program) and so writes the same files,
  and two writers of one path race on its temporary file."""
  if session.is_main:
    yield output_dir
    return
  with tempfile.TemporaryDirectory() as folder:
    yield folder


def run_translate(run_config: RunConfig, workdir: str, lines: list[str] | None = None) -> RunOutput:
  """Translate ``lines`` with the best (or averaged) checkpoint: ``RunOutput.outputs`` holds one line per input
  line, an empty line for an empty one. Reading and writing the text (``config.translate_input`` /
  ``translate_output``, stdin, stdout) is ``launch.py``'s."""
  if lines is None:
    raise ConfigError("--mode=translate needs the lines to translate: run(config, workdir, 'translate', "
                      "lines=[...]), or launch.py with --config.translate_input=FILE or standard input.")
  session = prepare(run_config, workdir, "translate")
  restored = restore_for_inference(session)
  with session.strategy.evaluating(restored.state) as params:
    translations = session.task.translate_lines(session.model_config, params, lines)
  session.say(f"translated {len(lines)} lines with the checkpoint of step {restored.step}")
  session.checkpointer.close()
  return RunOutput(restored.step, {}, session.strategy.to_canonical(restored.state), outputs=translations)


MODE_FUNCTIONS = {"train": run_train, "eval": run_eval, "predict": run_predict, "translate": run_translate}


def run(config, workdir: str, mode: str = "train", lines: list[str] | None = None) -> RunOutput:
  """Run ``mode`` (one of ``MODE_FUNCTIONS``) of the experiment ``config`` (a ``ConfigDict``, resolved here once
  into its ``RunConfig``, or a ``RunConfig``) in ``workdir``; ``lines``: the text ``translate`` translates."""
  if mode not in MODE_FUNCTIONS:
    raise ConfigError(f"--mode={mode!r} is not supported; choose one of {list(MODE_FUNCTIONS)}.")
  resolved = config if isinstance(config, RunConfig) else validate_config(config, None, mode)
  if mode == "translate":
    return MODE_FUNCTIONS[mode](resolved, workdir, lines)
  return MODE_FUNCTIONS[mode](resolved, workdir)
