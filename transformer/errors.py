"""The project's own error types: problems a user can cause and fix, reported as one clear line."""


class WorkdirError(ValueError):
  """The workdir cannot be used as it is (another run holds it, it is a file, it holds earlier outputs but
  no checkpoint); the message names the workdir and the fix."""


class CheckpointRestoreError(WorkdirError):
  """Checkpoints exist but none could be restored: refusing to silently start from scratch."""


class TrainingDiverged(RuntimeError):
  """The loss or gradient norm became non-finite; the message names the step and what to change."""
