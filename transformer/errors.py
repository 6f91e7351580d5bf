"""The project's own error types: errors the user causes and can fix, importable from every layer.

``launch.py`` and the results scripts print these as one line (``error: ...``) and exit non-zero
(``exit_on_user_error``); any other exception is a bug and keeps its traceback. All are ``ValueError``
subclasses (``MissingDataError`` also a ``FileNotFoundError``, ``MissingDependencyError`` an ``ImportError``,
``TrainingDiverged`` a ``RuntimeError``), so code that catches those keeps working. This module imports nothing
from the package.
"""
import sys


class UserError(ValueError):
  """Base class: the input (config, data, file, workdir) is wrong, not the code; the message names the fix."""


class ConfigError(UserError):
  """A bad config value or field: an unknown name, a value outside its choices, settings that conflict."""


class MissingDataError(UserError, FileNotFoundError):
  """A data set, model or file that a command needs is not where it was looked for."""


class MissingDependencyError(UserError, ImportError):
  """A package of one of the install's optional extras (setup.cfg) is not installed; the message names the extra
  and its ``pip install`` command."""


class InputFileError(UserError):
  """An input file that is there but unreadable as the format it should have: not UTF-8, truncated, lines
  or columns missing."""


class WorkdirError(UserError):
  """The workdir cannot be used as it is (another run holds it, it is a file, it holds earlier outputs but
  no checkpoint); the message names the workdir and the fix."""


class CheckpointRestoreError(WorkdirError):
  """Checkpoints exist but none could be restored: refusing to silently start from scratch."""


class ClusterError(UserError):
  """A multi-process run cannot start: this process was not launched as the cluster expects (``srun``), or the
  other processes did not join in time; the message names the processes expected and what to check."""


class TrainingDiverged(UserError, RuntimeError):
  """The loss or gradient norm became non-finite; the message names the step and what to change."""


def exit_on_user_error(function, *args, **kwargs):
  """``function(...)``, with a ``UserError`` turned into one line ``error: ...`` on stderr and exit status 1;
  any other exception propagates with its traceback."""
  try:
    return function(*args, **kwargs)
  except UserError as error:
    sys.exit(f"error: {error}")


__all__ = ["UserError", "ConfigError", "MissingDataError", "MissingDependencyError", "InputFileError",
           "WorkdirError", "CheckpointRestoreError", "ClusterError", "TrainingDiverged", "exit_on_user_error"]
