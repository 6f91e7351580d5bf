"""A run on disk: the one place that names the files of a workdir and reads them back, typed.

::

    WORKDIR/
      run_format.json        the shape of the files below (``run_format``; older runs: ``convert_run``)
      config.json            the run's config as it started (``RunConfig.record``), never rewritten
      config_history.jsonl   changes accepted since: a JSON line each (step, field, old, new)
      model_config.json      the model's hyper-parameters, data-decided ones included
      data_fingerprint.json  the source files the data was prepared from
      tokenizers/            the tokenizers the run trained
      metrics.jsonl          a JSON line per logging step and per evaluation
      launches.jsonl         a JSON line per training launch: start step, processes, devices, parallelism
      goodput.json           where the run's time went (``goodput``)
      checkpoints/  best/    orbax checkpoints: the latest few, and the best by ``config.best_metric``
      tensorboard/           event files of the same metrics
      profile/               a jax.profiler trace of a few steps (``config.profile_steps``)
      train.lock             held while a training run owns the workdir
      eval_results.json      ``--mode=eval``'s metrics (in ``average_last_N/`` for the mean of N checkpoints)
      predict_results.json   ``--mode=predict``'s step and files (the task's predictions beside it)

``RunDirectory(workdir).config()`` is the run's ``RunConfig`` (format checked, history applied);
``.metrics()`` its ``MetricsLog``. Nothing else opens these files by name; ``convert_run`` alone knows older
layouts.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os

import ml_collections
import numpy as np

from transformer.errors import ConfigError, WorkdirError
from transformer.train.run_config import RunConfig
from transformer.train.config import set_field

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
CHECKPOINTS = "checkpoints"
BEST = "best"
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


RATES = ("train/steps_per_second", "train/tokens_per_second")


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
    from transformer.train.run_format import require_current_format  # pylint: disable=import-outside-toplevel
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


