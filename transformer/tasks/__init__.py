"""Tasks: what differs between experiments, looked up by ``config.task.name``.

Tasks are imported on first use, so a task's optional dependencies (TFDS, SentencePiece and sacreBLEU for
translation: the ``data`` extra) are needed only by the experiments that use it.
"""
from __future__ import annotations

import difflib
import importlib

from transformer.errors import ConfigError
from transformer.tasks.base import (StartsFromPretrained, Task, TranslatesText, WritesPredictions,
                                   WritesTestOutputs)

# name -> (module, class, pip extra its dependencies come from)
TASKS = {
    "synthetic": ("transformer.tasks.synthetic", "SyntheticTask", None),
    "translation": ("transformer.tasks.translation", "TranslationTask", "data"),
    "forecasting": ("transformer.tasks.forecasting", "ForecastingTask", "data"),
    "classification": ("transformer.tasks.classification", "ClassificationTask", "data"),
    "language_model": ("transformer.tasks.language_model", "LanguageModelTask", "data"),
}


def build_task(config) -> Task:
  """The task named by ``config.task.name``, with a clear error for an unknown name or a missing extra."""
  name = config.task.name
  if name not in TASKS:
    close = difflib.get_close_matches(name, TASKS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"config.task.name={name!r} is not a known task; choose one of {sorted(TASKS)}.{hint}")
  module_name, class_name, extra = TASKS[name]
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as error:
    if extra is None:
      raise
    raise ConfigError(f"the {name!r} task needs the {error.name!r} package: install the {extra!r} extra with "
                     f"pip install -e '.[{extra}]'") from None
  return getattr(module, class_name)(config)


__all__ = ["StartsFromPretrained", "Task", "TASKS", "TranslatesText", "WritesPredictions", "WritesTestOutputs", "build_task"]
