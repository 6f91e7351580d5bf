"""Tasks: what differs between experiments, looked up by ``config.task.name``.

Tasks are imported on first use, so a task's optional dependencies (the ``data`` extra: TFDS, SentencePiece,
sacreBLEU, Hugging Face ``tokenizers`` and ``safetensors``) are needed only by the experiments that use it; a missing
one is one line naming the extra (``require_extra``), before anything is imported or prepared.
"""
from __future__ import annotations

import importlib
import importlib.util

from transformer.errors import MissingDependencyError
from transformer.tasks.base import (StartsFromPretrained, Task, TaskSettings, TranslatesText, UsesRecordedTokenizers,
                                   WritesPredictions, WritesTestOutputs)
from transformer.tasks.configs import TASK_CONFIGS, TaskConfig, task_config, task_config_class

# name -> (module, class, pip extra its dependencies come from); the task's config.task dataclass is
# configs.TASK_CONFIGS[name], which is also the task class's task_config_class.
TASKS = {
    "synthetic": ("transformer.tasks.synthetic", "SyntheticTask", None),
    "translation": ("transformer.tasks.translation", "TranslationTask", "data"),
    "forecasting": ("transformer.tasks.forecasting", "ForecastingTask", "data"),
    "classification": ("transformer.tasks.classification", "ClassificationTask", "data"),
    "language_model": ("transformer.tasks.language_model", "LanguageModelTask", "data"),
}

# The modules that each optional extra of setup.cfg installs (module -> its pip package); a test keeps the
# packages equal to setup.cfg's.
EXTRA_MODULES = {
    "data": {"tensorflow_datasets": "tensorflow-datasets", "sentencepiece": "sentencepiece",
             "sacrebleu": "sacrebleu", "tokenizers": "tokenizers", "safetensors": "safetensors"},
    # jax.export's serialization (python -m transformer.export), not a task's.
    "export": {"flatbuffers": "flatbuffers"},
}


def require_extra(extra: str, needed_by: str) -> None:
  """Raises ``MissingDependencyError`` (one line: what needs it, the missing packages, the ``pip install``
  command) unless every package of the pip extra ``extra`` is installed. Checks without importing them."""
  missing = [package for module, package in EXTRA_MODULES[extra].items() if importlib.util.find_spec(module) is None]
  if missing:
    raise MissingDependencyError(f"{needed_by} needs the {extra!r} extra ({', '.join(missing)} not installed): "
                                 f"run pip install -e \".[{extra}]\" in the repository.")


def make_task(settings: TaskSettings) -> Task:
  """The task of ``settings`` (``RunConfig.task_settings()``; ``transformer.train.build_task`` takes a config),
  named by ``config.task.name``, with a clear error for an unknown name or a missing extra."""
  name = settings.task.name
  task_config_class(name)  # a ConfigError naming the known tasks
  module_name, class_name, extra = TASKS[name]
  if extra is not None:  # all of the extra, also what the task imports late (e.g. safetensors for pretrained models)
    require_extra(extra, f"the {name!r} task")
  return getattr(importlib.import_module(module_name), class_name)(settings)


__all__ = ["EXTRA_MODULES", "StartsFromPretrained", "Task", "TaskConfig", "TaskSettings", "TASK_CONFIGS", "TASKS",
           "TranslatesText", "UsesRecordedTokenizers", "WritesPredictions", "WritesTestOutputs", "make_task",
           "require_extra", "task_config", "task_config_class"]
