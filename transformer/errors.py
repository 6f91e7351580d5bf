"""The project's own error types: errors the user causes and can fix, importable from every layer.

``launch.py`` prints these as one line (``error: ...``) and exits non-zero; any other exception is a bug and
keeps its traceback. All are ``ValueError`` subclasses (and ``MissingDataError`` a ``FileNotFoundError``), so
code that catches those keeps working. This module imports nothing from the package.
"""


class UserError(ValueError):
  """Base class: the input (config, data, file) is wrong, not the code; the message names the fix."""


class ConfigError(UserError):
  """A bad config value or field: an unknown name, a value outside its choices, settings that conflict."""


class MissingDataError(UserError, FileNotFoundError):
  """A data set, model or file that a command needs is not where it was looked for."""


class InputFileError(UserError):
  """An input file that is there but unreadable as the format it should have: not UTF-8, truncated, lines
  or columns missing."""


__all__ = ["UserError", "ConfigError", "MissingDataError", "InputFileError"]
