"""The one training system: ``run(config, workdir, mode)`` for every experiment.

Each mode is its own function over shared pieces: ``prepare`` (config checks, task, parallelism, checkpointer,
the run's files), ``initial_state`` / ``restore_for_inference``, ``make_evaluator`` and ``save``:
``run_train`` (the step loop; resumes from the latest checkpoint; a finished run reports and stops),
``run_eval`` (the validation metrics of the best or averaged checkpoint, and the test splits), ``run_predict``
(the task's predictions file), ``run_translate`` (text in, text out). ``run`` dispatches on the mode, as
``launch.py --mode=...`` asks.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
import os
import signal
import sys
import time

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from transformer.errors import ConfigError, InputFileError
from transformer.tasks import StartsFromPretrained, TranslatesText, WritesPredictions, WritesTestOutputs, build_task
from transformer.train.checkpoint import Checkpointer
from transformer.train.config import (SWEEPABLE, num_replicas, replica_values, run_optimizer, run_schedules,
                                     sweeps_schedule, validate_config)
from transformer.train.parallel import make_strategy
from transformer.train.restore import abstract_train_state, load_params, seed_keys
from transformer.train.state import create_train_state
from transformer.train.step import DivergenceGuard, make_eval_step, make_train_step
from transformer.train.workdir import check_fresh_start, check_tokenizers, lock_workdir
from transformer.train.writers import (MetricWriter, log_line, progress_bar, read_metrics, results_table,
                                      write_atomically)

log = logging.getLogger(__name__)


class _Preemption:
  """Turns SIGTERM and SIGINT (Ctrl-C) into a flag the loop checks between steps, so it can checkpoint before
  exiting; a second Ctrl-C interrupts at once."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested = None  # the name of the signal received, e.g. "SIGTERM"
    self._previous = {}

  def __enter__(self):
    try:
      self._previous = {number: signal.signal(number, self._handle) for number in self.SIGNALS}
    except ValueError:  # not the main thread: no signal handling
      self._previous = {}
    return self

  def _handle(self, signum, frame):
    if self.requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.requested = signal.Signals(signum).name

  def __exit__(self, *exc):
    for number, previous in self._previous.items():
      signal.signal(number, previous)


def _means(sums: dict, prefix: str, num_seeds: int = 1) -> dict:
  """``name -> (sum, weight)`` to ``prefix/name -> sum / weight``; per-replica values get a ``/seed_i`` suffix,
  and with several variants (``config.sweep``: replicas in groups of ``num_seeds``) each variant's mean over
  its seeds a ``/variant_v`` suffix."""
  out = {}
  for name, (total, weight) in sums.items():
    weight = np.asarray(weight, np.float64)  # weight 0: a count (train/skipped_steps), reported as its sum
    value = np.where(weight > 0, np.asarray(total, np.float64) / np.maximum(weight, 1e-12), total)
    out.update(_replica_means(f"{prefix}/{name}", value, num_seeds))
  return out


def _replica_means(name: str, value, num_seeds: int) -> dict:
  """``name``: the mean of ``value`` (one per replica, or a scalar), ``name/seed_i`` each replica's, and
  ``name/variant_v`` each variant's mean when the replicas are several variants of ``num_seeds`` seeds."""
  value = np.asarray(value, np.float64)
  if value.ndim == 0:
    return {name: float(value)}
  out = {name: float(value.mean()), **{f"{name}/seed_{i}": float(v) for i, v in enumerate(value)}}
  if len(value) > num_seeds:
    out.update({f"{name}/variant_{v}": float(m) for v, m in enumerate(value.reshape(-1, num_seeds).mean(axis=1))})
  return out


def _local_digest(tree) -> str:
  """SHA-1 of this process's first shard of every leaf (the whole leaf when replicated)."""
  digest = hashlib.sha1()
  for leaf in jax.tree.leaves(tree):
    digest.update(np.ascontiguousarray(np.asarray(leaf.addressable_data(0))).tobytes())
  return digest.hexdigest()


def _check_workdir_model(workdir: str, model_config, has_checkpoints: bool, is_main: bool) -> None:
  """A workdir belongs to one model: refuse to resume checkpoints of a different architecture.

  Every process checks; the main one (re)writes ``model_config.json``, atomically, so that another
  process reading it at the same time never sees a half-written file.
  """
  path = os.path.join(workdir, "model_config.json")
  current = dataclasses.asdict(model_config)
  if has_checkpoints and os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    ignored = ("deterministic", "decode", "dropout_rate", "attention_dropout_rate", "feed_forward_dropout_rate",
               "kernels")
    moved = ("num_classes", "pooling")  # moved to ClassifierConfig: Transformer runs saved them before
    # A field added since the run was saved compares as its default (which keeps the saved model's behaviour).
    defaults = {field.name: field.default for field in dataclasses.fields(model_config)}
    differences = [f"{k}: {saved.get(k, defaults.get(k))!r} -> {current.get(k)!r}"
                   for k in sorted(set(saved) | set(current))
                   if k not in ignored and not (k in moved and k not in current)
                   and saved.get(k, defaults.get(k)) != current.get(k)]
    if differences:
      raise ConfigError(f"--workdir={workdir} holds checkpoints of a different model ({'; '.join(differences)}). "
                       "Use a new --workdir, or set the model back to match.")
  if is_main:
    write_atomically(path, json.dumps(current, indent=2, sort_keys=True))


@dataclasses.dataclass
class RunOutput:
  """What ``run`` returns: the last step, its evaluation metrics, the final (canonical) state, and how
  many times the train step was compiled (1 unless shapes changed)."""
  step: int
  metrics: dict
  state: object
  train_step_compilations: int = 0


@dataclasses.dataclass
class Session:
  """What every mode shares, made by ``prepare``: the config, its task and model, the parallelism, the
  checkpointer, and which process this is. ``info`` is where progress lines go (stderr in translate mode, so
  that translations stand alone on stdout)."""
  config: object
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

  @property
  def is_main(self) -> bool:
    return self.process_index == 0

  @property
  def host_batch_size(self) -> int:
    return self.config.batch_size // self.process_count

  def say(self, text: str) -> None:
    """Print a progress line from the main process."""
    if self.is_main:
      print(text, file=self.info, flush=True)


def prepare(config, workdir: str, mode: str) -> Session:
  """Check the config for ``mode``, build the task, parallelism and checkpointer, and record the run's
  configuration (``config.json`` when training, ``model_config.json``) in ``workdir``."""
  validate_config(config, workdir, mode)
  lock = lock_workdir(workdir, mode)  # reliability hook: one training run per workdir (None in other modes)
  task = build_task(config)
  if mode == "translate" and not isinstance(task, TranslatesText):
    raise ConfigError(f"--mode=translate needs a task that translates text; config.task.name="
                     f"{config.task.name!r} ({type(task).__name__}) does not. Use --mode=eval or --mode=predict.")
  if mode == "predict" and not isinstance(task, WritesPredictions):
    raise ConfigError(f"--mode=predict needs a task that writes predictions; config.task.name={config.task.name!r} "
                      f"({type(task).__name__}) does not. Use --mode=eval.")
  swept = replica_values(config)
  if "label_smoothing" in swept and "label_smoothing" not in inspect.signature(task.loss_and_metrics).parameters:
    others = [field for field in SWEEPABLE if field != "label_smoothing"]
    raise ConfigError(f"config.sweep={config.sweep!r} sweeps label_smoothing, but the loss of "
                      f"{type(task).__name__} is not label-smoothed; sweep {others} only.")
  model_config = task.model_config()
  strategy = make_strategy(config.parallelism, num_replicas(config), config.fsdp, swept)
  process_count, process_index = jax.process_count(), jax.process_index()
  if config.batch_size % (strategy.num_devices * config.grad_accum_steps) and config.parallelism != "jit":
    raise ConfigError(f"config.batch_size={config.batch_size} must be divisible by the {strategy.num_devices} "
                     f"devices times grad_accum_steps={config.grad_accum_steps} for parallelism="
                     f"{config.parallelism!r}.")
  if config.batch_size % process_count:
    raise ConfigError(f"config.batch_size={config.batch_size} must be divisible by the {process_count} processes.")

  checkpointer = Checkpointer(workdir, keep=config.keep_checkpoints, asynchronous=config.async_checkpointing,
                              best_metric=config.best_metric or None, best_mode=config.best_mode,
                              repair=lock is not None, discard_unrestorable=config.restart)
  session = Session(config, workdir, mode, task, model_config, strategy, checkpointer, process_index,
                    process_count, sys.stderr if mode == "translate" else sys.stdout, lock)
  _check_workdir_model(workdir, model_config, checkpointer.has_checkpoints(), session.is_main)
  check_tokenizers(workdir, task.trained_tokenizers(), checkpointer.has_checkpoints(),
                   write=session.is_main and mode == "train")
  config_path = os.path.join(workdir, "config.json")
  if session.is_main:
    # The training configuration: eval/translate runs on the same workdir leave it as trained (reports read it).
    if mode == "train" or not os.path.exists(config_path):
      with open(config_path, "w") as f:
        f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  if mode == "train":  # the full config is in the file, not in the log
    session.say(f"config: {config_path}")
  session.say(f"devices: {jax.device_count()} x {jax.devices()[0].platform}, processes: {process_count}, "
              f"parallelism: {strategy.name}")
  return session


def _state_factory(session: Session, model, optimizer, init_inputs):
  """``(create, abstract_state)``: ``create(key)`` initialises a train state; ``abstract_state`` is the
  canonical state's shapes with this strategy's shardings, the target checkpoints are restored onto."""
  def create(key):
    return create_train_state(model, optimizer, init_inputs, key)
  return create, abstract_train_state(create, session.config, session.strategy)


def _with_params(session: Session, state, params):
  """``state`` with ``params`` (a canonical tree of the same shapes) in place of its parameters."""
  return session.strategy.from_canonical(session.strategy.to_canonical(state).replace(params=params))


def _initialise_from(session: Session, state, source_workdir: str):
  """``config.restore_from``: the parameters of another run (its latest checkpoint) in place of the fresh
  ones; the optimizer state, step and data order start anew."""
  source = load_params(source_workdir, checkpoint="latest")
  canonical = session.strategy.to_canonical(state).params
  fresh = jax.tree_util.tree_flatten_with_path(canonical)[0]
  loaded = jax.tree_util.tree_flatten_with_path(source.params)[0]
  replicas = num_replicas(session.config)
  expected = [(jax.tree_util.keystr(path), leaf.shape[1:] if replicas > 1 else leaf.shape) for path, leaf in fresh]
  found = [(jax.tree_util.keystr(path), np.shape(leaf)) for path, leaf in loaded]
  if expected != found:
    differences = [f"{e} != {f}" for e, f in zip(expected, found) if e != f] or ["a different number of tensors"]
    raise ConfigError(f"config.restore_from={source_workdir!r} holds parameters of another model shape "
                     f"({'; '.join(differences[:3])}); set config.model as that run had it.")
  # Every replica of a run of several (seeds, variants) starts from the same parameters.
  params = jax.tree.map(lambda new, old: jax.device_put(
      np.broadcast_to(new, old.shape) if replicas > 1 else new, old.sharding), source.params, canonical)
  session.say(f"initialised parameters from {source_workdir} step {source.step}")
  return _with_params(session, state, params)


def _initialise_pretrained(session: Session, state):
  """``StartsFromPretrained`` tasks: the task's pretrained weights in place of those fresh parameters (every
  replica of a run of several gets the same; the others keep each seed's initialisation)."""
  canonical = flax.traverse_util.flatten_dict(session.strategy.to_canonical(state).params)
  pretrained = flax.traverse_util.flatten_dict(session.task.pretrained_params())
  if not pretrained:
    return state
  replicas = num_replicas(session.config)
  for path, value in pretrained.items():
    fresh = canonical.get(path)
    shape = None if fresh is None else (fresh.shape[1:] if replicas > 1 else fresh.shape)
    if shape != np.shape(value):
      raise ConfigError(f"pretrained parameter {'/'.join(path)} has shape {np.shape(value)}, the model's "
                        f"{'is ' + str(shape) if shape else 'does not exist'}; config.model does not match the "
                        "pretrained model.")
    canonical[path] = jax.device_put(np.broadcast_to(value, fresh.shape) if replicas > 1 else value,
                                     fresh.sharding)
  session.say(f"initialised {len(pretrained)} parameter tensors from pretrained weights")
  return _with_params(session, state, flax.traverse_util.unflatten_dict(canonical))


def make_evaluator(session: Session, eval_model, write=print):
  """``evaluate(state) -> {"eval/<name>": value}``: the loss metrics of the validation set and the task's own
  evaluation (decoding), whose examples (of the first replica) the main process prints with ``write`` (the
  training loop's ``bar.write``, so that they never land inside its progress bar). With several replicas
  (``num_seeds > 1``, ``config.sweep``) each metric is the mean over replicas, with each replica's value as
  ``eval/<name>/seed_i`` (``i`` the replica: variant ``i // num_seeds``, seed ``config.seed + i % num_seeds``)."""
  strategy, task = session.strategy, session.task
  eval_step = strategy.compile_eval_step(make_eval_step(task, eval_model, getattr(strategy, "axis_name", None)))
  eval_batches = task.eval_batches(session.config.eval_batch_size)

  def evaluate(state) -> dict:
    sums = None
    for batch in eval_batches:
      metrics = eval_step(state.params, strategy.put_batch(batch))
      sums = metrics if sums is None else jax.tree.map(jnp.add, sums, metrics)
    num_seeds = session.config.num_seeds
    results = _means(strategy.fetch(sums), "eval", num_seeds)
    results.update(task.derived_metrics(results))
    params = jax.device_get(strategy.host_params(state))
    replicas = num_replicas(session.config)
    per_replica = []  # each replica's own evaluation (e.g. decoding): seeds are compared on it, not on a mean
    for replica in range(replicas):
      replica_params = params if replicas == 1 else jax.tree.map(lambda x, i=replica: x[i], params)
      task_metrics, examples = task.evaluate(session.model_config, replica_params, eval_batches)
      per_replica.append(task_metrics)
      if session.is_main and examples and replica == 0:
        write("examples:\n  " + "\n  ".join(examples))
        sys.stdout.flush()
    for name in per_replica[0]:
      values = [metrics[name] for metrics in per_replica]
      results.update(_replica_means(f"eval/{name}", values[0] if replicas == 1 else values, num_seeds))
    return results

  return evaluate


def run_train(config, workdir: str) -> RunOutput:
  """Train, resuming from the latest checkpoint in ``workdir`` (exactly: data position, metrics window)."""
  session = prepare(config, workdir, "train")
  try:
    return _train(config, workdir, session)
  finally:  # also on an error, so that a notebook or test can start the fixed run in the same process
    if session.lock is not None:
      session.lock.release()


def _train(config, workdir: str, session: Session) -> RunOutput:
  task, strategy, checkpointer = session.task, session.strategy, session.checkpointer
  model = task.build_model(session.model_config)
  optimizer = run_optimizer(config)
  data_seed = config.seed if config.data_seed < 0 else config.data_seed
  train_iterator = task.train_iterator(session.host_batch_size, data_seed, session.process_index,
                                       session.process_count)
  start = train_iterator.get_state()  # peek at the first batch for shapes, then rewind
  init_batch = {k: np.asarray(v)[: max(1, session.host_batch_size // config.grad_accum_steps)]
                for k, v in next(train_iterator).items()}
  train_iterator.set_state(start)
  create, abstract_state = _state_factory(session, model, optimizer, task.init_inputs(init_batch))

  restored = checkpointer.restore(abstract_state)
  if restored is None:  # never start over on an earlier run's outputs (unless config.restart)
    check_fresh_start(workdir, config.restart, config.checkpoint_every)
  window = None
  window_steps = window_tokens = 0
  wall_seconds_before = 0.0  # training wall time of earlier (interrupted) sessions of this run
  if restored is not None:
    start_step, canonical, extra = restored
    wall_seconds_before = extra.get("wall_seconds", 0.0)
    state = strategy.from_canonical(canonical)
    train_iterator.set_state(extra["iterator"])
    if extra.get("window"):
      # Each half of a (sum, count) pair is one array: a vector with a value per seed when they are vmapped.
      window = {k: tuple(jnp.asarray(half) for half in pair) for k, pair in extra["window"].items()}
      window_steps, window_tokens = extra["window_steps"], extra["window_tokens"]
    if start_step >= config.num_train_steps:  # a finished run: report it, train nothing
      session.say(f"already done: {workdir} is trained to step {start_step} (config.num_train_steps="
                  f"{config.num_train_steps}); raise --config.num_train_steps to train further.")
      results = _last_evaluation(session)
      _print_summary(session, start_step, results)
      checkpointer.close()
      return RunOutput(start_step, results, canonical)
    session.say(f"resumed from step {start_step} in {workdir}")
  else:
    start_step = 0
    state = strategy.create_state(create, seed_keys(config))
    if config.restore_from:
      state = _initialise_from(session, state, config.restore_from)
    elif isinstance(task, StartsFromPretrained):
      state = _initialise_pretrained(session, state)

  results = {}
  step = start_step
  bar = progress_bar(config.num_train_steps, start_step, config.quiet or not session.is_main)
  evaluate = make_evaluator(session, task.build_model(session.model_config.replace(deterministic=True)),
                            write=bar.write)
  schedules = run_schedules(config)  # one per variant of config.sweep
  train_step = strategy.compile_train_step(
      make_train_step(task, model, optimizer, config.grad_accum_steps, getattr(strategy, "axis_name", None),
                      skip_nonfinite_steps=config.skip_nonfinite_steps,
                      frozen_params=tuple(config.optimizer.get("frozen_params", ()) or ()),
                      variant_schedules=schedules if sweeps_schedule(config) else None))
  guard = DivergenceGuard(strategy.fetch, before_raise=checkpointer.wait)  # reliability hook
  writer = MetricWriter(workdir, resume_step=start_step, enabled=session.is_main, tensorboard=config.tensorboard)

  run_start = time.perf_counter()

  def wall_seconds():
    return wall_seconds_before + time.perf_counter() - run_start

  def save(step, metrics=None):
    guard.check()  # reliability hook: never save a state after a non-finite step
    fetched = strategy.fetch(window) if window is not None else None
    extra = {
        "wall_seconds": wall_seconds(),
        "iterator": train_iterator.get_state(),
        "window": {k: [np.asarray(v).tolist() for v in pair] for k, pair in fetched.items()} if fetched else None,
        "window_steps": window_steps, "window_tokens": window_tokens,
    }
    checkpointer.save(step, strategy.to_canonical(state), extra, metrics)

  window_start = time.perf_counter()
  # Bucketed data (translation) compiles the step once per batch shape: say so, or the first minutes are silent.
  known_shapes = getattr(train_iterator, "batch_shapes", None)
  seen_shapes = set()
  with _Preemption() as preemption:
    while step < config.num_train_steps:
      batch = next(train_iterator)
      shape = _shape_text(batch)
      if shape not in seen_shapes:
        seen_shapes.add(shape)
        if session.is_main and not config.quiet:
          of = f"/{max(len(known_shapes), len(seen_shapes))}" if known_shapes else ""
          bar.write(f"compiling the train step for batch shape {len(seen_shapes)}{of} ({shape})")
          sys.stdout.flush()
      window_tokens += task.count_tokens(batch)
      state, metrics = train_step(state, strategy.put_batch(batch))
      window = metrics if window is None else jax.tree.map(jnp.add, window, metrics)
      window_steps += 1
      step += 1
      guard.observe(step, metrics)  # reliability hook: stop at a non-finite loss or gradient norm
      bar.update(1)

      if step % config.log_every == 0 or step == config.num_train_steps:
        elapsed = time.perf_counter() - window_start
        logged = _means(strategy.fetch(window), "train", config.num_seeds)
        rates = [float(schedule(step - 1)) for schedule in schedules]
        logged.update(_replica_means("train/learning_rate", np.repeat(rates, config.num_seeds)
                                     if sweeps_schedule(config) else rates[0], config.num_seeds))
        logged["train/steps_per_second"] = window_steps / elapsed
        logged["train/tokens_per_second"] = window_tokens * session.process_count / elapsed
        logged["wall_seconds"] = wall_seconds()
        writer.write(step, logged)
        bar.set_postfix(loss=f"{logged['train/loss']:.4f}", tok_s=f"{logged['train/tokens_per_second']:.0f}")
        if bar.disable and session.is_main and not config.quiet:  # output to a file: a line per logging step
          print(log_line(step, config.num_train_steps, logged, 1 / logged["train/steps_per_second"]), flush=True)
        window, window_steps, window_tokens = None, 0, 0
        window_start = time.perf_counter()

      evaluated = None
      if step % config.eval_every == 0 or step == config.num_train_steps:
        if step == config.num_train_steps:
          bar.close()  # on a terminal: the final evaluation prints below the finished bar, not inside it
        evaluated = evaluate(state)
        results = evaluated
        writer.write(step, {**evaluated, "wall_seconds": wall_seconds()})
        if session.is_main:
          bar.write(" ".join(f"{k}={v:.4f}" for k, v in sorted(evaluated.items()) if "/seed_" not in k)
                    + f" (step {step})")
          sys.stdout.flush()
        if config.best_metric and config.best_metric not in evaluated:
          save(step)  # keep the work: the fixed command resumes from here
          checkpointer.wait()
          reported = sorted(k for k in evaluated if "/seed_" not in k)
          raise ConfigError(f"config.best_metric={config.best_metric!r} is not a metric this task reports; choose "
                            f"one of {reported} (step {step} is saved; rerun with the fix to resume).")
      if (step % config.checkpoint_every == 0 or step == config.num_train_steps or preemption.requested
          or evaluated is not None):
        save(step, evaluated)
      if preemption.requested:
        checkpointer.wait()
        session.say(f"{preemption.requested}: saved a checkpoint at step {step}; rerun the same command to resume.")
        break
  bar.close()
  if session.process_count > 1:  # lock-step check across hosts: every process prints a digest of its parameters
    print(f"params checksum (process {session.process_index} of {session.process_count}): "
          f"{_local_digest(state.params)}", flush=True)
  checkpointer.wait()
  writer.close()
  if not preemption.requested:
    _print_summary(session, step, results)
  checkpointer.close()
  return RunOutput(step, results, strategy.to_canonical(state), strategy.trace_count)


def _shape_text(batch) -> str:
  """The distinct array shapes of a batch, e.g. ``128x8`` or ``16x24x9 16x5``: what a new compilation is for."""
  return " ".join(sorted({"x".join(map(str, np.shape(value))) for value in batch.values()}))


def _last_evaluation(session: Session) -> dict:
  """The ``eval/...`` metrics of the last evaluation in the run's ``metrics.jsonl`` ({} without one)."""
  if not os.path.exists(os.path.join(session.workdir, "metrics.jsonl")):
    return {}
  for record in reversed(read_metrics(session.workdir)):
    evaluated = {name: value for name, value in record.items() if name.startswith("eval/")}
    if evaluated:
      return evaluated
  return {}


def _print_summary(session: Session, step: int, results: dict) -> None:
  """The end of a training run in a few lines: final and best metrics, where the outputs are, how to see them."""
  if not session.is_main:
    return
  config, workdir = session.config, session.workdir
  lines = [f"done: step {step} of {config.num_train_steps}"]
  final = {name: value for name, value in sorted(results.items()) if "/seed_" not in name}
  if final:
    lines.append("final: " + " ".join(f"{name}={value:.4f}" for name, value in final.items()))
  best_step = session.checkpointer.best_step()
  if config.best_metric and best_step is not None:
    values = [record[config.best_metric] for record in read_metrics(workdir)
              if record["step"] == best_step and config.best_metric in record]
    value = f"={values[-1]:.4f}" if values else ""
    lines.append(f"best: {config.best_metric}{value} at step {best_step}: {os.path.join(workdir, 'best')}")
  lines.append(f"checkpoints: {os.path.join(workdir, 'checkpoints')}")
  lines.append(f"metrics: {os.path.join(workdir, 'metrics.jsonl')}")
  tensorboard = os.path.join(workdir, "tensorboard")
  if config.tensorboard:
    lines.append(f"tensorboard: {tensorboard}")
  lines.append(f"curves: python -m experiments.plot {workdir}"
               + (f"  or  tensorboard --logdir {tensorboard}" if config.tensorboard else ""))
  session.say("\n".join(lines))


@dataclasses.dataclass
class _Restored:
  """A checkpoint restored for eval/predict/translate: its step, the state, where outputs go and, when
  averaged, ``{"averaged_steps": [...]}`` for the results file."""
  step: int
  state: object
  output_dir: str
  averaged: dict


def restore_for_inference(session: Session) -> _Restored:
  """The checkpoint chosen on validation (``best_metric``) when the run kept one, else the latest; with
  ``config.average_checkpoints`` the mean parameters of the last N periodic checkpoints instead, whose outputs
  go to ``WORKDIR/average_last_N``."""
  config, checkpointer, workdir = session.config, session.checkpointer, session.workdir
  task = session.task
  optimizer = run_optimizer(config)
  _, abstract_state = _state_factory(session, task.build_model(session.model_config), optimizer,
                                     task.placeholder_inputs())
  use_best = checkpointer.best_step() is not None
  restored = checkpointer.restore(abstract_state, best=use_best)
  if restored is None:
    raise ConfigError(f"--mode={session.mode} needs a checkpoint, but {workdir} has none; train first.")
  step, canonical, _ = restored
  state = session.strategy.from_canonical(canonical)
  session.say(f"{'restored the best checkpoint, step' if use_best else 'resumed from step'} {step} in {workdir}")
  if not config.average_checkpoints:
    return _Restored(step, state, workdir, {})
  steps, params = checkpointer.average_params(abstract_state, config.average_checkpoints)
  output_dir = os.path.join(workdir, f"average_last_{config.average_checkpoints}")
  os.makedirs(output_dir, exist_ok=True)
  session.say(f"averaged the parameters of steps {steps}; outputs go to {output_dir}")
  return _Restored(steps[-1], _with_params(session, state, params), output_dir, {"averaged_steps": steps})


def _file_times(folder: str) -> dict:
  return {name: os.path.getmtime(os.path.join(folder, name)) for name in os.listdir(folder)
          if os.path.isfile(os.path.join(folder, name))}


def run_eval(config, workdir: str) -> RunOutput:
  """Validation metrics of the best (or averaged) checkpoint, and the task's test splits scored and written
  (``WritesTestOutputs``): printed as a table and written to ``<output dir>/eval_results.json``."""
  session = prepare(config, workdir, "eval")
  restored = restore_for_inference(session)
  before = _file_times(restored.output_dir)
  evaluate = make_evaluator(session, session.task.build_model(session.model_config.replace(deterministic=True)))
  results = evaluate(restored.state)
  if isinstance(session.task, WritesTestOutputs):
    params = jax.device_get(session.strategy.host_params(restored.state))
    tests = session.task.write_test_outputs(session.model_config, params, restored.output_dir, results)
    results.update({f"{split}/{k}": v for split, metrics in tests.items() for k, v in metrics.items()})
  if session.is_main:
    summary = {"step": restored.step, **restored.averaged, **results}
    with open(os.path.join(restored.output_dir, "eval_results.json"), "w") as f:
      json.dump(summary, f, indent=2)
    written = sorted(name for name, time_ in _file_times(restored.output_dir).items() if before.get(name) != time_)
    print(f"step {restored.step}:\n{results_table(results)}\n"
          f"written: {', '.join(os.path.join(restored.output_dir, name) for name in written)}", flush=True)
  session.checkpointer.close()
  return RunOutput(restored.step, results, session.strategy.to_canonical(restored.state))


def run_predict(config, workdir: str) -> RunOutput:
  """The task's predictions of the best (or averaged) checkpoint written to a file (``WritesPredictions``: one
  line or row per example), whose path is printed and recorded in ``<output dir>/predict_results.json``."""
  session = prepare(config, workdir, "predict")
  restored = restore_for_inference(session)
  if session.is_main:
    params = jax.device_get(session.strategy.host_params(restored.state))
    path = session.task.write_predictions(session.model_config, params, restored.output_dir)
    with open(os.path.join(restored.output_dir, "predict_results.json"), "w") as f:
      json.dump({"step": restored.step, **restored.averaged, "predictions": path}, f, indent=2)
    print(f"predictions of step {restored.step}: {path}", flush=True)
  session.checkpointer.close()
  return RunOutput(restored.step, {}, session.strategy.to_canonical(restored.state))


def split_input_lines(text: str) -> list[str]:
  """Lines of a text to translate: split at ``"\\n"`` only (not at the other breaks ``str.splitlines`` knows, like
  U+2028 or a form feed, which may sit inside a sentence); a final newline ends the last line, it does not
  start an empty one."""
  if not text:
    return []
  return (text[:-1] if text.endswith("\n") else text).split("\n")


def read_input_lines(path: str = "") -> list[str]:
  """The lines of the UTF-8 file ``path`` ("" = standard input), see ``split_input_lines``.

  Raises:
    InputFileError: the input is not UTF-8.
  """
  if path:
    with open(path, "rb") as f:
      data = f.read()
  else:
    stream = getattr(sys.stdin, "buffer", None)
    data = stream.read() if stream is not None else sys.stdin.read()
  if isinstance(data, bytes):
    try:
      data = data.decode("utf-8")
    except UnicodeDecodeError as error:
      name = f"config.translate_input={path!r}" if path else "the standard input"
      line = data[:error.start].count(b"\n") + 1
      raise InputFileError(f"{name} is not UTF-8 text: byte {data[error.start:error.start + 1]!r} at offset "
                           f"{error.start} (line {line}) cannot be decoded; convert the file to UTF-8 first, e.g. "
                           "iconv -f latin1 -t utf-8.") from None
  return split_input_lines(data)


def run_translate(config, workdir: str) -> RunOutput:
  """Translate ``config.translate_input`` (or stdin) line by line into ``config.translate_output`` (or
  stdout) with the best (or averaged) checkpoint: one output line per input line, an empty line for an empty
  one."""
  session = prepare(config, workdir, "translate")
  lines = read_input_lines(config.translate_input)
  restored = restore_for_inference(session)
  params = jax.device_get(session.strategy.host_params(restored.state))
  translations = session.task.translate_lines(session.model_config, params, lines)
  text = "".join(line + "\n" for line in translations)
  if config.translate_output:
    with open(config.translate_output, "w", encoding="utf-8") as f:
      f.write(text)
  else:
    sys.stdout.write(text)
    sys.stdout.flush()
  session.say(f"translated {len(lines)} lines with the checkpoint of step {restored.step}"
              + (f" into {config.translate_output}" if config.translate_output else ""))
  session.checkpointer.close()
  return RunOutput(restored.step, {}, session.strategy.to_canonical(restored.state))


MODE_FUNCTIONS = {"train": run_train, "eval": run_eval, "predict": run_predict, "translate": run_translate}


def run(config, workdir: str, mode: str = "train") -> RunOutput:
  """Run ``mode`` (one of ``MODE_FUNCTIONS``) of the experiment ``config`` in ``workdir``."""
  if mode not in MODE_FUNCTIONS:
    validate_config(config, workdir, mode)  # names the modes
  return MODE_FUNCTIONS[mode](config, workdir)
