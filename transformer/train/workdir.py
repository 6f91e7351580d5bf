"""Owning a workdir: one training run at a time (a lock), never starting over on top of earlier outputs, and in a
multi-process run one folder that every process shares (``check_shared_workdir``).

The lock is ``WORKDIR/train.lock``, held with ``fcntl.flock`` for the life of the training run, so the OS
releases it when the process dies however it dies (a lock left by ``kill -9`` never blocks a rerun). The file
also holds a small JSON of the holder (pid, host, start time) for the message a second run refuses with.
In a multi-process run only process 0 takes it: the processes of one run share the workdir by design, and a
second run's process 0 refusing is enough to stop that run.

Evaluation, prediction and translation do not take it: they only read checkpoints (never move or delete
one) and write their own output files, so they may run while a training run continues, e.g. to evaluate
the best checkpoint so far.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import tempfile
import time

import jax
import numpy as np

from transformer.data.files import write_atomically
from transformer.errors import UserError, WorkdirError
from transformer.train.run_directory import (BEST, CHECKPOINTS, CONFIG, EARLIER_OUTPUTS, FORMAT, HISTORY, LAUNCHES,
                                             LOCK, METRICS, MODEL_CONFIG, RUN_RECORD, TENSORBOARD, TOKENIZERS,
                                             RunDirectory, read_metrics)

log = logging.getLogger(__name__)

# Outputs of an earlier run that a run starting from step 0 would overwrite or mix with its own.

SHARED_MARKER_PREFIX = ".shared-workdir-"  # check_shared_workdir's file, removed once every process looked
SHARED_WAIT = 5.0  # seconds a process looks for that file: a shared file system may show a new file late

_held: dict[str, int] = {}  # workdir -> file descriptor of the lock this process holds


class WorkdirLock:
  """The training run's hold on a workdir; ``release()`` it when the run ends (the OS does if it dies)."""

  def __init__(self, workdir: str, descriptor: int):
    self.workdir = workdir
    self._descriptor = descriptor

  def release(self) -> None:
    """Give the workdir up; its lock file goes with it (a run that dies leaves it, released by the OS)."""
    if _held.get(self.workdir) == self._descriptor:
      del _held[self.workdir]
      try:
        os.remove(os.path.join(self.workdir, LOCK))  # while held: a run starting now opens a new file
      except OSError:
        pass
      os.close(self._descriptor)  # closing the descriptor releases the flock


def lock_workdir(workdir: str, mode: str = "train") -> WorkdirLock | None:
  """Take the workdir for a training run (process 0 only; other modes and processes take nothing).

  A lock still held in this process by an earlier ``run`` that raised is taken over.

  Raises:
    WorkdirError: another live process holds the workdir; the message names its pid, host and start time.
  """
  if mode != "train" or jax.process_index() != 0:
    return None
  workdir = os.path.realpath(workdir)
  if workdir in _held:  # an earlier run in this process ended with an exception before releasing it
    os.close(_held.pop(workdir))
  path = os.path.join(workdir, LOCK)
  try:
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  except OSError as error:  # e.g. a directory of that name
    raise WorkdirError(f"cannot open the workdir's lock file {path} ({error.strerror}); it is the training "
                       "run's own file: move whatever is there away and rerun.") from None
  try:
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = _read_holder(descriptor)
    os.close(descriptor)
    raise WorkdirError(f"--workdir={workdir} is in use by another training run ({holder}); wait for it to "
                       f"finish or stop it, or choose another --workdir.") from None
  holder = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
  os.ftruncate(descriptor, 0)
  os.pwrite(descriptor, json.dumps(holder).encode(), 0)
  _held[workdir] = descriptor
  return WorkdirLock(workdir, descriptor)


def check_shared_workdir(workdir: str) -> None:
  """Every process of a multi-process run sees the same workdir (a single process returns at once).

  Process 0 writes a random token into a file named by it, the token is sent to every process, and each looks
  for it there. A folder of the same name on each host's own disk would otherwise hang the run at its first
  save, each process waiting for files the others wrote elsewhere. The name is new to every host (no stale
  NFS or gcsfuse cache of it), and a process that does not see it yet looks again for ``SHARED_WAIT`` seconds.

  Raises:
    WorkdirError: on every process, when any process does not see the token; the message names them.
  """
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  os.makedirs(workdir, exist_ok=True)
  token = np.frombuffer(os.urandom(16), np.uint8) if jax.process_index() == 0 else np.zeros(16, np.uint8)
  if jax.process_index() == 0:
    write_atomically(_marker_path(workdir, token), token.tobytes())
  token = np.asarray(multihost_utils.broadcast_one_to_all(token), np.uint8)
  sees = np.int32(_sees_token(_marker_path(workdir, token), token.tobytes()))
  seen = np.asarray(multihost_utils.process_allgather(sees)).reshape(-1)
  multihost_utils.sync_global_devices("check_shared_workdir")  # every process has looked before it goes
  if jax.process_index() == 0:
    os.remove(_marker_path(workdir, token))
  blind = [index for index, saw in enumerate(seen) if not saw]
  if blind:
    who = f"process {blind[0]} does" if len(blind) == 1 else f"processes {', '.join(map(str, blind))} do"
    raise WorkdirError(f"--workdir={workdir} is not shared between the processes of this run: {who} not see the "
                       "file process 0 wrote there, and the run would hang at its first save. Give every process "
                       "the same shared folder (NFS, a mounted bucket) as --workdir.")


def _marker_path(workdir: str, token: np.ndarray) -> str:
  return os.path.join(workdir, f"{SHARED_MARKER_PREFIX}{token.tobytes().hex()}")


def _sees_token(path: str, token: bytes) -> bool:
  deadline = time.monotonic() + SHARED_WAIT
  while True:
    try:
      with open(path, "rb") as f:
        if f.read() == token:
          return True
    except OSError:
      pass
    if time.monotonic() > deadline:
      return False
    time.sleep(0.25)


def _read_holder(descriptor: int) -> str:
  try:
    holder = json.loads(os.pread(descriptor, 4096, 0).decode())
    return f"pid {holder['pid']} on host {holder['host']}, started {holder['started']}"
  except (OSError, ValueError, KeyError, TypeError):  # the holder is still writing it
    return "a process that is just starting"


def recorded_tokenizers(workdir: str) -> dict[str, str]:
  """name -> fingerprint of the tokenizers the run in ``workdir`` trained with (``check_tokenizers``)."""
  folder = os.path.join(workdir, TOKENIZERS)
  files = os.listdir(folder) if os.path.isdir(folder) else []
  return {name: rest[:-len(".model")] for name, _, rest in (file.partition(".") for file in files)
          if rest.endswith(".model")}


def check_tokenizers(workdir: str, tokenizers: dict, has_checkpoints: bool, write: bool) -> None:
  """The checkpoints' token ids mean what the run's tokenizers made them mean: refuse others.

  A task that trains its tokenizers (``Task.trained_tokenizers``) finds them in a cache keyed by the training
  options, but another host can train a different model from the same options and text, which would silently
  resume, evaluate or load the run with other pieces. The run's own models are kept in
  ``WORKDIR/tokenizers/`` (``<name>.<fingerprint>.model``), so the error names the file to copy.

  Args:
    tokenizers: name -> tokenizer with ``fingerprint``, ``model_proto``, ``path``.
    has_checkpoints: whether the workdir holds a trained state to protect (else it is (re)recorded).
    write: record the tokenizers (the main process of a training run); other modes only read.
  """
  folder = os.path.join(workdir, TOKENIZERS)
  recorded = recorded_tokenizers(workdir)
  if has_checkpoints:
    for name, tokenizer in sorted(tokenizers.items()):
      fingerprint = recorded.get(name)
      if fingerprint is not None and fingerprint != tokenizer.fingerprint:
        raise WorkdirError(
            f"--workdir={workdir} was trained with another {name} tokenizer (fingerprint {fingerprint}) than this "
            f"host's {tokenizer.path or 'tokenizer'} ({tokenizer.fingerprint}): SentencePiece can train a different "
            f"model from the same text and options on another host, and the checkpoints' token ids would mean "
            f"other pieces. Copy the run's own model over this one: cp {folder}/{name}.{fingerprint}.model "
            f"{tokenizer.path or 'TOKENIZER_PATH'} (or train from scratch in a new --workdir).")
  if write and tokenizers:
    os.makedirs(folder, exist_ok=True)
    for name, tokenizer in tokenizers.items():
      if recorded.get(name) == tokenizer.fingerprint:
        continue
      for stale in [f for f in os.listdir(folder) if f.startswith(f"{name}.")]:
        os.remove(os.path.join(folder, stale))
      write_atomically(os.path.join(folder, f"{name}.{tokenizer.fingerprint}.model"), tokenizer.model_proto)


def check_writable(folder: str, what: str) -> None:
  """Raises ``WorkdirError`` unless this process can create a file in ``folder``; ``what`` says why it must."""
  try:
    with tempfile.TemporaryFile(dir=folder):
      pass
  except OSError as error:
    raise WorkdirError(f"{what}, but {folder} is not writable ({error.strerror}); make it writable, or copy the "
                       "run to a folder you can write to.") from None


# Files only a run writes: a folder holding one of them is a run's workdir.
RUN_MARKERS = (CONFIG, METRICS, CHECKPOINTS, BEST, FORMAT, MODEL_CONFIG, TOKENIZERS, TENSORBOARD, HISTORY, LAUNCHES,
               LOCK)


def refuse_foreign_folder(workdir: str, restart: bool) -> None:
  """A training run starts in a new or empty folder, or in a run's own workdir: a folder holding other files and
  no run (a project's checkout, a data folder) would get a run's files mixed into it.

  Raises:
    WorkdirError: ``workdir`` holds visible files but none a run writes, and ``restart`` does not ask for it.
  """
  if restart or not os.path.isdir(workdir):
    return
  names = sorted(name for name in os.listdir(workdir) if not name.startswith("."))
  if not names or any(name in RUN_MARKERS for name in names):
    return
  shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
  raise WorkdirError(f"--workdir={workdir} holds files that are no run's ({shown}); give a new or empty folder (or "
                     "a run's workdir), or --config.restart=True to train there anyway.")


def check_fresh_start(workdir: str, restart: bool, checkpoint_every: int) -> None:
  """Before training from step 0 in ``workdir`` (no checkpoint restored): refuse when an earlier run saved
  checkpoints that are gone, unless ``restart``, which moves its outputs into ``WORKDIR/previous-<UTC time>/``.

  An earlier run killed before its first checkpoint was committed lost nothing: its metrics lines are
  rewritten identically, so that start goes on without asking. A metrics line past step
  ``2 * checkpoint_every`` proves a committed checkpoint: a second save waits for the first to commit. The
  earlier run's own ``checkpoint_every`` counts (its record's), not this command's: a raised value must not
  hide the checkpoints it saved.

  Raises:
    WorkdirError: the workdir holds ``best/``, damaged checkpoints, or metrics that a checkpoint covered.
  """
  found = [name for name in EARLIER_OUTPUTS if _has_content(os.path.join(workdir, name))]
  records = read_metrics(workdir) if METRICS in found else []
  checkpoint_every = min(checkpoint_every, _recorded_checkpoint_every(workdir) or checkpoint_every)
  checkpoint_committed = any(record["step"] > 2 * checkpoint_every for record in records)
  if not checkpoint_committed and not {CHECKPOINTS, BEST} & set(found):
    return
  if not restart:
    raise WorkdirError(
        f"--workdir={workdir} holds {', '.join(found)} of an earlier run (metrics up to step "
        f"{max([r['step'] for r in records], default=0)}) but no checkpoint to resume from; "
        "refusing to start from scratch over them. Rerun with --config.restart=True to start again (the "
        f"earlier files are moved to {os.path.join(workdir, 'previous-<time>')}), or choose another --workdir.")
  if jax.process_index() != 0:  # every process refuses alike; one moves the files
    return
  target = os.path.join(workdir, f"previous-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
  os.makedirs(target)
  for name in found + [name for name in RUN_RECORD if os.path.isfile(os.path.join(workdir, name))]:
    source = os.path.join(workdir, name)
    if name in (CHECKPOINTS, BEST):  # their checkpoint managers are open: move what is inside
      os.makedirs(os.path.join(target, name))
      for entry in os.listdir(source):
        os.rename(os.path.join(source, entry), os.path.join(target, name, entry))
    else:
      os.rename(source, os.path.join(target, name))
  print(f"config.restart=True: moved {', '.join(found)} of the earlier run to {target}; training from step 0.",
        flush=True)


def _recorded_checkpoint_every(workdir: str) -> int | None:
  """The ``checkpoint_every`` of the run recorded in ``workdir`` (None without a readable record)."""
  directory = RunDirectory(workdir)
  if not directory.has(CONFIG):
    return None
  try:
    value = directory.config_values(any_format=True).get("checkpoint_every")
  except (UserError, AttributeError, TypeError, ValueError):  # a damaged record: this command's value decides
    return None
  return value if isinstance(value, int) and value > 0 else None


def _has_content(path: str) -> bool:
  if os.path.isdir(path):  # orbax's temporary directories of a save that never completed do not count
    return any("orbax-checkpoint-tmp" not in name for name in os.listdir(path))
  return os.path.isfile(path) and os.path.getsize(path) > 0
