"""The one training loop: ``run(config, workdir, mode)`` for every experiment."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from transformer.tasks import build_task
from transformer.train.checkpoint import Checkpointer
from transformer.train.config import validate_config
from transformer.train.optimizer import make_optimizer, make_schedule
from transformer.train.parallel import make_strategy
from transformer.train.state import create_train_state
from transformer.train.step import DivergenceGuard, make_eval_step, make_train_step
from transformer.train.workdir import check_fresh_start, lock_workdir
from transformer.train.writers import MetricWriter, log_line, progress_bar

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


def _count_tokens(batch) -> int:
  """Non-padding tokens: nonzero entries of the batch's 2-D integer arrays."""
  return int(sum(np.count_nonzero(x) for x in batch.values() if x.ndim == 2 and np.issubdtype(x.dtype, np.integer)))


def _means(sums: dict, prefix: str) -> dict:
  """``name -> (sum, weight)`` to ``prefix/name -> sum / weight``; per-seed values get a ``/seed_i`` suffix."""
  out = {}
  for name, (total, weight) in sums.items():
    weight = np.asarray(weight, np.float64)  # weight 0: a count (train/skipped_steps), reported as its sum
    value = np.where(weight > 0, np.asarray(total, np.float64) / np.maximum(weight, 1e-12), total)
    if value.ndim == 0:
      out[f"{prefix}/{name}"] = float(value)
    else:
      out[f"{prefix}/{name}"] = float(value.mean())
      out.update({f"{prefix}/{name}/seed_{i}": float(v) for i, v in enumerate(value)})
  return out


def _translate(task, model_config, params, config) -> None:
  """Translate ``config.translate_input`` (or stdin) line by line into ``config.translate_output`` (or stdout)."""
  if config.translate_input:
    with open(config.translate_input) as f:
      lines = f.read().splitlines()
  else:
    lines = sys.stdin.read().splitlines()
  translations = task.translate_lines(model_config, params, lines)
  text = "\n".join(translations) + ("\n" if translations else "")
  if config.translate_output:
    with open(config.translate_output, "w") as f:
      f.write(text)
  else:
    sys.stdout.write(text)
    sys.stdout.flush()


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
    ignored = ("deterministic", "decode", "dropout_rate", "attention_dropout_rate", "feed_forward_dropout_rate")
    differences = [f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in sorted(set(saved) | set(current))
                   if k not in ignored and saved.get(k) != current.get(k)]
    if differences:
      raise ValueError(f"--workdir={workdir} holds checkpoints of a different model ({'; '.join(differences)}). "
                       "Use a new --workdir, or set the model back to match.")
  if is_main:
    with open(path + ".tmp", "w") as f:
      json.dump(current, f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)


@dataclasses.dataclass
class RunOutput:
  """What ``run`` returns: the last step, its evaluation metrics, the final (canonical) state, and how
  many times the train step was compiled (1 unless shapes changed)."""
  step: int
  metrics: dict
  state: object
  train_step_compilations: int = 0


def run(config, workdir: str, mode: str = "train") -> RunOutput:
  """Train (resuming from the latest checkpoint in ``workdir``), evaluate or predict."""
  validate_config(config, workdir, mode)
  lock = lock_workdir(workdir, mode)  # reliability hook: one training run per workdir (None in other modes)
  task = build_task(config)
  model_config = task.model_config()
  strategy = make_strategy(config.parallelism, config.num_seeds, config.fsdp)
  process_count, process_index = jax.process_count(), jax.process_index()
  is_main = process_index == 0
  if config.batch_size % (strategy.num_devices * config.grad_accum_steps) and config.parallelism != "jit":
    raise ValueError(f"config.batch_size={config.batch_size} must be divisible by the {strategy.num_devices} "
                     f"devices times grad_accum_steps={config.grad_accum_steps} for parallelism="
                     f"{config.parallelism!r}.")
  if config.batch_size % process_count:
    raise ValueError(f"config.batch_size={config.batch_size} must be divisible by the {process_count} processes.")
  host_batch_size = config.batch_size // process_count

  checkpointer = Checkpointer(workdir, keep=config.keep_checkpoints, asynchronous=config.async_checkpointing,
                              best_metric=config.best_metric or None, best_mode=config.best_mode,
                              repair=lock is not None, discard_unrestorable=config.restart)
  _check_workdir_model(workdir, model_config, checkpointer.has_checkpoints(), is_main)
  config_path = os.path.join(workdir, "config.json")
  if is_main:
    # The training configuration: eval/translate runs on the same workdir leave it as trained (reports read it).
    if mode == "train" or not os.path.exists(config_path):
      with open(config_path, "w") as f:
        f.write(config.to_json_best_effort(indent=2, sort_keys=True))
    info = sys.stderr if mode == "translate" else sys.stdout  # keep translations alone on stdout
    print(f"config:\n{config}", file=info, flush=True)
    print(f"devices: {jax.device_count()} x {jax.devices()[0].platform}, processes: {process_count}, "
          f"parallelism: {strategy.name}", file=info, flush=True)

  model = task.build_model(model_config)
  eval_model = task.build_model(model_config.replace(deterministic=True))
  optimizer = make_optimizer(config.optimizer, config.num_train_steps)
  data_seed = config.seed if config.data_seed < 0 else config.data_seed
  train_iterator = task.train_iterator(host_batch_size, data_seed, process_index, process_count)
  start = train_iterator.get_state()  # peek at the first batch for shapes, then rewind
  init_batch = {k: np.asarray(v)[: max(1, host_batch_size // config.grad_accum_steps)]
                for k, v in next(train_iterator).items()}
  train_iterator.set_state(start)
  init_inputs = task.init_inputs(init_batch)

  def create(key):
    return create_train_state(model, optimizer, init_inputs, key)

  if config.num_seeds > 1:  # replica i is exactly the run with seed + i (and the same data order)
    seed_key = jnp.stack([jax.random.PRNGKey(config.seed + i) for i in range(config.num_seeds)])
    state_shapes = jax.eval_shape(jax.vmap(create), seed_key)
  else:
    seed_key = jax.random.PRNGKey(config.seed)
    state_shapes = jax.eval_shape(create, seed_key)
  abstract_state = strategy.abstract_canonical(state_shapes)

  # Evaluation and inference use the checkpoint chosen on validation (best_metric) when there is one.
  use_best = mode != "train" and checkpointer.best_step() is not None
  restored = checkpointer.restore(abstract_state, best=use_best)
  if restored is None and mode == "train":  # reliability hook: never start over on an earlier run's outputs
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
      window = jax.tree.map(jnp.asarray, {k: tuple(v) for k, v in extra["window"].items()})
      window_steps, window_tokens = extra["window_steps"], extra["window_tokens"]
    if is_main:
      print(f"{'restored the best checkpoint, step' if use_best else 'resumed from step'} {start_step} in "
            f"{workdir}", file=sys.stderr if mode == "translate" else sys.stdout, flush=True)
  else:
    start_step = 0
    state = strategy.create_state(create, seed_key)
    if config.restore_from:
      source = Checkpointer(config.restore_from, asynchronous=False)
      found = source.restore(abstract_state)
      if found is None:
        raise ValueError(f"config.restore_from={config.restore_from!r} holds no checkpoint.")
      state = strategy.from_canonical(strategy.to_canonical(state).replace(params=found[1].params))
      if is_main:
        print(f"initialised parameters from {config.restore_from} step {found[0]}", flush=True)

  eval_step = strategy.compile_eval_step(make_eval_step(task, eval_model, getattr(strategy, "axis_name", None)))
  eval_batches = task.eval_batches(config.eval_batch_size)

  def evaluate(state) -> dict:
    sums = None
    for batch in eval_batches:
      metrics = eval_step(state.params, strategy.put_batch(batch))
      sums = metrics if sums is None else jax.tree.map(jnp.add, sums, metrics)
    results = _means(strategy.fetch(sums), "eval")
    if config.num_seeds == 1:
      params = jax.device_get(strategy.host_params(state))
      task_metrics, examples = task.evaluate(model_config, params, eval_batches)
      results.update({f"eval/{k}": v for k, v in task_metrics.items()})
      if is_main and examples:
        print("examples:\n  " + "\n  ".join(examples), flush=True)
    return results

  if mode in ("eval", "predict", "translate"):
    if restored is None:
      raise ValueError(f"--mode={mode} needs a checkpoint, but {workdir} has none; train first.")
    output_dir, averaged = workdir, {}
    if config.average_checkpoints:  # the mean of the last N periodic checkpoints instead of the best one
      steps, params = checkpointer.average_params(abstract_state, config.average_checkpoints)
      state = strategy.from_canonical(strategy.to_canonical(state).replace(params=params))
      start_step, averaged = steps[-1], {"averaged_steps": steps}
      output_dir = os.path.join(workdir, f"average_last_{config.average_checkpoints}")
      os.makedirs(output_dir, exist_ok=True)
      if is_main:
        print(f"averaged the parameters of steps {steps}; outputs go to {output_dir}",
              file=sys.stderr if mode == "translate" else sys.stdout, flush=True)
    if mode == "translate":
      _translate(task, model_config, jax.device_get(strategy.host_params(state)), config)
      checkpointer.close()
      return RunOutput(start_step, {}, strategy.to_canonical(state))
    results = evaluate(state)
    if mode == "eval":
      tests = task.write_test_outputs(model_config, jax.device_get(strategy.host_params(state)), output_dir, results)
      results.update({f"{split}/{k}": v for split, metrics in tests.items() for k, v in metrics.items()})
    if is_main:
      print(json.dumps({"step": start_step, **averaged, **results}, indent=2), flush=True)
      with open(os.path.join(output_dir, f"{mode}_results.json"), "w") as f:
        json.dump({"step": start_step, **averaged, **results}, f, indent=2)
    checkpointer.close()
    return RunOutput(start_step, results, strategy.to_canonical(state))

  train_step = strategy.compile_train_step(
      make_train_step(task, model, optimizer, config.grad_accum_steps, getattr(strategy, "axis_name", None),
                      skip_nonfinite_steps=config.skip_nonfinite_steps))
  guard = DivergenceGuard(strategy.fetch, before_raise=checkpointer.wait)  # reliability hook
  schedule = make_schedule(config.optimizer, config.num_train_steps)
  writer = MetricWriter(workdir, resume_step=start_step, enabled=is_main, tensorboard=config.tensorboard)

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

  results = {}
  step = start_step
  window_start = time.perf_counter()
  bar = progress_bar(config.num_train_steps, start_step, config.quiet or not is_main)
  with _Preemption() as preemption:
    while step < config.num_train_steps:
      batch = next(train_iterator)
      window_tokens += _count_tokens(batch)
      state, metrics = train_step(state, strategy.put_batch(batch))
      window = metrics if window is None else jax.tree.map(jnp.add, window, metrics)
      window_steps += 1
      step += 1
      guard.observe(step, metrics)  # reliability hook: stop at a non-finite loss or gradient norm
      bar.update(1)

      if step % config.log_every == 0 or step == config.num_train_steps:
        elapsed = time.perf_counter() - window_start
        logged = _means(strategy.fetch(window), "train")
        logged["train/learning_rate"] = float(schedule(step - 1))
        logged["train/steps_per_second"] = window_steps / elapsed
        logged["train/tokens_per_second"] = window_tokens * process_count / elapsed
        logged["wall_seconds"] = wall_seconds()
        writer.write(step, logged)
        bar.set_postfix(loss=f"{logged['train/loss']:.4f}", tok_s=f"{logged['train/tokens_per_second']:.0f}")
        if bar.disable and is_main and not config.quiet:  # output to a file: a line per logging step instead
          print(log_line(step, config.num_train_steps, logged, 1 / logged["train/steps_per_second"]), flush=True)
        window, window_steps, window_tokens = None, 0, 0
        window_start = time.perf_counter()

      evaluated = None
      if step % config.eval_every == 0 or step == config.num_train_steps:
        evaluated = evaluate(state)
        results = evaluated
        writer.write(step, {**evaluated, "wall_seconds": wall_seconds()})
        if is_main:
          bar.write(" ".join(f"{k}={v:.4f}" for k, v in sorted(evaluated.items()) if "/seed_" not in k)
                    + f" (step {step})")
          sys.stdout.flush()
      if (step % config.checkpoint_every == 0 or step == config.num_train_steps or preemption.requested
          or evaluated is not None):
        save(step, evaluated)
      if preemption.requested:
        checkpointer.wait()
        if is_main:
          print(f"{preemption.requested}: saved a checkpoint at step {step}; rerun the same command to resume.",
                flush=True)
        break
  bar.close()
  if process_count > 1:  # lock-step check across hosts: every process prints a digest of its parameters
    print(f"params checksum (process {process_index} of {process_count}): {_local_digest(state.params)}",
          flush=True)
  checkpointer.wait()
  checkpointer.close()
  writer.close()
  if lock is not None:
    lock.release()
  return RunOutput(step, results, strategy.to_canonical(state), strategy.trace_count)
