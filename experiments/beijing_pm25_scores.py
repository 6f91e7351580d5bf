"""Beijing PM2.5 runs scored for the results page: every run a record (its validation MAE, the command of its
settings), each model's input window chosen on validation, the kept runs' seeds (and the persistence baselines)
forecasting the common 2014 test windows into one file, the errors read back from it, and the paired comparison of
two models.
"""
from __future__ import annotations

import os
import re

import numpy as np

from experiments import launching, record_store, stats
from experiments.beijing_pm25 import RECURRENT, TRANSFORMERS, WINDOW_CANDIDATES, get_config
from transformer import load, read_run_config
from transformer.errors import UserError
from transformer.tasks.metrics import forecast_metrics
from transformer.train.run_directory import CHECKPOINTS, RunDirectory

MODELS = RECURRENT + TRANSFORMERS + ("dlinear",)
BASELINES = ("persistence", "daily_persistence")
RUN_NAME = re.compile(r"^(?P<variant>[a-z_]+)-(?P<hours>\d+)h$")
FORECASTS_FILE = "forecasts_2014.npz"
# Forecasts up to 96 h ahead from origins a few days apart share target hours and weather episodes: resample
# whole weeks of origins, not hours, so that the interval reflects that dependence.
BOOTSTRAP_BLOCK_HOURS = 168
BOOTSTRAP_RESAMPLES = 10_000  # enough that an interval's first decimal does not move with the resampling seed
# Where data lives and how a run printed: not settings, left out of the recorded command.


def run_command(variant: str, hours: int, config=None) -> str:
  """The command that trains ``variant`` on ``hours`` of input: the variant's, plus the overrides its run's
  config has (the input window among them, where it is not the variant's own)."""
  parts = ["python", "launch.py", f"--config=experiments/beijing_pm25.py:{variant}", "--workdir=WORKDIR"]
  reference = get_config(variant)
  if config is not None:
    parts += launching.config_overrides(reference, config)
  elif hours != reference.model.input_length:
    parts.append(f"--config.model.input_length={hours}")
  return "TRANSFORMER_DATA_DIR=../shared/data " + launching.command_line(parts)


def find_runs(workdir_root: str) -> dict[str, dict[int, str]]:
  """``variant -> {input hours: workdir}`` of the runs under ``workdir_root`` that have a checkpoint."""
  runs = {}
  for name in sorted(os.listdir(workdir_root)) if os.path.isdir(workdir_root) else []:
    match = RUN_NAME.match(name)
    checkpoints = RunDirectory(os.path.join(workdir_root, name)).path(CHECKPOINTS)
    if match and match["variant"] in MODELS and os.path.isdir(checkpoints) and os.listdir(checkpoints):
      runs.setdefault(match["variant"], {})[int(match["hours"])] = os.path.join(workdir_root, name)
  return runs


def best_validation(workdir: str) -> tuple[int, dict]:
  """The run's last step, and what its metrics give its row: the step and validation MAE of the best checkpoint
  (the lowest), the run's wall time and median steps/s."""
  metrics = RunDirectory(workdir).metrics()
  best = metrics.best("eval/mae", mode="min")
  last_step, wall_seconds = metrics.values("wall_seconds")[-1]
  return last_step, {"best_step": best["step"], "validation_mae": best["eval/mae"], "wall_seconds": wall_seconds,
                     "steps_per_second": metrics.median_rate()}


def record_runs(store: record_store.RecordStore, folder: str, workdir_root: str) -> None:
  """Record every run under ``workdir_root``; score each model's kept run found there and the baselines on the
  common test origins into ``folder/forecasts_2014.npz`` (a model whose kept run is elsewhere has no test rows)."""
  runs = find_runs(workdir_root)
  if not runs:
    commands = [f"- {name}: `{run_command(name, hours)}`" for name in MODELS for hours in WINDOW_CANDIDATES[name]]
    raise UserError(f"no run with checkpoints under {workdir_root} (named <variant>-<hours>h); train "
                    f"first, e.g.:\n" + "\n".join(commands))
  validation = {(name, hours): best_validation(workdir) for name, tried in runs.items()
                for hours, workdir in tried.items()}
  store.check({f"{name}-{hours}h": steps for (name, hours), (steps, _) in validation.items()})
  for (name, hours), (steps, values) in validation.items():
    config = read_run_config(runs[name][hours])
    store.add(f"{name}-{hours}h", steps=steps, command=run_command(name, hours, config),
              machine=record_store.machine_description(),
              values={"model": name, "hours": hours, "seeds": config.num_seeds, "eval_every": config.eval_every,
                      "num_train_steps": config.num_train_steps, "workdir_root": workdir_root, **values})
  kept = sorted(kept_windows(store).items(), key=lambda item: -item[1])  # the longest input window first
  workdirs = {name: runs[name][hours] for name, hours in kept if hours in runs.get(name, {})}
  if workdirs:  # else every model's kept run is an earlier one: its forecasts stay
    write_forecasts(workdirs, os.path.join(folder, FORECASTS_FILE))


def validation_maes(store: record_store.RecordStore) -> dict[str, dict[int, float]]:
  """Model -> {input hours: validation MAE (best checkpoint, all horizons)} of the store's runs."""
  tried = {}
  for record in store.records.values():
    tried.setdefault(record["values"]["model"], {})[record["values"]["hours"]] = record["values"]["validation_mae"]
  return tried


def kept_windows(store: record_store.RecordStore) -> dict[str, int]:
  """Model -> the input hours of its run with the lowest validation MAE, over the store's runs."""
  return {name: min(by_hours, key=by_hours.get) for name, by_hours in validation_maes(store).items()}


def write_forecasts(workdirs: dict[str, str], path: str) -> None:
  """Every seed of the kept runs (``model -> workdir``, the longest input window first: its test windows, the
  fewest, are the ones every run has) and the persistence baselines forecast the test windows, written to ``path``
  in tenths of µg/m³ (int16: the rounding moves an MAE by < 0.05): ``origin_time`` (hours since 1970),
  ``horizons``, ``actual`` (-1 where unmeasured) and one ``[seeds, windows, H]`` array per model."""
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
                        task.series.baselines(task.windows("test")).items()})
    rows = np.searchsorted(split["origin_time"], common["origin_time"])
    if not np.array_equal(split["origin_time"][rows], common["origin_time"]):
      raise ValueError(f"write_forecasts: the run of {name} lacks some of the common test origins")
    forecasts[name] = np.stack(seeds)[:, rows]
  arrays = {"origin_time": common["origin_time"].astype("datetime64[h]").astype(np.int64),
            "horizons": np.asarray(task.horizons),
            "actual": np.where(common["mask"], np.round(np.nan_to_num(common["actual"]) * 10), -1)}
  arrays.update({name: np.round(np.nan_to_num(values, nan=-0.1) * 10) for name, values in forecasts.items()})
  for name, values in list(arrays.items())[2:]:
    if np.abs(values).max() >= np.iinfo(np.int16).max:
      raise ValueError(f"write_forecasts: {name} holds a value beyond int16 tenths of µg/m³")
    arrays[name] = values.astype(np.int16)
  np.savez_compressed(path, **arrays)


def load_forecasts(path: str) -> dict:
  """``write_forecasts`` read back, in µg/m³: ``horizons``, ``origin_time`` [windows], ``target_time``, ``actual``
  (NaN where unmeasured), ``mask`` [windows, H] and ``forecasts``: model -> [seeds, windows, H] (baselines
  first; their -0.1, before the split's first measurement, NaN)."""
  saved = np.load(path)
  horizons, mask = saved["horizons"].tolist(), saved["actual"] >= 0
  origins = saved["origin_time"].astype("datetime64[h]")
  names = [name for name in BASELINES if name in saved] + sorted(
      set(saved.files) - {"origin_time", "horizons", "actual", *BASELINES})
  return {"horizons": horizons, "origin_time": origins, "mask": mask,
          "target_time": origins[:, None] + np.asarray(horizons).astype("timedelta64[h]"),
          "actual": np.where(mask, saved["actual"] / 10, np.nan),
          "forecasts": {name: np.where((saved[name] == -1) & (name in BASELINES), np.nan, saved[name] / 10)
                        for name in names}}


def test_metrics(data: dict) -> dict:
  """Model -> ``{"mae", "rmse": [seeds, H]}`` in ug/m3 over the measured targets (a baseline's NaN forecast,
  before the split's first measurement, unscored)."""
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
  """``[windows, H]`` absolute errors of model ``name``, 0 where unmeasured: per window the mean over seeds of each
  seed's error (its mean over the measured is the seeds' mean MAE), or with ``ensemble`` the error of the seeds'
  mean forecast (the MAE of the seeds as one model)."""
  forecasts, actual = data["forecasts"][name], np.nan_to_num(data["actual"])
  errors = np.abs(forecasts.mean(axis=0) - actual) if ensemble else np.abs(forecasts - actual[None]).mean(axis=0)
  return np.where(data["mask"], errors, 0.0)


def paired_comparison(data: dict, metrics: dict, first: str, second: str) -> list[dict]:
  """Per horizon: both MAEs (seed means), the block-bootstrap difference of the seeds' mean MAEs and of the seed
  ensembles' MAEs (seeds' forecasts averaged first), and Welch's t over seeds in words ("-" with one seed)."""
  def bootstrap(ensemble):
    return stats.block_bootstrap_difference(
        window_errors(data, first, ensemble), window_errors(data, second, ensemble), data["mask"],
        block_length=BOOTSTRAP_BLOCK_HOURS, resamples=BOOTSTRAP_RESAMPLES)

  compared, ensembles = bootstrap(False), bootstrap(True)
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
