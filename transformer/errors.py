"""The project's own error types: a user can cause them and fix them, so the command line shows each as one
clear line (no traceback). Any other exception is a bug and keeps its traceback."""


class ConfigError(ValueError):
  """A setting (config field or command-line argument) has a value that cannot work; the message names it."""


class MissingDataError(FileNotFoundError):
  """A data set, model or file that a command needs is not where it was looked for."""


class InputFileError(ValueError):
  """An input file is there but malformed: the message names the file, the place (row, tensor) and the fix."""
