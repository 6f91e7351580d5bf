"""The project's own error types: problems a user can cause and fix, reported as one clear line."""


class InputFileError(ValueError):
  """A data file the user supplied is malformed; the message names the file, the line and the fix."""
