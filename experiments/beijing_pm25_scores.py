"""The Beijing PM2.5 runs' records, kept input windows, scores and paired comparisons for the results page."""
from __future__ import annotations

import os
import re

import numpy as np

from experiments import launching, output_pages, record_store, stats
from experiments.beijing_pm25 import RECURRENT, TRANSFORMERS, WINDOW_CANDIDATES, get_config
from experiments.beijing_pm25_forecasts import (
    EQUAL_INPUTS_FILE, FORECASTS_FILE, VALIDATION_FILE, forecasts_path, load_forecasts, load_validation_errors,
    validation_path, write_forecasts, write_validation_errors)
from transformer import read_run_config
from transformer.errors import UserError
from transformer.nn.forecasters import CHANNEL_INDEPENDENT
from transformer.tasks.metrics import forecast_metrics
from transformer.train.checkpoint import CHECKPOINTS
from transformer.train.workdir import MetricsLog, RunDirectory

MODELS = RECURRENT + TRANSFORMERS + ("dlinear",)
# A row's name; ``-pm25_only`` or ``-all_inputs``: a run on other inputs than its variant's published ones.
RUN_NAME = re.compile(r"^(?P<variant>[a-z_]+)-(?P<hours>\d+)h(?:-(?P<inputs>pm25_only|all_inputs))?$")
BOOTSTRAP_BLOCK_HOURS = 168  # nearby origins share target hours and weather episodes: resample whole weeks of them
RERUN_HEADER = ["run", "validation MAE (training log)", "best step"]  # a rerun's row says what of these changed
BOOTSTRAP_RESAMPLES = 10_000  # per resampling seed; the interval pools the seeds' draws
# A single seed's bounds move by tenths with the seed: "beyond the interval" only where every seed's interval
# says so, and the page prints how far a single seed's bounds are from the pooled ones.
RESAMPLING_SEEDS = 5


def run_command(variant: str, hours: int, config=None) -> str:
  """The command that trains ``variant`` on ``hours`` of input, or with the overrides of a run's ``config``."""
  parts = ["python", "launch.py", f"--config=experiments/beijing_pm25.py:{variant}", "--workdir=WORKDIR"]
  reference = get_config(variant)
  if config is not None:
    parts += launching.config_overrides(reference, config)
  elif hours != reference.model.input_length:
    parts.append(f"--config.model.input_length={hours}")
  return "TRANSFORMER_DATA_DIR=../shared/data " + launching.command_line(parts)


def find_runs(workdir_root: str) -> dict[str, str]:
  """``row name -> workdir`` of the runs under ``workdir_root`` named as ``RUN_NAME`` says that have a checkpoint."""
  names = sorted(os.listdir(workdir_root)) if os.path.isdir(workdir_root) else []
  checkpoints = {name: RunDirectory(os.path.join(workdir_root, name)).path(CHECKPOINTS) for name in names
                 if (match := RUN_NAME.match(name)) and match["variant"] in MODELS}
  return {name: os.path.join(workdir_root, name) for name, path in checkpoints.items()
          if os.path.isdir(path) and os.listdir(path)}


def inputs_name(variant: str, input_features: str) -> str:
  """A row name's suffix for ``variant`` on ``input_features``: "" (its published inputs), pm25_only or all_inputs."""
  target_only = input_features == "target" or (input_features == "auto" and variant in CHANNEL_INDEPENDENT)
  return "" if target_only == (variant in CHANNEL_INDEPENDENT) else ("pm25_only" if target_only else "all_inputs")


def reads_pm25_only(values: dict) -> bool:
  """Whether a record's run read pm2.5 alone (its ``inputs``, else its variant's published inputs)."""
  return values.get("inputs", "pm25_only" if values["model"] in CHANNEL_INDEPENDENT else "") == "pm25_only"


def run_values(row: str, workdir: str, config) -> dict:
  """A row's model, input hours and inputs (unless published); a ``UserError`` where its name misstates them."""
  match = RUN_NAME.match(row)
  variant, inputs = match["variant"], inputs_name(match["variant"], config.model.input_features)
  if inputs != (match["inputs"] or ""):
    expected = f"{variant}-{match['hours']}h" + (f"-{inputs}" if inputs else "")
    raise UserError(f"{workdir}: its run read config.model.input_features={config.model.input_features!r}, "
                    f"which its name does not say; rename the workdir {expected} (a row name says its inputs)")
  return {"model": variant, "hours": int(match["hours"]), **({"inputs": inputs} if inputs else {})}


def record_runs(store: record_store.RecordStore, folder: str, workdir_root: str) -> None:
  """Records the runs under ``workdir_root`` and writes into ``folder`` their validation errors (with the rows
  recorded before) and the test forecasts of the kept and equal-input ones."""
  runs = find_runs(workdir_root)
  if not runs:
    commands = [f"- {name}: `{run_command(name, hours)}`" for name in MODELS for hours in WINDOW_CANDIDATES[name]]
    raise UserError(f"no run with checkpoints under {workdir_root} (named <variant>-<hours>h); train "
                    f"first, e.g.:\n" + "\n".join(commands))
  from_logs = {row: log_values(RunDirectory(workdir).metrics()) for row, workdir in runs.items()}
  steps = {row: from_log.pop("steps") for row, from_log in from_logs.items()}
  store.check(steps)
  for row, from_log in from_logs.items():
    config = read_run_config(runs[row])
    values = {**run_values(row, runs[row], config), "seeds": config.num_seeds, "eval_every": config.eval_every,
              "num_train_steps": config.num_train_steps, "workdir_root": workdir_root, **from_log}
    output_pages.add_row(store, row, steps[row], run_command(values["model"], values["hours"], config), values,
                         rerun_cells, RERUN_HEADER, tuple(RERUN_HEADER[1:]), workdir=runs[row])
  kept = [f"{name}-{hours}h" for name, hours in sorted(kept_windows(store).items(), key=lambda item: -item[1])]
  compared = [row for row, name in equal_input_runs(store).items() if row == name]
  for rows, file in ((kept, FORECASTS_FILE), (compared, EQUAL_INPUTS_FILE)):  # each file is written whole
    if any(row in runs for row in rows) and not all(row in runs for row in rows):
      raise UserError(f"{file} holds the test forecasts of {', '.join(rows)} together, but "
                      f"{', '.join(row for row in rows if row not in runs)} have no workdir under {workdir_root}: "
                      "give a --workdir_root that holds all of them (links to their workdirs will do)")
  write_validation_errors(runs, os.path.join(folder, VALIDATION_FILE), validation_path(store))
  if all(row in runs for row in kept):  # the longest input window first; else the forecasts of earlier runs stay
    write_forecasts({RUN_NAME.match(row)["variant"]: runs[row] for row in kept}, os.path.join(folder, FORECASTS_FILE))
  if compared and all(row in runs for row in compared):
    origins = load_forecasts(forecasts_path(FORECASTS_FILE, folder))["origin_time"]
    write_forecasts({row: runs[row] for row in compared}, os.path.join(folder, EQUAL_INPUTS_FILE), origins)


def log_values(log: MetricsLog) -> dict:
  """A row's values its training log gives, which ``experiments.verify`` recomputes from the committed log: the last
  timed step and the wall time then, the evaluation of lowest validation MAE (its step: the best checkpoint's), the
  median training speed."""
  (steps, wall_seconds), best = log.progress, log.best("eval/mae", mode="min")
  return {"steps": steps, "best_step": best["step"], "validation_mae": best["eval/mae"],
          "wall_seconds": wall_seconds, "steps_per_second": log.median_rate()}


def rerun_cells(row: str, record: dict) -> list[str]:
  """``RERUN_HEADER``'s cells of a record."""
  return [row, f"{record['values']['validation_mae']:.2f}", str(record["values"]["best_step"])]


def validation_maes(store: record_store.RecordStore) -> dict[str, dict[int, float]]:
  """Model -> {input hours: validation MAE} of the store's runs on published inputs (the others are never kept):
  recomputed from the run's validation errors (``validation_path``) where they are there, else its training
  log's best ``eval/mae``, as recorded."""
  recomputed, tried = recomputed_validation_maes(validation_path(store)), {}
  for row, values in ((row, store[row]["values"]) for row in store if "inputs" not in store[row]["values"]):
    tried.setdefault(values["model"], {})[values["hours"]] = recomputed.get(row, values["validation_mae"])
  return tried


def recomputed_validation_maes(path: str) -> dict[str, float]:
  """Row -> the validation MAE of its errors in ``write_validation_errors``' file (none: {}): per seed the mean
  absolute error over every measured target of the row's windows, horizons pooled, as training's ``eval/mae``;
  the mean over seeds."""
  data = load_validation_errors(path) if os.path.exists(path) else {"errors": {}}
  maes = {}
  for row, errors in data["errors"].items():  # [seeds, windows], NaN on windows of other rows only
    own = np.isfinite(errors[0])
    maes[row] = float((errors[:, own].sum(1) / data["measured"][own].sum()).mean())
  return maes


def logged_validation_rows(store: record_store.RecordStore) -> list[str]:
  """The rows on published inputs whose validation MAE is their training log's: ``validation_path`` lacks them."""
  recomputed = recomputed_validation_maes(validation_path(store))
  return [row for row in sorted(store, key=run_order) if "inputs" not in store[row]["values"]
          and row not in recomputed]


def kept_windows(store: record_store.RecordStore) -> dict[str, int]:
  """Model -> the input hours of its run with the lowest validation MAE, over the store's runs."""
  return {name: min(by_hours, key=by_hours.get) for name, by_hours in validation_maes(store).items()}


def run_order(row: str) -> tuple[int, int]:
  """Where row ``row`` sorts: by model (``MODELS``' order), then input hours."""
  match = RUN_NAME.match(row)
  return MODELS.index(match["variant"]), int(match["hours"])


def equal_input_runs(store: record_store.RecordStore) -> dict[str, str]:
  """Row -> the name of its test forecasts on equal inputs (its model's where kept, else its own), by ``run_order``."""
  kept, rows = kept_windows(store), {}
  for row in store:
    values = store[row]["values"]
    if "inputs" in values:
      published = f"{values['model']}-{values['hours']}h"
      rows[published] = values["model"] if kept.get(values["model"]) == values["hours"] else published
      rows[row] = row
  return dict(sorted(rows.items(), key=lambda item: (*run_order(item[0]), item[0])))


def test_metrics(data: dict) -> dict:
  """Model -> ``{"mae", "rmse": [seeds, H]}`` in µg/m³ over the measured targets (a baseline's NaN unscored)."""
  metrics = {}
  for name, forecasts in data["forecasts"].items():
    per_seed = [forecast_metrics(np.nan_to_num(forecast), np.nan_to_num(data["actual"]),
                                 data["mask"] & np.isfinite(forecast)) for forecast in forecasts]
    metrics[name] = {metric: np.stack([m[metric] for m in per_seed]) for metric in ("mae", "rmse")}
  return metrics


def best_of(family: tuple[str, ...], error: dict[str, float]) -> str | None:
  """The model of ``family`` with the lowest ``error`` (model -> a validation or test MAE; None: none has one)."""
  candidates = [name for name in family if name in error]
  return min(candidates, key=error.get) if candidates else None


def window_errors(data: dict, name: str, ensemble: bool = False) -> np.ndarray:
  """``[windows, H]`` absolute errors of ``name``, 0 where unmeasured: its seeds' mean (``ensemble``: their mean's)."""
  forecasts, actual = data["forecasts"][name], np.nan_to_num(data["actual"])
  errors = np.abs(forecasts.mean(axis=0) - actual) if ensemble else np.abs(forecasts - actual[None]).mean(axis=0)
  return np.where(data["mask"], errors, 0.0)


def paired_comparison(data: dict, metrics: dict, first: str, second: str) -> list[dict]:
  """Per horizon: both MAEs, their block-bootstrap difference (as seed means and as ensembles) and Welch's t text."""
  compared, ensembles = (stats.block_bootstrap_difference(
      window_errors(data, first, ensemble), window_errors(data, second, ensemble), data["mask"],
      block_length=BOOTSTRAP_BLOCK_HOURS, resamples=BOOTSTRAP_RESAMPLES, seeds=seeds)
      for ensemble, seeds in ((False, RESAMPLING_SEEDS), (True, 1)))
  rows = []
  for index, horizon in enumerate(data["horizons"]):
    a, b = metrics[first]["mae"][:, index], metrics[second]["mae"][:, index]
    low, high, lows, highs = (compared[key][..., index] for key in ("low", "high", "lows", "highs"))
    better = [first if high < 0 else second if low > 0 else None for low, high in zip(lows, highs)]  # per seed
    rows.append({"horizon": horizon, "first": a.mean(), "second": b.mean(),
                 "difference": compared["difference"][index], "low": low, "high": high,
                 "seed_spread": max(np.abs(lows - low).max(), np.abs(highs - high).max()),
                 "better": better[0] if len(set(better)) == 1 else None, "better_by_seed": better,
                 "ensemble": [ensembles[key][index] for key in ("difference", "low", "high")],
                 "welch": stats.welch_text(a, b, brief=True) if len(a) > 1 and len(b) > 1 else "-"})
  return rows


def equal_input_pairs(store: record_store.RecordStore, rows: list[str]) -> list[tuple[str, str]]:
  """(first, second) pairs of ``rows`` on the same window: all inputs vs pm2.5 alone, then Transformer vs recurrent."""
  values = {row: store[row]["values"] for row in rows}
  alone = {row: reads_pm25_only(values[row]) for row in rows}
  pairs = [(row, other) for row in rows for other in rows if values[row]["hours"] == values[other]["hours"]]
  return ([(row, other) for row, other in pairs if values[row]["model"] == values[other]["model"]
           and not alone[row] and alone[other]]
          + [(row, other) for row, other in pairs if values[row]["model"] in TRANSFORMERS
             and values[other]["model"] in RECURRENT and alone[row] == alone[other]])


def better_at(rows: list[dict], name: str, none: str = "no horizon") -> str:
  """The horizons of ``paired_comparison``'s ``rows`` where ``name`` is better beyond the interval, in words."""
  return ", ".join(f"{row['horizon']} h" for row in rows if row["better"] == name) or none


def largest_month(data: dict, first: str, second: str, horizon: int) -> tuple[str, float, float]:
  """The month of origins of the largest |MAE(first) - MAE(second)| at ``horizon``, that difference and the rest's."""
  index = list(data["horizons"]).index(horizon)
  differences = (window_errors(data, first) - window_errors(data, second))[:, index]
  measured = data["mask"][:, index]
  months = data["origin_time"].astype("datetime64[M]")

  def difference(rows):  # NaN where no target is measured
    return differences[rows].sum() / measured[rows].sum() if measured[rows].any() else float("nan")
  month = max((month for month in np.unique(months) if measured[months == month].any()),
              key=lambda month: abs(difference(months == month)))
  return str(month), difference(months == month), difference(months != month)
