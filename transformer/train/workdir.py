"""A run on disk and the guard around it: the files of a workdir read back typed (``RunDirectory``), the
format they are saved in, the training lock, the shared-storage check, and the run's record (``config.json``
written once, allowed changes appended to the history, the data and tokenizers it was trained on).

A run on disk: the one place that names the files of a workdir and reads them back, typed.

::

    WORKDIR/
      run_format.json        the shape of the files below (older runs: ``convert_run``)
      config.json            the run's config as it started (``RunConfig.record``), never rewritten
      config_history.jsonl   changes accepted since: a JSON line each (step, field, old, new)
      model_config.json      the model's hyper-parameters, data-decided ones included
      data_fingerprint.json  the source files the data was prepared from
      tokenizers/            the tokenizers the run reads text with: those it trained, a pretrained model's files
      metrics.jsonl          a JSON line per logging step and per evaluation
      launches.jsonl         a JSON line per training launch: start step, processes, devices, parallelism
      goodput.json           where the run's time went (``loop.Goodput``)
      checkpoints/           orbax checkpoints: the latest few, and the best by ``config.best_metric``
      tensorboard/           event files of the same metrics
      profile/               a jax.profiler trace of a few steps (``config.profile_steps``)
      train.lock             held while a training run owns the workdir
      eval_results.json      ``--mode=eval``'s metrics (in ``average_last_N/`` for the mean of N checkpoints)
      predict_results.json   ``--mode=predict``'s step and files (the task's predictions beside it)

``RunDirectory(workdir).config()`` is the run's ``RunConfig`` (format checked, history applied);
``.metrics()`` its ``MetricsLog``. Nothing else opens these files by name; ``convert_run`` alone knows older
layouts.

The format of a saved run: which shape its ``config.json`` and ``model_config.json`` have.

A run records ``FORMAT`` (``{"format_version": N}``) when it starts, beside its ``config.json``. The code
reads runs of ``FORMAT_VERSION`` only; a run of another format (or none: saved before the marker existed) is
refused in one line that names the converter, ``python -m transformer.train.convert_run WORKDIR``, which
holds all knowledge of older shapes. Raise ``FORMAT_VERSION`` (and teach the converter the step) when a change
of the code makes saved runs unreadable as they are.

Owning a workdir: one training run at a time (a lock), never starting over on top of earlier outputs, and in a
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

import dataclasses
import difflib
import fcntl
import hashlib
import json
import logging
import os
import shlex
import socket
import tempfile
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from transformer.data.files import is_write_refused, write_atomically, write_refused_error
from transformer.effects import Effect, effect_of
from transformer.errors import ConfigError, UserError, WorkdirError
from transformer.train.checkpoint import CHECKPOINTS, Checkpointer
from transformer.train.config import RunConfig, base_config, set_field

log = logging.getLogger(__name__)

FORMAT = "run_format.json"
CONFIG = "config.json"
HISTORY = "config_history.jsonl"
MODEL_CONFIG = "model_config.json"
DATA_FINGERPRINT = "data_fingerprint.json"
TOKENIZERS = "tokenizers"
METRICS = "metrics.jsonl"
LAUNCHES = "launches.jsonl"
GOODPUT = "goodput.json"
BEST = "best"  # format 2 kept the best checkpoint here; convert_run moves it into checkpoints/
TENSORBOARD = "tensorboard"
PROFILE = "profile"
LOCK = "train.lock"
EVAL_RESULTS = "eval_results.json"
PREDICT_RESULTS = "predict_results.json"

# What a run starting from step 0 over an earlier one would mix with its own; and the record moved with them.
EARLIER_OUTPUTS = (METRICS, CHECKPOINTS, BEST, TENSORBOARD)
RUN_RECORD = (CONFIG, HISTORY, DATA_FINGERPRINT, LAUNCHES, GOODPUT)


def read_records(path: str, required: tuple[str, ...] = ()) -> list[dict]:
  """The records of a JSON-lines file (``metrics.jsonl``, ``config_history.jsonl``, ``launches.jsonl``), each a
  JSON object holding the keys ``required``. A half-written last line (a crash mid-write) is skipped with a
  warning; a damaged line before it, or a record that is no object or lacks a required key, is a
  ``WorkdirError`` naming the file and the line."""
  with open(path) as f:
    lines = f.read().split("\n")
  records = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      if any(rest.strip() for rest in lines[number:]):
        raise WorkdirError(f"{path} line {number} is not a JSON record ({line[:80]!r}); repair or remove that "
                           "line to resume.") from None
      log.warning("skipping the half-written last line %d of %s (%r): the run was interrupted while writing it",
                  number, path, line[:80])
      continue
    missing = [key for key in required if not isinstance(record, dict) or key not in record]
    if missing or not isinstance(record, dict):
      raise WorkdirError(f"{path} line {number} is not a record of this file ({line[:80]!r}: no "
                         f"{', '.join(map(repr, missing))}); repair or remove that line to resume.")
    records.append(record)
  return records


RATES = ("train/steps_per_second", "train/tokens_per_second", "train/tflops_per_device", "train/mfu")


def is_timing(name: str) -> bool:
  """Whether the metric ``name`` measures the machine rather than the run (throughput, wall time, where a
  window's time went): two runs of the same config agree on every other metric."""
  return name in RATES or name == "wall_seconds" or name.startswith("time/")


def read_metrics(workdir: str) -> list[dict]:
  """The records of ``workdir``'s ``metrics.jsonl`` ([] without one)."""
  return list(RunDirectory(workdir).metrics().records)


@dataclasses.dataclass(frozen=True)
class MetricsLog:
  """A run's ``metrics.jsonl``: ``records`` in step order, each ``{"step": int, name: float, ...}`` (training
  logs hold ``train/...``, evaluations ``eval/...``)."""
  records: tuple[dict, ...] = ()

  @property
  def last_step(self) -> int:
    """The last step logged or evaluated (0 for none)."""
    return max((record["step"] for record in self.records), default=0)

  @property
  def progress(self) -> tuple[int, float]:
    """``(step, wall seconds)`` of the last record that times the run (``(0, nan)`` before the first log)."""
    timed = self.values("wall_seconds")
    return timed[-1] if timed else (0, float("nan"))

  def with_prefix(self, prefix: str) -> list[dict]:
    """The records holding a metric named ``prefix...`` (e.g. ``"eval/"``), each cut down to those metrics and
    its step."""
    out = []
    for record in self.records:
      values = {name: value for name, value in record.items() if name.startswith(prefix)}
      if values:
        out.append({"step": record["step"], **values})
    return out

  def without_timing(self) -> list[dict]:
    """The records without their timing metrics (``is_timing``): what the same run on any machine writes."""
    return [{name: value for name, value in record.items() if not is_timing(name)} for record in self.records]

  def last_evaluation(self) -> dict:
    """The ``eval/...`` metrics of the last evaluation ({} without one)."""
    evaluations = self.with_prefix("eval/")
    return {name: value for name, value in evaluations[-1].items() if name != "step"} if evaluations else {}

  def values(self, name: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every record holding ``name``."""
    return [(record["step"], record[name]) for record in self.records if name in record]

  def best(self, name: str, mode: str = "max") -> dict | None:
    """The record of the best ``name`` (``mode`` "max" or "min"; the first at a tie), None without one."""
    holding = [record for record in self.records if name in record]
    if not holding:
      return None
    return (max if mode == "max" else min)(holding, key=lambda record: record[name])

  def evaluation_at(self, step: int) -> dict | None:
    """The last evaluation record of ``step`` (None if the run has not evaluated there)."""
    done = [record for record in self.records
            if record["step"] == step and any(name.startswith("eval/") for name in record)]
    return done[-1] if done else None

  def median_rate(self, name: str = "train/steps_per_second") -> float:
    """The median of ``name`` over the logging windows after the first, whose time holds the compilation (NaN
    with none): the run's throughput."""
    rates = [value for _, value in self.values(name)][1:]
    return float(np.median(rates)) if rates else float("nan")


def record_identity(record: dict) -> str:
  """A run's identity: a digest of its record as it started (``config.json``). Every checkpoint carries it, so
  that one copied from another run's workdir (another seed, the same architecture) is refused, not resumed."""
  return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


class RunDirectory:
  """The workdir of one run: ``path(NAME)`` for each of its files, and readers that check what they read."""

  def __init__(self, workdir: str):
    self.workdir = os.fspath(workdir)

  def path(self, name: str) -> str:
    return os.path.join(self.workdir, name)

  def has(self, name: str) -> bool:
    return os.path.exists(self.path(name))

  def has_checkpoints(self) -> bool:
    """Whether ``checkpoints/`` or ``best/`` exists (whatever it holds)."""
    return any(os.path.isdir(self.path(name)) for name in (CHECKPOINTS, BEST))

  def read_json(self, name: str, kind: type = dict):
    """The JSON of the file ``name``, a ``kind`` (an object by default).

    Raises:
      WorkdirError: it is not JSON, or not a ``kind`` (a run writes it atomically: was it edited?).
    """
    path = self.path(name)
    try:
      with open(path) as f:
        value = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
      raise WorkdirError(f"{path} is not valid JSON ({error}); it was written by the training run, was it "
                         "edited?") from None
    if not isinstance(value, kind):
      raise WorkdirError(f"{path} holds a JSON {type(value).__name__}, not the {kind.__name__} the training run "
                         "writes there; was it edited? Restore it from a copy, or use a new --workdir.")
    return value

  def run_identity(self) -> str | None:
    """The identity of the run recorded here (``record_identity`` of its ``config.json``, never rewritten), or
    None without one."""
    return record_identity(self.read_json(CONFIG)) if self.has(CONFIG) else None

  def read_lines(self, name: str, required: tuple[str, ...] = ()) -> list[dict]:
    """The JSON lines of the file ``name`` ([] without the file), see ``read_records``."""
    return read_records(self.path(name), required) if self.has(name) else []

  def output_dir(self, average_checkpoints: int = 0) -> str:
    """Where ``--mode=eval`` and ``--mode=predict`` write: the workdir, or ``average_last_N/`` for the mean of the
    last N checkpoints."""
    return self.path(f"average_last_{average_checkpoints}") if average_checkpoints else self.workdir

  def eval_results(self, average_checkpoints: int = 0) -> dict:
    """``--mode=eval``'s metrics ({} before it ran)."""
    path = os.path.join(self.output_dir(average_checkpoints), EVAL_RESULTS)
    return RunDirectory(os.path.dirname(path)).read_json(EVAL_RESULTS) if os.path.isfile(path) else {}

  def config_values(self, any_format: bool = False) -> dict:
    """The run's config as JSON values: ``config.json`` with the changes of ``config_history.jsonl`` applied,
    in order. ``any_format``: also a run saved in an older format, as it is (the caller reads it through
    ``convert_run.upgrade_config``).

    Raises:
      ConfigError: the workdir does not exist or holds no ``config.json``, or it is not JSON.
      WorkdirError: the run is saved in an older format (``run_format``); the message names the converter.
    """
    if not os.path.exists(self.workdir):
      raise ConfigError(f"{self.workdir!r} does not exist: give the --workdir of a run of launch.py (or of "
                        "transformer.train.run).")
    if not os.path.isfile(self.path(CONFIG)):
      raise ConfigError(f"{self.workdir!r} holds no {CONFIG}: give the --workdir of a run of launch.py (or of "
                        "transformer.train.run).")
    if not any_format:
      require_current_format(self.workdir)
    try:
      values = self.read_json(CONFIG)
    except WorkdirError as error:
      raise ConfigError(str(error)) from None
    for change in self.read_lines(HISTORY, required=("field", "new")):
      if change["field"] != "data":  # the data's fingerprint (data_fingerprint.json), not a config field
        set_field(values, change["field"], change["new"])
    return values

  def config_dict(self, overrides_from: ml_collections.ConfigDict | None = None,
                  fields: list[str] = ()) -> ml_collections.ConfigDict:
    """``config_values`` as a ``ConfigDict``, with the values of ``fields`` (``"a.b"``: a command's
    ``--config.a.b`` overrides) taken from the command's config ``overrides_from``."""
    saved = ml_collections.ConfigDict(self.config_values())
    for path in fields:
      *parents, leaf = path.split(".")
      source, target = overrides_from, saved
      for parent in parents:
        source, target = source[parent], target[parent]
      with target.ignore_type():  # JSON gave lists where the config file has tuples
        target[leaf] = source[leaf]
    return saved

  def config(self) -> RunConfig:
    """The run's ``RunConfig``, resolved from ``config_values``."""
    return RunConfig.from_config(self.config_dict())

  def metrics(self) -> MetricsLog:
    """The run's ``metrics.jsonl`` (empty without one)."""
    return MetricsLog(tuple(self.read_lines(METRICS, required=("step",))))

  def launches(self) -> list[dict]:
    return self.read_lines(LAUNCHES)


FORMAT_VERSION = 3  # 2: the best checkpoint in best/; 1: model_name and decode in config.json (no marker);
# 0: architecture/rnn sections
CONVERT_COMMAND = "python -m transformer.train.convert_run"


def read_format(workdir: str) -> int | None:
  """The format version ``workdir``'s marker records; None when it has none (a run saved before markers).

  Raises:
    WorkdirError: the marker is not the JSON this module writes.
  """
  directory = RunDirectory(workdir)
  if not os.path.isfile(directory.path(FORMAT)):
    return None
  try:
    version = directory.read_json(FORMAT)["format_version"]
  except (WorkdirError, KeyError) as error:
    version = error
  if not isinstance(version, int) or isinstance(version, bool):
    raise WorkdirError(f"{directory.path(FORMAT)} is not a run-format marker ({version!r}); it is written by the "
                       f'training run as {{"format_version": {FORMAT_VERSION}}}. Was it edited?')
  return version


def write_format(workdir: str, version: int = FORMAT_VERSION) -> None:
  """Record that ``workdir``'s run is saved in format ``version``."""
  write_atomically(RunDirectory(workdir).path(FORMAT), json.dumps({"format_version": version}) + "\n")


def require_current_format(workdir: str) -> None:
  """Refuse a run this code cannot read as it is saved.

  Raises:
    WorkdirError: ``workdir`` has no marker or another format; the message names the command that converts it.
  """
  version = read_format(workdir)
  if version == FORMAT_VERSION:
    return
  if version is not None and version > FORMAT_VERSION:
    raise WorkdirError(f"{workdir} is saved in run format {version}, newer than this code's "
                       f"{FORMAT_VERSION} ({FORMAT}); update the code to read it.")
  found = f"run format {version}" if version is not None else f"an older run format (no {FORMAT})"
  raise WorkdirError(f"{workdir} is saved in {found}; this code reads format {FORMAT_VERSION}. Convert it once "
                     f"with: {CONVERT_COMMAND} {shlex.quote(workdir)}")


log = logging.getLogger(__name__)


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
  holder = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}).encode()
  try:
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, holder, 0)
  except OSError as error:
    os.close(descriptor)  # nothing was taken: the empty file is removed with the lock it would have been
    os.remove(path)
    if not is_write_refused(error):
      raise
    raise write_refused_error(error, path, len(holder), "the training lock") from None
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
  resume, evaluate or load the run with other pieces; a task that reads a pretrained model's tokenizer has it
  from a folder that can change. The run's own copies are kept in ``WORKDIR/tokenizers/``
  (``<name>.<fingerprint>.model``, whatever the file's format), so the error names the file to copy, and
  ``transformer.load`` reads them instead of the data's or the folder's.

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
            f"model from the same text and options on another host (and a pretrained folder can hold another "
            f"model), and the checkpoints' token ids would mean other pieces. Copy the run's own copy over this "
            f"one: cp {folder}/{name}.{fingerprint}.model {tokenizer.path or 'TOKENIZER_PATH'} (or train from "
            f"scratch in a new --workdir).")
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
    WorkdirError: the workdir holds damaged checkpoints, or metrics that a checkpoint covered.
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


@dataclasses.dataclass(frozen=True)
class ConfigChange:
  """One setting of a command that differs from the run's record. ``allowed``: needs no
  ``config.accept_changes``; ``recorded``: goes to the run's history when training goes on with it."""
  field: str
  old: Any
  new: Any
  allowed: bool
  recorded: bool


def _flatten(tree: dict, prefix: str = "") -> dict:
  out = {}
  for name, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, f"{prefix}{name}."))
    else:
      out[prefix + name] = value
  return out


def record_defaults(run_config: RunConfig) -> dict:
  """``{"a.b": value}``: what each field of ``run_config``'s kind of record means when a saved record lacks it (a field
  added to the code since, a section missing or null): its default, as ``RunConfig.from_config`` reads it."""
  defaults = _flatten(json.loads(json.dumps(base_config(run_config.model_name).to_dict())))
  task = {f"task.{field.name}": field.default for field in dataclasses.fields(run_config.task)
          if field.default is not dataclasses.MISSING}
  return {**defaults, **_flatten(json.loads(json.dumps(task, default=list)))}


def config_differences(saved: dict, run_config: RunConfig, mode: str) -> list[ConfigChange]:
  """The settings of ``run_config`` (a command's config) that differ from ``saved`` (the run's record, history applied),
  each judged by its declared effect (``RunConfig.effects``): bookkeeping and local settings are free; those
  of evaluation and layout are allowed (recorded when training goes on with them); any other needs
  ``config.accept_changes``. A field the record lacks (added to the code since, or its section missing)
  keeps the record's behaviour by its default (``record_defaults``): it differs only where the command sets
  another value. Raising ``num_train_steps`` extends a run (allowed, recorded; so is lowering it, except under
  a cosine schedule, whose rates it sets)."""
  old = {name: value for name, value in _flatten(saved).items() if value is not None or "." in name}
  old, new, effects = {**record_defaults(run_config), **old}, _flatten(run_config.record), run_config.effects()
  changes = []
  for field in sorted(set(old) & set(new)):
    effect = effects.get(field, Effect.RESULTS)
    if old[field] == new[field] or not effect.recorded:
      continue
    allowed = effect.accepted
    if field == "num_train_steps":  # the step a run ends at; only a cosine schedule's rates depend on it
      allowed = mode != "train" or new[field] >= old[field] or saved.get("optimizer", {}).get("schedule") != "cosine"
    changes.append(ConfigChange(field, old[field], new[field], allowed=allowed, recorded=mode == "train"))
  return changes


@dataclasses.dataclass
class Session:
  """What every mode shares, made by ``prepare``: the run's config, its task and model, the parallelism, the
  checkpointer, and which process this is. ``info`` is where progress lines go (stderr in translate mode, so
  that translations stand alone on stdout)."""
  run_config: RunConfig
  workdir: str
  mode: str
  task: object
  model_config: object
  strategy: object
  checkpointer: Checkpointer
  process_index: int
  process_count: int
  info: object
  lock: object = None  # the workdir's training lock (train mode, main process), released when training ends
  started: float = dataclasses.field(default_factory=time.perf_counter)  # when ``prepare`` began (goodput)
  created: bool = False  # this launch created the workdir: a start that fails before its first step removes it

  @property
  def directory(self) -> RunDirectory:
    return RunDirectory(self.workdir)

  @property
  def is_main(self) -> bool:
    return self.process_index == 0

  @property
  def host_batch_size(self) -> int:
    return self.run_config.batch_size // self.process_count

  @property
  def num_replicas(self) -> int:
    return self.run_config.replicas.count

  def say(self, text: str) -> None:
    """Print a progress line from the main process."""
    if self.is_main:
      print(text, file=self.info, flush=True)


def check_workdir_model(workdir: str, model_config, has_checkpoints: bool, write: bool) -> None:
  """A workdir belongs to one model: refuse checkpoints of a different architecture. ``write`` (a training
  run's main process) records ``model_config.json`` when the run starts; it is never rewritten after. A run
  saved in an older format is refused (``run_format``) before its record is compared."""
  directory = RunDirectory(workdir)
  path = directory.path(MODEL_CONFIG)
  current = dataclasses.asdict(model_config)
  if has_checkpoints and os.path.exists(path):
    require_current_format(workdir)
    saved = directory.read_json(MODEL_CONFIG)
    # Dropout, kernels and how the same layers are recomputed (``Effect.LAYOUT``: remat) leave the parameters as
    # they are, so a resumed run may change them.
    ignored = ("deterministic", "decode", "dropout_rate", "attention_dropout_rate", "feed_forward_dropout_rate",
               "kernels", *(field.name for field in dataclasses.fields(model_config)
                            if effect_of(field) is Effect.LAYOUT))
    # A field added since the run was saved compares as its default (which keeps the saved model's behaviour).
    defaults = {field.name: field.default for field in dataclasses.fields(model_config)}
    differences = [f"{k}: {saved.get(k, defaults.get(k))!r} -> {current.get(k)!r}"
                   for k in sorted(set(saved) | set(current))
                   if k not in ignored and saved.get(k, defaults.get(k)) != current.get(k)]
    if differences:
      raise ConfigError(f"--workdir={workdir} holds checkpoints of a different model ({'; '.join(differences)}). "
                        "Use a new --workdir, or set the model back to match.")
    return
  if write:
    write_atomically(path, json.dumps(current, indent=2, sort_keys=True))


def hold_to_record(session: Session, resuming: bool, write_history: bool = False) -> None:
  """A run starting (not ``resuming``) writes its record: ``config.json`` and the data's fingerprint. A resume or
  a read-only mode compares its config and data with the record: a difference that changes results and is
  not accepted is refused; one that is allowed goes to the history with ``write_history`` (training that goes
  on from a restored checkpoint)."""
  _hold_to_config(session, resuming, write_history)
  _hold_to_data(session, resuming, write_history)


def _hold_to_config(session: Session, resuming: bool, write_history: bool) -> None:
  run_config, workdir = session.run_config, session.workdir
  path = session.directory.path(CONFIG)
  if resuming and session.mode == "train" and not os.path.isfile(path) and session.checkpointer.has_checkpoints():
    raise WorkdirError(f"--workdir={workdir} holds checkpoints but not {CONFIG}, the record they were trained "
                       f"with: put it back (a copy of the workdir, or {CONFIG}.v* beside it), or start a new "
                       "--workdir; the run cannot be resumed without it.")
  _check_accepted_names(run_config, record_defaults(run_config))  # a fresh run too: it is stored in the record
  if not resuming or not os.path.isfile(path):
    if session.is_main and session.mode == "train":
      write_format(workdir)  # first: config.json without it reads as an older run, to convert
      write_atomically(path, json.dumps(run_config.record, indent=2, sort_keys=True))
      session.say(f"config: {path}")
    return
  changes = config_differences(session.directory.config_values(), run_config, session.mode)
  refused = [change for change in changes if not change.allowed and change.field not in run_config.accepted_changes]
  if refused:
    raise ConfigError(
        f"--workdir={workdir} was trained with other settings: "
        + "; ".join(f"{c.field}: {c.old!r} -> {c.new!r}" for c in refused)
        + ". Set them back, use a new --workdir, or accept the change with --config.accept_changes="
        + ",".join(c.field for c in refused) + f" (it is recorded in {HISTORY}).")
  if write_history:
    _append_history(session, [(c.field, c.old, c.new) for c in changes if c.recorded])


def _check_accepted_names(run_config: RunConfig, fields: dict) -> None:
  """``config.accept_changes`` names config fields (``a.b``) or ``data``: a misspelt one would accept nothing."""
  known = set(fields) | {"data"}
  for name in sorted(run_config.accepted_changes - known):
    close = difflib.get_close_matches(name, sorted(known), n=1)
    raise ConfigError(f"config.accept_changes names {name!r}, which is no config field"
                      + (f"; did you mean {close[0]!r}?" if close else "")
                      + " Give the fields as a command's refusal names them, e.g. optimizer.learning_rate, or data.")


def _append_history(session: Session, changes: list[tuple]) -> None:
  """Append ``(field, old, new)`` changes, from the run's latest checkpoint on, to its history (``HISTORY``)."""
  if not changes or not session.is_main or session.mode != "train":
    return
  step = max(session.checkpointer.steps() + [session.checkpointer.best_step() or 0])
  with open(session.directory.path(HISTORY), "a") as f:
    for field, old, new in changes:
      f.write(json.dumps({"step": step, "field": field, "old": old, "new": new}) + "\n")
  session.say(f"{HISTORY}: from step {step}, " + "; ".join(f"{field}: {old!r} -> {new!r}"
                                                              for field, old, new in changes))


def _hold_to_data(session: Session, resuming: bool, write_history: bool) -> None:
  """Record the fingerprint of the data a run starts on; refuse a later command on other data, unless
  ``config.accept_changes`` names ``data`` (recorded in the history like any accepted change)."""
  path = session.directory.path(DATA_FINGERPRINT)
  current = session.task.data_fingerprint()
  if not resuming or not os.path.isfile(path):
    if session.is_main and session.mode == "train" and current:
      write_atomically(path, json.dumps(current, indent=2, sort_keys=True))
    return
  recorded = session.directory.read_json(DATA_FINGERPRINT)
  if recorded == current:
    return
  changed = sorted(name for name in set(recorded) | set(current) if recorded.get(name) != current.get(name))
  if "data" not in session.run_config.accepted_changes:
    raise ConfigError(
        f"--workdir={session.workdir} was trained on other data: {', '.join(changed)} "
        f"({recorded.get(changed[0], 'absent')} then, {current.get(changed[0], 'absent')} now). Point the task "
        "at the run's data, use a new --workdir, or accept it with --config.accept_changes=data.")
  if write_history:
    _append_history(session, [("data", recorded, current)])
    if session.is_main:  # the run goes on with this data: later commands compare with it
      write_atomically(path, json.dumps(current, indent=2, sort_keys=True))


def record_launch(session: Session, step: int, process_started: float) -> None:
  """Append this training launch to the run's ``LAUNCHES``, with when its process started (``process_started``,
  epoch seconds; the first line's is the job's start); a launch on other process or device counts than the one
  before says so in one line (the global batch and its order do not depend on them)."""
  launch = {"step": step, "processes": session.process_count, "devices": jax.device_count(),
            "platform": jax.devices()[0].platform, "parallelism": session.strategy.name,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "process_started": round(process_started, 3)}
  launches = session.directory.launches()
  previous = launches[-1] if launches else None
  counts = ("processes", "devices")
  if step and previous and any(previous[name] != launch[name] for name in counts):
    session.say(f"elastic restore: the run's last launch (from step {previous['step']}) had {previous['processes']} "
                f"process(es) x {previous['devices']} devices, this one {launch['processes']} x {launch['devices']}, "
                f"from step {step}: the same global batches in the same order; losses equal up to the order of "
                "the sums.")
  if session.is_main:
    with open(session.directory.path(LAUNCHES), "a") as f:
      f.write(json.dumps(launch) + "\n")
