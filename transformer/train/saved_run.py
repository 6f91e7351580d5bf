"""A saved run read back from its workdir: the configuration it was trained with, its parameters, and how a
command's config differs from it.

``read_run_config`` gives a run's ``RunConfig`` (``RunDirectory``); ``load_params`` restores the parameters of
the best, latest, a given step's or the mean of the last N checkpoints. ``transformer.load`` builds a usable
model on these; ``config.restore_from`` (weights-only initialisation of another run) uses ``load_params``;
``config_differences`` holds a command to the run's record. "Restore" means one thing throughout: a
checkpoint's arrays brought back (``Checkpointer.restore``).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from transformer.effects import Effect
from transformer.errors import ConfigError
from transformer.tasks import Task, UsesRecordedTokenizers
from transformer.train.run_config import RunConfig, build_task
from transformer.train.checkpoint import Checkpointer, CheckpointRestoreError, SavedParams
from transformer.train.config import base_config
from transformer.train.run_directory import CHECKPOINTS, CONFIG, TOKENIZERS, RunDirectory
from transformer.train.parallel import Strategy
from transformer.train.run_format import require_current_format
from transformer.train.workdir import check_tokenizers, recorded_tokenizers



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
    return model.init({"params": key, "dropout": key}, *init_inputs)["params"]

  shapes = jax.eval_shape(jax.vmap(init) if run_config.replicas.count > 1 else init, seed_keys(run_config))
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
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


def load_params(workdir: str, checkpoint: str | int = "best", average_last: int = 0, replica: int = 0,
                config: ml_collections.ConfigDict | RunConfig | None = None) -> LoadedParams:
  """The parameters of the run in ``workdir`` (read alone: no optimizer is built and its state is not read);
  nothing in ``workdir`` is written.

  Args:
    workdir: a training run's directory.
    checkpoint: ``"best"`` (the checkpoint kept by ``config.best_metric``; the latest when the run kept
      none), ``"latest"``, or a step number.
    average_last: > 0: the mean parameters of the last ``average_last`` periodic checkpoints instead
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
  checkpointer = Checkpointer(workdir, asynchronous=False, best_metric=run_config.best_metric or None,
                              best_mode=run_config.best_mode)
  try:
    if average_last:
      steps, params = checkpointer.average_params(abstract_state, average_last)
    else:
      best = checkpoint == "best" and checkpointer.best_step() is not None
      step = checkpoint if isinstance(checkpoint, int) else None
      restored = checkpointer.restore(abstract_state, step=step, best=best)
      available = checkpointer.steps()
      if restored is None and not available:
        raise ConfigError(f"{workdir!r} holds no checkpoint yet: its run writes the first at step "
                          f"{run_config.checkpoint_every} (config.checkpoint_every), and another when it "
                          "ends or is stopped.")
      if restored is None or (step is not None and restored[0] != step):
        raise ConfigError(f"{workdir!r} holds no checkpoint of step {checkpoint}; its periodic checkpoints are "
                         f"steps {available}.")
      steps, params = [restored[0]], restored[1].params
  except CheckpointRestoreError as error:
    raise ConfigError(f"{error} Does the configuration match {RunDirectory(workdir).path(CONFIG)}?") from error
  finally:
    checkpointer.close()
  params = jax.device_get(params)
  if run_config.replicas.count > 1:
    params = jax.tree.map(lambda x: x[replica], params)
  return LoadedParams(params=params, steps=list(steps), run_config=run_config, task=task, model_config=model_config)


@dataclasses.dataclass(frozen=True)
class ConfigChange:
  """One setting of a command that differs from the run's record. ``allowed``: needs no
  ``config.accept_changes``; ``recorded``: goes to the run's history when training goes on with it."""
  field: str
  old: Any
  new: Any
  allowed: bool
  recorded: bool


def _flatten(tree: dict, prefix: str = "") -> dict:
  out = {}
  for name, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, f"{prefix}{name}."))
    else:
      out[prefix + name] = value
  return out


def record_defaults(run_config: RunConfig) -> dict:
  """``{"a.b": value}``: what each field of ``run_config``'s kind of record means when a saved record lacks it (a field
  added to the code since, a section missing or null): its default, as ``RunConfig.from_config`` reads it."""
  defaults = _flatten(json.loads(json.dumps(base_config(run_config.model_name).to_dict())))
  task = {f"task.{field.name}": field.default for field in dataclasses.fields(run_config.task)
          if field.default is not dataclasses.MISSING}
  return {**defaults, **_flatten(json.loads(json.dumps(task, default=list)))}


def config_differences(saved: dict, run_config: RunConfig, mode: str) -> list[ConfigChange]:
  """The settings of ``run_config`` (a command's config) that differ from ``saved`` (the run's record, history applied),
  each judged by its declared effect (``RunConfig.effects``): bookkeeping and local settings are free; those
  of evaluation and layout are allowed (recorded when training goes on with them); any other needs
  ``config.accept_changes``. A field the record lacks (added to the code since, or its section missing)
  keeps the record's behaviour by its default (``record_defaults``): it differs only where the command sets
  another value. Raising ``num_train_steps`` extends a run (allowed, recorded; so is lowering it, except under
  a cosine schedule, whose rates it sets)."""
  old = {name: value for name, value in _flatten(saved).items() if value is not None or "." in name}
  old, new, effects = {**record_defaults(run_config), **old}, _flatten(run_config.record), run_config.effects()
  changes = []
  for field in sorted(set(old) & set(new)):
    effect = effects.get(field, Effect.RESULTS)
    if old[field] == new[field] or not effect.recorded:
      continue
    allowed = effect.accepted
    if field == "num_train_steps":  # the step a run ends at; only a cosine schedule's rates depend on it
      allowed = mode != "train" or new[field] >= old[field] or saved.get("optimizer", {}).get("schedule") != "cosine"
    changes.append(ConfigChange(field, old[field], new[field], allowed=allowed, recorded=mode == "train"))
  return changes
