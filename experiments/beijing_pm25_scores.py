"""The Beijing PM2.5 runs' records, kept input windows, test forecasts and paired comparisons for the results page."""
from __future__ import annotations

import os
import re

import numpy as np

from experiments import launching, record_store, stats
from experiments.beijing_pm25 import RECURRENT, TRANSFORMERS, WINDOW_CANDIDATES, get_config
from transformer import load, read_run_config
from transformer.errors import UserError
from transformer.nn.forecasters import CHANNEL_INDEPENDENT
from transformer.tasks.metrics import forecast_metrics
from transformer.train.run_directory import CHECKPOINTS, RunDirectory

MODELS = RECURRENT + TRANSFORMERS + ("dlinear",)
BASELINES = ("persistence", "daily_persistence")
# A row's name; ``-pm25_only`` or ``-all_inputs``: a run on other inputs than its variant's published ones.
RUN_NAME = re.compile(r"^(?P<variant>[a-z_]+)-(?P<hours>\d+)h(?:-(?P<inputs>pm25_only|all_inputs))?$")
COMMITTED_DIR = os.path.join(record_store.COMMITTED, "beijing_pm25")
FORECASTS_FILE = "forecasts_2014.npz"
EQUAL_INPUTS_FILE = "forecasts_2014_equal_inputs.npz"  # the equal-input comparison's runs, FORECASTS_FILE's windows
BOOTSTRAP_BLOCK_HOURS = 168  # nearby origins share target hours and weather episodes: resample whole weeks of them
BOOTSTRAP_RESAMPLES = 10_000  # enough that an interval's first decimal does not move with the resampling seed


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
  """Records the runs under ``workdir_root``; writes the test forecasts of the kept and equal-input ones there."""
  runs = find_runs(workdir_root)
  if not runs:
    commands = [f"- {name}: `{run_command(name, hours)}`" for name in MODELS for hours in WINDOW_CANDIDATES[name]]
    raise UserError(f"no run with checkpoints under {workdir_root} (named <variant>-<hours>h); train "
                    f"first, e.g.:\n" + "\n".join(commands))
  logs = {row: RunDirectory(workdir).metrics() for row, workdir in runs.items()}
  last = {row: log.values("wall_seconds")[-1] for row, log in logs.items()}  # (the last step, the wall time then)
  store.check({row: step for row, (step, _) in last.items()})
  for row, log in logs.items():
    config, best = read_run_config(runs[row]), log.best("eval/mae", mode="min")
    values = {**run_values(row, runs[row], config), "seeds": config.num_seeds, "eval_every": config.eval_every,
              "num_train_steps": config.num_train_steps, "workdir_root": workdir_root, "best_step": best["step"],
              "validation_mae": best["eval/mae"], "wall_seconds": last[row][1], "steps_per_second": log.median_rate()}
    store.add(row, steps=last[row][0], command=run_command(values["model"], values["hours"], config),
              machine=record_store.machine_description(), values=values)
  kept = sorted(kept_windows(store).items(), key=lambda item: -item[1])  # the longest input window first
  workdirs = {name: runs[f"{name}-{hours}h"] for name, hours in kept if f"{name}-{hours}h" in runs}
  if workdirs:  # else every model's kept run is an earlier one: its forecasts stay
    write_forecasts(workdirs, os.path.join(folder, FORECASTS_FILE))
  compared = {row: runs[row] for row, name in equal_input_runs(store).items() if row == name and row in runs}
  if compared:
    origins = load_forecasts(forecasts_path(FORECASTS_FILE, folder))["origin_time"]
    write_forecasts(compared, os.path.join(folder, EQUAL_INPUTS_FILE), origins)


def validation_maes(store: record_store.RecordStore) -> dict[str, dict[int, float]]:
  """Model -> {input hours: validation MAE} of the store's runs on published inputs (the others are never kept)."""
  tried = {}
  for values in (record["values"] for record in store.records.values() if "inputs" not in record["values"]):
    tried.setdefault(values["model"], {})[values["hours"]] = values["validation_mae"]
  return tried


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


def write_forecasts(workdirs: dict[str, str], path: str, origins: np.ndarray | None = None) -> None:
  """Writes ``load_forecasts``' file (tenths of µg/m³): every seed's forecasts of the first run's test windows (the
  longest input window's: every run has them) with the baselines', or of ``origins`` without baselines."""
  forecasts, common = {}, None
  for name, workdir in workdirs.items():
    seeds = []  # every seed of the run, restored from its best checkpoint
    for replica in range(read_run_config(workdir).num_seeds):
      model = load(workdir, replica=replica)
      split = model.task.predict_split(model.model_config, model.params, "test")
      seeds.append(split["forecast"])
    if common is None:
      common, task = split, model.task
      forecasts.update({baseline: forecast[None] for baseline, forecast in
                        task.series.baselines(task.windows("test")).items() if origins is None})
    wanted = common["origin_time"] if origins is None else origins.astype(split["origin_time"].dtype)
    rows = np.minimum(np.searchsorted(split["origin_time"], wanted), len(split["origin_time"]) - 1)
    if not np.array_equal(split["origin_time"][rows], wanted):
      raise ValueError(f"write_forecasts: the run of {name} lacks some of the common test origins")
    forecasts[name] = np.stack(seeds)[:, rows]
  arrays = {"origin_time": wanted.astype("datetime64[h]").astype(np.int64)}
  if origins is None:
    arrays.update(horizons=np.asarray(task.horizons),
                  actual=np.where(common["mask"], np.round(np.nan_to_num(common["actual"]) * 10), -1))
  arrays.update({name: np.round(np.nan_to_num(values, nan=-0.1) * 10) for name, values in forecasts.items()})
  for name in arrays.keys() - {"origin_time", "horizons"}:  # int32 past 3276.7 µg/m³ (int16 would wrap)
    fits = np.abs(arrays[name]).max() < np.iinfo(np.int16).max
    arrays[name] = arrays[name].astype(np.int16 if fits else np.int32)
  np.savez_compressed(path, **arrays)


def forecasts_path(name: str, folder: str, committed: str = COMMITTED_DIR) -> str:
  """``folder/name`` where it exists, else the committed page's (a new folder starts from the committed records)."""
  path = os.path.join(folder, name)
  return path if os.path.exists(path) else os.path.join(committed, name)


def load_forecasts(path: str) -> dict:
  """``write_forecasts``' file in µg/m³: ``horizons``, ``origin_time`` [windows], ``target_time``, ``actual`` (NaN
  where unmeasured), ``mask`` [windows, H], ``forecasts``: model -> [seeds, windows, H] (baselines first)."""
  saved = np.load(path)
  horizons, mask = saved["horizons"].tolist(), saved["actual"] >= 0
  origins = saved["origin_time"].astype("datetime64[h]")
  names = [name for name in BASELINES if name in saved] + sorted(
      set(saved.files) - {"origin_time", "horizons", "actual", *BASELINES})
  return {"horizons": horizons, "origin_time": origins, "mask": mask,
          "target_time": origins[:, None] + np.asarray(horizons).astype("timedelta64[h]"),
          "actual": np.where(mask, saved["actual"] / 10, np.nan),
          "forecasts": {name: np.where((saved[name] == -1) & (name in BASELINES), np.nan, saved[name] / 10)
                        for name in names}}  # a baseline's -0.1, before the split's first measurement: NaN


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
      block_length=BOOTSTRAP_BLOCK_HOURS, resamples=BOOTSTRAP_RESAMPLES) for ensemble in (False, True))
  rows = []
  for index, horizon in enumerate(data["horizons"]):
    a, b = metrics[first]["mae"][:, index], metrics[second]["mae"][:, index]
    low, high = compared["low"][index], compared["high"][index]
    rows.append({"horizon": horizon, "first": a.mean(), "second": b.mean(),
                 "difference": compared["difference"][index], "low": low, "high": high,
                 "better": first if high < 0 else second if low > 0 else None,
                 "ensemble": [ensembles[key][index] for key in ("difference", "low", "high")],
                 "welch": stats.welch_text(a, b, brief=True) if len(a) > 1 and len(b) > 1 else "-"})
  return rows


def equal_inputs_data(data: dict, path: str, rows: dict[str, str]) -> dict:
  """``data`` with ``forecasts`` row -> [seeds, windows, H] of those ``rows`` in it or in the ``EQUAL_INPUTS_FILE``."""
  saved = np.load(path) if os.path.exists(path) else {}
  if len(saved) and not np.array_equal(saved["origin_time"], data["origin_time"].astype(np.int64)):
    raise ValueError(f"{path} holds other test windows than {FORECASTS_FILE}; write both from the same runs")
  forecasts = {row: data["forecasts"][name] if name != row else saved[row] / 10 for row, name in rows.items()
               if (name != row and name in data["forecasts"]) or (name == row and row in saved)}
  return {**data, "forecasts": forecasts}


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
