"""The project's own error types: errors the user causes and can fix, importable from every layer."""


class InputFileError(ValueError):
  """An input file that is there but unreadable as the format it should have (e.g. not UTF-8)."""


__all__ = ["InputFileError"]
