"""The train state and where it comes from: the state and optimizer, fresh initialisation, another run's or a
pretrained model's parameters, and a saved run's parameters read back (``load_params``).

The train state: everything a step needs and a checkpoint must hold.

Learning-rate schedules and the optax optimizer, built from a run's ``OptimizerConfig``.

A saved run read back from its workdir: the configuration it was trained with, its parameters, and how a
command's config differs from it.

``read_run_config`` gives a run's ``RunConfig`` (``RunDirectory``); ``load_params`` restores the parameters of
the best, latest, a given step's or the mean of the last N checkpoints. ``transformer.load`` builds a usable
model on these; ``config.restore_from`` (weights-only initialisation of another run) uses ``load_params``. "Restore" means one thing throughout: a
checkpoint's arrays brought back (``Checkpointer.restore``).

Where a run's train state comes from: fresh initialisation, another run's parameters
(``config.restore_from``), or a task's pretrained weights.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import flax.struct
import flax.traverse_util
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from transformer.errors import ConfigError
from transformer.nn import stack_layers, unboxed, unstack_layers
from transformer.tasks import StartsFromPretrained, Task, UsesRecordedTokenizers
from transformer.train.checkpoint import Checkpointer, CheckpointRestoreError, SavedParams
from transformer.train.config import SCHEDULES, RunConfig, build_task
from transformer.train.mesh import Strategy
from transformer.train.workdir import (CHECKPOINTS, CONFIG, TOKENIZERS, RunDirectory, check_tokenizers,
                                       recorded_tokenizers, require_current_format)


@flax.struct.dataclass
class TrainState:
  """``step`` (int32 scalar), ``params``, ``opt_state`` and ``rng`` (the run's base key; step ``i`` uses
  ``fold_in(rng, i)``, so resuming at any step reproduces the same randomness)."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


def create_train_state(model, optimizer: optax.GradientTransformation, init_inputs: tuple, seed_key):
  """Initialise parameters and optimizer state from one key. Pure: a strategy's ``create_state`` compiles it.

  The parameters come boxed with their logical axis names (``transformer.nn.axes``), which the strategy reads to
  place each one and then strips; the optimizer sees plain arrays.
  """
  init_key, dropout_key, run_key = jax.random.split(seed_key, 3)
  params = model.init({"params": init_key, "dropout": dropout_key}, *init_inputs)["params"]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(unboxed(params)),
                    rng=run_key)


def make_schedule(config, num_train_steps: int) -> optax.Schedule:
  """Learning rate as a function of the step (0-based).

  - ``inverse_sqrt`` (Vaswani et al., eq. 3): linear warmup to ``learning_rate`` over ``warmup_steps``, then
    ``learning_rate * sqrt(warmup_steps / step)``. The paper's ``d_model^-0.5 * min(step^-0.5,
    step * warmup^-1.5)`` is this with ``learning_rate = (d_model * warmup_steps) ** -0.5``.
  - ``cosine``: linear warmup, then cosine decay to 0 at ``num_train_steps``.
  - ``constant``: linear warmup, then constant.
  """
  peak, warmup = config.learning_rate, max(int(config.warmup_steps), 0)
  if config.schedule == "inverse_sqrt":
    def schedule(step):
      step = jnp.asarray(step, jnp.float32) + 1.0
      if warmup == 0:
        return peak / jnp.sqrt(step)
      return peak * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))
    return schedule
  if config.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, peak, max(warmup, 1), max(num_train_steps, warmup + 1))
  if config.schedule == "constant":
    return optax.linear_schedule(0.0, peak, warmup) if warmup else optax.constant_schedule(peak)
  raise ValueError(f"config.optimizer.schedule={config.schedule!r} is not supported; choose one of "
                   f"{list(SCHEDULES)}.")


def parameter_path(path) -> str:
  """``"encoder/embedding/embedding"``: a parameter's path in the tree (``jax.tree_util`` keys) joined by ``/``."""
  return "/".join(str(getattr(key, "key", getattr(key, "name", key))) for key in path)


def frozen_labels(params, frozen_prefixes) -> object:
  """The tree of ``params`` with ``"frozen"`` where a parameter's path equals or lies under one of
  ``frozen_prefixes`` (``"encoder/embedding"`` freezes ``encoder/embedding/embedding``), else ``"trained"``.

  Raises:
    ConfigError: a prefix names no parameter (a misspelling would silently train everything).
  """
  def is_frozen(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")

  paths = [parameter_path(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  for prefix in frozen_prefixes:
    if not any(is_frozen(path, prefix) for path in paths):
      tops = sorted({path.split("/")[0] for path in paths})
      raise ConfigError(f"config.optimizer.frozen_params names {prefix!r}, which is no parameter's path (nor a "
                        f"prefix of one); paths start with {tops}, e.g. {paths[0]!r}.")
  return jax.tree_util.tree_map_with_path(
      lambda path, _: "frozen" if any(is_frozen(parameter_path(path), p) for p in frozen_prefixes) else "trained",
      params)


def make_optimizer(config, num_train_steps: int, constant_rate: float | None = None) -> optax.GradientTransformation:
  """Adam (paper: b1 0.9, b2 0.98, eps 1e-9) or Adafactor (``config.name``), optional decoupled weight decay and
  global-norm clipping.

  Adafactor is optax's (factored second moments, update clipping at RMS 1, steps scaled by each parameter's RMS)
  with the schedule applied last, after the weight decay, as AdamW applies it: either optimizer's update is the
  learning rate times a function of the gradients and parameters, which ``run_optimizer``'s sweeps rely on.

  ``config.frozen_params`` (optional; path prefixes such as ``("encoder/embedding",)``): those parameters get
  zero updates and no Adam moments, and are left out of the clipping norm; the rest train as usual.
  ``constant_rate``: this fixed rate instead of the schedule (a sweep's train step applies each replica's).
  """
  schedule = make_schedule(config, num_train_steps) if constant_rate is None else constant_rate
  parts = []
  if config.grad_clip_norm and config.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
  if config.name == "adafactor":
    parts.append(optax.adafactor(learning_rate=None, weight_decay_rate=config.weight_decay or None))
    parts.append(optax.scale_by_learning_rate(schedule, flip_sign=False))  # adafactor's updates descend already
  else:
    parts.append(optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps,
                             weight_decay=config.weight_decay))
  optimizer = optax.chain(*parts)
  frozen = config.frozen_params
  if not frozen:
    return optimizer
  return optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()},
                               lambda params: frozen_labels(params, frozen))


def run_optimizer(run_config: RunConfig) -> optax.GradientTransformation:
  """The optimizer of a run: ``make_optimizer`` of ``run_config.optimizer``; when the schedule is swept, at a constant
  rate of 1 instead, and the train step multiplies each replica's updates by its variant's rate
  (``run_schedules``): Adam's update is linear in its rate, decoupled weight decay included."""
  return make_optimizer(run_config.optimizer, run_config.num_train_steps,
                        constant_rate=1.0 if run_config.replicas.sweeps_schedule else None)


def run_schedules(run_config: RunConfig) -> list:
  """The learning-rate schedule of each variant (one without a sweep), as ``make_schedule`` builds it."""
  return [make_schedule(optimizer, run_config.num_train_steps) for optimizer in run_config.variant_optimizers()]


def read_run_config(workdir: str) -> RunConfig:
  """The ``RunConfig`` the run in ``workdir`` was trained with: its ``config.json`` with the changes its history
  records applied (``RunDirectory.config``).

  Raises:
    ConfigError: ``workdir`` does not exist or holds no readable ``config.json``.
    WorkdirError: the run is saved in an older format (``run_format``); the message names the converter.
  """
  return RunDirectory(workdir).config()


def seed_keys(run_config: RunConfig) -> jax.Array:
  """The run's parameter keys: ``[2]``, or ``[replicas, 2]`` for replicas with seeds seed, seed + 1, ...,
  seed + num_seeds - 1 (repeated for each variant of ``config.sweep``)."""
  if run_config.replicas.count > 1:
    return jnp.stack([jax.random.PRNGKey(run_config.seed + offset) for offset in run_config.replicas.seed_offsets()])
  return jax.random.PRNGKey(run_config.seed)


def abstract_train_state(create, run_config: RunConfig, strategy: Strategy):
  """Shapes, dtypes and ``strategy``'s shardings of the canonical train state that ``create(key)`` makes
  (one per replica for a run of several): the target checkpoints are restored onto."""
  keys = seed_keys(run_config)
  shapes = jax.eval_shape(jax.vmap(create) if run_config.replicas.count > 1 else create, keys)
  return strategy.abstract_canonical(shapes)


def abstract_params(model, init_inputs: tuple, run_config: RunConfig) -> SavedParams:
  """Shapes and dtypes of the run's parameters (with a leading replica axis for a run of several), traced from
  the model's init without computing anything, on this process's first device: what ``load_params`` restores
  onto; no optimizer is built, and its state stays on disk."""
  def init(key):
    return unboxed(model.init({"params": key, "dropout": key}, *init_inputs)["params"])

  shapes = jax.eval_shape(jax.vmap(init) if run_config.replicas.count > 1 else init, seed_keys(run_config))
  device = jax.sharding.make_single_device_sharding(jax.local_devices()[0])
  return SavedParams(jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device),
                                  shapes))


@dataclasses.dataclass
class LoadedParams:
  """What ``load_params`` returns.

  Attributes:
    params: host (numpy) parameter tree of one replica.
    steps: the restored step, or the averaged steps (oldest first).
    run_config: the run's configuration (``RunConfig``).
    task: its task (``transformer.tasks``), built from ``run_config``.
    model_config: the model's hyper-parameters (``task.model_config()``).
  """
  params: Any
  steps: list[int]
  run_config: RunConfig
  task: Task
  model_config: Any

  @property
  def step(self) -> int:
    """The restored (newest averaged) step."""
    return self.steps[-1]


def _check_load_arguments(run_config: RunConfig, checkpoint, average_last, replica) -> None:
  if not (checkpoint in ("best", "latest") or (isinstance(checkpoint, int) and checkpoint >= 0)):
    raise ConfigError(f"checkpoint={checkpoint!r}: give 'best', 'latest' or a step number.")
  if not isinstance(average_last, int) or average_last < 0:
    raise ConfigError(f"average_last={average_last!r}: give the number of checkpoints to average (0 = none).")
  if average_last and isinstance(checkpoint, int):
    raise ConfigError(f"average_last={average_last} averages the last checkpoints; it cannot be combined with "
                      f"checkpoint={checkpoint}.")
  if not 0 <= replica < run_config.replicas.count:
    raise ConfigError(f"replica={replica}: the run trained {run_config.replicas.count} replicas (config.num_seeds="
                      f"{run_config.num_seeds}, config.sweep={run_config.sweep!r}).")


def _use_recorded_tokenizers(task: Task, workdir: str) -> None:
  """Hands ``task`` the tokenizers its run recorded (``WORKDIR/tokenizers/``), where it takes them: a trained
  model then reads and writes text without its prepared data, which it reads only when something needs it."""
  recorded = recorded_tokenizers(workdir)
  if recorded and isinstance(task, UsesRecordedTokenizers):
    folder = RunDirectory(workdir).path(TOKENIZERS)
    task.use_recorded_tokenizers({name: os.path.join(folder, f"{name}.{fingerprint}.model")
                                  for name, fingerprint in recorded.items()})


def _restored_params(checkpointer, abstract_state, checkpoint, average_last: int, run_config: RunConfig,
                     workdir: str) -> tuple[list[int], Any]:
  """``(steps, params)`` of ``load_params``'s choice: the mean of the last ``average_last`` checkpoints, or the
  best, latest or given step's."""
  if average_last:
    return checkpointer.average_params(abstract_state, average_last)
  best = checkpoint == "best" and checkpointer.best_step() is not None
  step = checkpoint if isinstance(checkpoint, int) else None
  restored = checkpointer.restore(abstract_state, step=step, best=best)
  available = checkpointer.steps()
  if restored is None and not available:
    raise ConfigError(f"{workdir!r} holds no checkpoint yet: its run writes the first at step "
                      f"{run_config.checkpoint_every} (config.checkpoint_every), and another when it "
                      "ends or is stopped.")
  if restored is None or (step is not None and restored[0] != step):
    raise ConfigError(f"{workdir!r} holds no checkpoint of step {checkpoint}; its checkpoints are steps "
                      f"{available}.")
  return [restored[0]], restored[1].params


def load_params(workdir: str, checkpoint: str | int = "best", average_last: int = 0, replica: int = 0,
                config: ml_collections.ConfigDict | RunConfig | None = None) -> LoadedParams:
  """The parameters of the run in ``workdir`` (read alone: no optimizer is built and its state is not read);
  nothing in ``workdir`` is written.

  Args:
    workdir: a training run's directory.
    checkpoint: ``"best"`` (the checkpoint kept by ``config.best_metric``; the latest when the run kept
      none), ``"latest"``, or a step number.
    average_last: > 0: the mean parameters of the last ``average_last`` checkpoints instead
      (``checkpoint`` must then be left at ``"best"`` or ``"latest"``).
    replica: which replica's parameters of a run of several (``config.num_seeds > 1`` or ``config.sweep``):
      variant ``replica // num_seeds`` of the sweep, seed ``config.seed + replica % num_seeds``.
    config: the configuration to build the task and model from (a ``ConfigDict``, resolved here, or a
      ``RunConfig``); default: the run's own (``read_run_config``). Give one to change e.g. where the task finds
      its data.

  Raises:
    ConfigError: no checkpoint yet (the message says when the first comes), no such checkpoint (the message
      lists what the workdir holds), or a bad argument.
    WorkdirError: the run is saved in an older format (``run_format``); the message names the converter.
  """
  config = read_run_config(workdir) if config is None else config
  run_config = config if isinstance(config, RunConfig) else RunConfig.from_config(config)
  _check_load_arguments(run_config, checkpoint, average_last, replica)
  if not os.path.isdir(RunDirectory(workdir).path(CHECKPOINTS)):
    raise ConfigError(f"{workdir!r} holds no checkpoints/ folder; train first.")
  require_current_format(workdir)  # also when ``config`` is given: the run's record must be readable

  task = build_task(run_config)
  _use_recorded_tokenizers(task, workdir)
  model_config = task.model_config()
  check_tokenizers(workdir, task.trained_tokenizers(), has_checkpoints=True, write=False)
  abstract_state = abstract_params(task.build_model(model_config), task.placeholder_inputs(), run_config)
  # The best checkpoint is the run's own, by the metric it was saved with, whatever ``config`` says.
  recorded = read_run_config(workdir) if RunDirectory(workdir).has(CONFIG) else run_config
  checkpointer = Checkpointer(workdir, asynchronous=False, best_metric=recorded.best_metric or None,
                              best_mode=recorded.best_mode, run=RunDirectory(workdir).run_identity(),
                              layer_axis=int(run_config.replicas.count > 1))
  try:
    steps, params = _restored_params(checkpointer, abstract_state, checkpoint, average_last, run_config, workdir)
  except CheckpointRestoreError as error:
    raise ConfigError(f"{error} Does the configuration match {RunDirectory(workdir).path(CONFIG)}?") from error
  finally:
    checkpointer.close()
  params = jax.device_get(params)
  if run_config.replicas.count > 1:
    params = jax.tree.map(lambda x: x[replica], params)
  return LoadedParams(params=params, steps=list(steps), run_config=run_config, task=task, model_config=model_config)


def state_factory(session, model, optimizer, init_inputs):
  """``(create, abstract_state)``: ``create(key)`` initialises a train state; ``abstract_state`` is the
  canonical state's shapes with this strategy's shardings, the target checkpoints are restored onto."""
  def create(key):
    return create_train_state(model, optimizer, init_inputs, key)
  return create, abstract_train_state(create, session.run_config, session.strategy)


def with_params(session, state, params):
  """``state`` with ``params`` (a canonical tree of the same shapes) in place of its parameters, each placed
  as the one it replaces."""
  canonical = session.strategy.to_canonical(state)
  params = jax.tree.map(lambda new, old: jax.device_put(new, old.sharding), params, canonical.params)
  return session.strategy.from_canonical(canonical.replace(params=params))


def initial_state(session, create):
  """A fresh train state: every replica's seed, then ``config.restore_from``'s parameters or the task's
  pretrained weights where the run asks for them."""
  state = session.strategy.create_state(create, seed_keys(session.run_config))
  if session.run_config.restore_from:
    return _initialise_from(session, state, session.run_config.restore_from)
  if isinstance(session.task, StartsFromPretrained):
    return _initialise_pretrained(session, state)
  return state


def _broadcast(session, value, like):
  """``value`` (one replica's) placed as ``like``: the same for every replica of a run of several."""
  return jax.device_put(np.broadcast_to(value, like.shape) if session.num_replicas > 1 else value, like.sharding)


def _replica_shape(session, leaf):
  return leaf.shape[1:] if session.num_replicas > 1 else leaf.shape


def _initialise_from(session, state, source_workdir: str):
  """``config.restore_from``: the parameters of another run (its latest checkpoint) in place of the fresh
  ones; the optimizer state, step and data order start anew."""
  source = load_params(source_workdir, checkpoint="latest")
  canonical = session.strategy.to_canonical(state).params
  source_params = stack_layers(unstack_layers(source.params), canonical)  # either run may scan its layers
  fresh = jax.tree_util.tree_flatten_with_path(canonical)[0]
  loaded = jax.tree_util.tree_flatten_with_path(source_params)[0]
  expected = [(jax.tree_util.keystr(path), _replica_shape(session, leaf)) for path, leaf in fresh]
  found = [(jax.tree_util.keystr(path), np.shape(leaf)) for path, leaf in loaded]
  if expected != found:
    differences = [f"{e} != {f}" for e, f in zip(expected, found) if e != f] or ["a different number of tensors"]
    raise ConfigError(f"config.restore_from={source_workdir!r} holds parameters of another model shape "
                      f"({'; '.join(differences[:3])}); set config.model as that run had it.")
  params = jax.tree.map(lambda new, old: _broadcast(session, new, old), source_params, canonical)
  session.say(f"initialised parameters from {source_workdir} step {source.step}")
  return with_params(session, state, params)


def _initialise_pretrained(session, state):
  """``StartsFromPretrained`` tasks: the task's pretrained weights in place of those fresh parameters (every
  replica of a run of several gets the same; the others keep each seed's initialisation)."""
  # Pretrained weights name their layers one by one: matched against the model's parameters per layer.
  layer_axis = int(session.num_replicas > 1)
  model_params = session.strategy.to_canonical(state).params
  canonical = flax.traverse_util.flatten_dict(unstack_layers(model_params, layer_axis))
  pretrained = flax.traverse_util.flatten_dict(session.task.pretrained_params())
  if not pretrained:
    return state
  for path, value in pretrained.items():
    fresh = canonical.get(path)
    shape = None if fresh is None else _replica_shape(session, fresh)
    if shape != np.shape(value):
      raise ConfigError(f"pretrained parameter {'/'.join(path)} has shape {np.shape(value)}, the model's "
                        f"{'is ' + str(shape) if shape else 'does not exist'}; config.model does not match the "
                        "pretrained model.")
    canonical[path] = _broadcast(session, value, fresh)
  session.say(f"initialised {len(pretrained)} parameter tensors from pretrained weights")
  return with_params(session, state,
                     stack_layers(flax.traverse_util.unflatten_dict(canonical), model_params, layer_axis))
