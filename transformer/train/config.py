"""The ``ConfigDict`` every experiment starts from (``base_config``), resolved into a ``RunConfig`` by
``validate_config`` (older runs' configs: ``convert_run``).

Experiments (``experiments/*.py``) call ``base_config(model_name)`` and change what differs. Every field can be
overridden from the command line: ``--config.num_train_steps=300 --config.model.num_heads=4``. ``config.model``
holds the fields of the one model ``config.model_name`` names (``transformer.nn.MODELS``), so an override of
a field that model lacks fails at once, with a "did you mean" suggestion.
"""
from __future__ import annotations

import dataclasses
import os
import re
import tempfile

import ml_collections
import optax

from transformer.decode import DecodeSettings
from transformer.errors import ConfigError, WorkdirError
from transformer.nn import model_spec
from transformer.train.optimizer import OptimizerConfig
from transformer.train.run_config import RunConfig, model_fields
from transformer.train.optimizer import make_optimizer, make_schedule

MODES = ("train", "eval", "predict", "translate")


def set_field(config, path: str, value) -> None:
  """``config["a"]["b"] = value`` for ``path`` ``"a.b"`` (a ``ConfigDict`` or nested dicts); a missing section or
  field of a locked ``ConfigDict`` raises as indexing does."""
  *parents, leaf = path.split(".")
  for parent in parents:
    config = config[parent]
  config[leaf] = value


def model_section(model_name: str) -> ml_collections.ConfigDict:
  """``config.model`` of ``model_name``: its hyper-parameter dataclass's fields and defaults, locked (an unknown
  field is an error), less those the data or the mode decides."""
  defaults = model_spec(model_name).config()
  section = ml_collections.ConfigDict({name: getattr(defaults, name) for name in model_fields(model_name)})
  section.lock()
  return section


def set_model(config: ml_collections.ConfigDict, model_name: str) -> ml_collections.ConfigDict:
  """Make ``config`` train ``model_name``: ``config.model_name`` and a fresh ``config.model`` of its defaults."""
  config.model_name = model_name
  config.model = model_section(model_name)
  return config


def base_config(model_name: str = "transformer") -> ml_collections.ConfigDict:
  """The defaults every experiment starts from (``RunConfig``'s fields, where each is documented), with the model
  ``model_name`` (a key of ``transformer.nn.MODELS``; its defaults: for "transformer", the paper's base model)."""
  config = ml_collections.ConfigDict({field.name: field.default for field in RunConfig.scalar_fields()})
  config.task = ml_collections.ConfigDict({"name": ""})  # which task (transformer.tasks.TASKS) and its data
  set_model(config, model_name)  # the task fills in what the data decides
  config.optimizer = ml_collections.ConfigDict(dataclasses.asdict(OptimizerConfig()))
  config.decode = ml_collections.ConfigDict(dataclasses.asdict(DecodeSettings()))
  return config


def run_optimizer(run_config: RunConfig) -> optax.GradientTransformation:
  """The optimizer of a run: ``make_optimizer`` of ``run_config.optimizer``; when the schedule is swept, at a constant
  rate of 1 instead, and the train step multiplies each replica's updates by its variant's rate
  (``run_schedules``): Adam's update is linear in its rate, decoupled weight decay included."""
  return make_optimizer(run_config.optimizer, run_config.num_train_steps,
                        constant_rate=1.0 if run_config.replicas.sweeps_schedule else None)


def run_schedules(run_config: RunConfig) -> list:
  """The learning-rate schedule of each variant (one without a sweep), as ``make_schedule`` builds it."""
  return [make_schedule(optimizer, run_config.num_train_steps) for optimizer in run_config.variant_optimizers()]


def validate_config(config: ml_collections.ConfigDict, workdir: str | None = None, mode: str = "train") -> RunConfig:
  """The run description of ``config`` (``RunConfig.from_config``: every value checked before anything is
  compiled, a message naming the field and the fix); ``workdir``: a training run's, checked to be writable."""
  if mode not in MODES:
    raise ConfigError(f"--mode={mode!r} is not supported; choose one of {list(MODES)}.")
  run_config = RunConfig.from_config(config)
  if workdir is not None:
    check_workdir(workdir)
  return run_config


def check_workdir(workdir: str) -> None:
  """The workdir of a training run: a local path (``refuse_url_workdir``) to a directory (created if missing)
  this process can write to."""
  refuse_url_workdir(workdir)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f"--workdir={workdir!r} is a file, not a directory; choose a directory (it is created if "
                      "missing).")
  try:
    os.makedirs(workdir, exist_ok=True)
    # A uniquely named probe: several processes of one multi-host run check the same workdir at once.
    with tempfile.TemporaryFile(dir=workdir):
      pass
  except OSError as error:
    raise ConfigError(f"--workdir={workdir!r} is not writable ({error.strerror}); choose a directory you "
                      f"can write to.") from None


def refuse_url_workdir(workdir: str) -> None:
  """Every mode reads and writes the workdir with ``os`` and ``open``, which take ``gs://bucket/run`` for a local
  folder named ``gs:``: refuse any ``scheme://`` workdir before anything is written.

  Raises:
    WorkdirError: ``workdir`` is a URL; the message names the fix (mount the bucket, pass the mount path).
  """
  scheme, separator, rest = workdir.partition("://")
  if not separator or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
    return
  fix = (f"give the path itself, --workdir={rest}" if scheme.lower() == "file" else
         f"mount the bucket (e.g. with gcsfuse) and pass the mount path, e.g. --workdir=/mnt/{rest}")
  raise WorkdirError(f"--workdir={workdir!r} is a URL, but the workdir is read and written as local files: {fix}.")
