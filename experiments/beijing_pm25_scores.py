"""Beijing PM2.5 runs scored for the results page: every run a record (its validation MAE, the command of its
settings), each model's input window chosen on validation, the kept runs' seeds (and the persistence baselines)
forecasting the common 2014 test windows into one file, the errors read back from it, and the paired comparison of
two models. Runs on other inputs than their variant's published ones (``config.model.input_features``: a row name
ending ``-pm25_only`` or ``-all_inputs``) are never kept: with the published-input runs of the same windows they
forecast the same test windows into a second file, for the comparison of families on equal inputs.
"""
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
RUN_NAME = re.compile(r"^(?P<variant>[a-z_]+)-(?P<hours>\d+)h(?:-(?P<inputs>pm25_only|all_inputs))?$")
FORECASTS_FILE = "forecasts_2014.npz"
EQUAL_INPUTS_FILE = "forecasts_2014_equal_inputs.npz"  # the equal-input comparison's runs, FORECASTS_FILE's windows
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


def find_runs(workdir_root: str) -> dict[str, str]:
  """``row name -> workdir`` of the runs under ``workdir_root`` that have a checkpoint, named
  ``<variant>-<hours>h``, with ``-pm25_only`` or ``-all_inputs`` for a run on other inputs than its variant's."""
  runs = {}
  for name in sorted(os.listdir(workdir_root)) if os.path.isdir(workdir_root) else []:
    match = RUN_NAME.match(name)
    checkpoints = RunDirectory(os.path.join(workdir_root, name)).path(CHECKPOINTS)
    if match and match["variant"] in MODELS and os.path.isdir(checkpoints) and os.listdir(checkpoints):
      runs[name] = os.path.join(workdir_root, name)
  return runs


def inputs_name(variant: str, input_features: str) -> str:
  """The row name's suffix for a run of ``variant`` on ``input_features``: "" for its variant's published inputs
  (pm2.5 alone for PatchTST and DLinear, all 18 features for the others), else ``pm25_only`` or ``all_inputs``."""
  target_only = input_features == "target" or (input_features == "auto" and variant in CHANNEL_INDEPENDENT)
  return "" if target_only == (variant in CHANNEL_INDEPENDENT) else ("pm25_only" if target_only else "all_inputs")


def reads_pm25_only(values: dict) -> bool:
  """Whether a record's run read pm2.5 alone (its ``inputs``, else its variant's published inputs)."""
  return values.get("inputs", "pm25_only" if values["model"] in CHANNEL_INDEPENDENT else "") == "pm25_only"


def run_values(row: str, workdir: str, config) -> dict:
  """A row's model, input hours and (where not its variant's published ones) inputs; a ``UserError`` when the
  workdir's name does not say the inputs its run read."""
  match = RUN_NAME.match(row)
  variant, inputs = match["variant"], inputs_name(match["variant"], config.model.input_features)
  if inputs != (match["inputs"] or ""):
    expected = f"{variant}-{match['hours']}h" + (f"-{inputs}" if inputs else "")
    raise UserError(f"{workdir}: its run read config.model.input_features={config.model.input_features!r}, "
                    f"which its name does not say; rename the workdir {expected} (a row name says its inputs)")
  return {"model": variant, "hours": int(match["hours"]), **({"inputs": inputs} if inputs else {})}


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
  common test origins into ``folder/forecasts_2014.npz`` (a model whose kept run is elsewhere has no test rows),
  and the equal-input comparison's runs found there on the same origins into ``folder/EQUAL_INPUTS_FILE``."""
  runs = find_runs(workdir_root)
  if not runs:
    commands = [f"- {name}: `{run_command(name, hours)}`" for name in MODELS for hours in WINDOW_CANDIDATES[name]]
    raise UserError(f"no run with checkpoints under {workdir_root} (named <variant>-<hours>h); train "
                    f"first, e.g.:\n" + "\n".join(commands))
  validation = {row: best_validation(workdir) for row, workdir in runs.items()}
  store.check({row: steps for row, (steps, _) in validation.items()})
  for row, (steps, values) in validation.items():
    config = read_run_config(runs[row])
    store.add(row, steps=steps, command=run_command(RUN_NAME.match(row)["variant"], config.model.input_length,
                                                    config),
              machine=record_store.machine_description(),
              values={**run_values(row, runs[row], config), "seeds": config.num_seeds,
                      "eval_every": config.eval_every, "num_train_steps": config.num_train_steps,
                      "workdir_root": workdir_root, **values})
  kept = sorted(kept_windows(store).items(), key=lambda item: -item[1])  # the longest input window first
  workdirs = {name: runs[f"{name}-{hours}h"] for name, hours in kept if f"{name}-{hours}h" in runs}
  if workdirs:  # else every model's kept run is an earlier one: its forecasts stay
    write_forecasts(workdirs, os.path.join(folder, FORECASTS_FILE))
  compared = {row: runs[row] for row, name in equal_input_runs(store).items() if row == name and row in runs}
  if compared:
    path = os.path.join(folder, FORECASTS_FILE)
    origins = load_forecasts(path if os.path.exists(path) else os.path.join(
        record_store.COMMITTED, "beijing_pm25", FORECASTS_FILE))["origin_time"]
    write_forecasts(compared, os.path.join(folder, EQUAL_INPUTS_FILE), origins)


def validation_maes(store: record_store.RecordStore) -> dict[str, dict[int, float]]:
  """Model -> {input hours: validation MAE (best checkpoint, all horizons)} of the store's runs on their
  variant's published inputs."""
  tried = {}
  for record in store.records.values():
    if "inputs" in record["values"]:  # the equal-input comparison's: never a candidate
      continue
    tried.setdefault(record["values"]["model"], {})[record["values"]["hours"]] = record["values"]["validation_mae"]
  return tried


def kept_windows(store: record_store.RecordStore) -> dict[str, int]:
  """Model -> the input hours of its run with the lowest validation MAE, over the store's runs."""
  return {name: min(by_hours, key=by_hours.get) for name, by_hours in validation_maes(store).items()}


def equal_input_runs(store: record_store.RecordStore) -> dict[str, str]:
  """Row -> the name of its test forecasts, for the comparison on equal inputs: each run on other inputs than its
  variant's published ones (its own row name: ``EQUAL_INPUTS_FILE``) and the run of the same model and window on
  the published ones (the model's name, in ``FORECASTS_FILE``, where that is the kept window, else its row name);
  by model (``MODELS``' order), window, then inputs."""
  kept, rows = kept_windows(store), {}
  for row in store:
    values = store[row]["values"]
    if "inputs" in values:
      published = f"{values['model']}-{values['hours']}h"
      rows[published] = values["model"] if kept.get(values["model"]) == values["hours"] else published
      rows[row] = row
  order = {name: index for index, name in enumerate(MODELS)}
  return dict(sorted(rows.items(), key=lambda item: (order[RUN_NAME.match(item[0])["variant"]],
                                                      int(RUN_NAME.match(item[0])["hours"]), item[0])))


def write_forecasts(workdirs: dict[str, str], path: str, origins: np.ndarray | None = None) -> None:
  """Every seed of the kept runs (``model -> workdir``, the longest input window first: its test windows, the
  fewest, are the ones every run has) and the persistence baselines forecast the test windows, written to ``path``
  in tenths of µg/m³ (int16, else int32; the rounding moves an MAE by < 0.05): ``origin_time`` (hours since 1970),
  ``horizons``, ``actual`` (-1 where unmeasured) and one ``[seeds, windows, H]`` array per model. Given
  ``origins`` (``FORECASTS_FILE``'s), the runs forecast those windows, without baselines (``EQUAL_INPUTS_FILE``)."""
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
  for name, values in forecasts.items():
    arrays[name] = np.round(np.nan_to_num(values, nan=-0.1) * 10)
  for name in ["actual", *forecasts]:  # int32 for a model whose forecasts pass 3276.7 µg/m³ (int16 would wrap)
    if name in arrays:
      fits = np.abs(arrays[name]).max() < np.iinfo(np.int16).max
      arrays[name] = arrays[name].astype(np.int16 if fits else np.int32)
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


def equal_inputs_data(data: dict, paths: list[str], rows: dict[str, str]) -> dict:
  """``data`` (``load_forecasts``) whose ``forecasts`` are row -> [seeds, windows, H] of the ``rows`` of
  ``equal_input_runs`` that have forecasts: in ``data`` under the model's name, else in the first of ``paths``
  that exists (an ``EQUAL_INPUTS_FILE``, which must hold ``data``'s windows)."""
  path = next((path for path in paths if os.path.exists(path)), None)
  saved = np.load(path) if path else {}
  if len(saved) and not np.array_equal(saved["origin_time"], data["origin_time"].astype(np.int64)):
    raise ValueError(f"{path} holds other test windows than {FORECASTS_FILE}; write both from the same runs")
  forecasts = {row: data["forecasts"][name] if name != row else saved[row] / 10 for row, name in rows.items()
               if (name != row and name in data["forecasts"]) or (name == row and row in saved)}
  return {**data, "forecasts": forecasts}


def equal_input_pairs(store: record_store.RecordStore, rows: list[str]) -> list[tuple[str, str]]:
  """The paired comparisons on equal inputs among ``rows``, (first, second): each run on all inputs against the
  same model and window on pm2.5 alone, then each Transformer-family run against each recurrent one of the same
  window and inputs."""
  def values(row):
    return store[row]["values"]

  weather = [(row, other) for row in rows for other in rows if not reads_pm25_only(values(row))
             and reads_pm25_only(values(other)) and values(row)["model"] == values(other)["model"]
             and values(row)["hours"] == values(other)["hours"]]
  families = [(row, other) for row in rows for other in rows if values(row)["model"] in TRANSFORMERS
              and values(other)["model"] in RECURRENT and values(row)["hours"] == values(other)["hours"]
              and reads_pm25_only(values(row)) == reads_pm25_only(values(other))]
  return weather + families


def better_at(rows: list[dict], name: str) -> str:
  """The horizons of ``paired_comparison``'s ``rows`` where ``name`` is better beyond the interval, in words."""
  return ", ".join(f"{row['horizon']} h" for row in rows if row["better"] == name) or "no horizon"


def largest_month(data: dict, first: str, second: str, horizon: int) -> tuple[str, float, float]:
  """The month of test origins where MAE(first) - MAE(second) at ``horizon`` hours is largest in size, that
  difference (seed means) and the difference over the other months' windows."""
  index = list(data["horizons"]).index(horizon)
  differences = (window_errors(data, first) - window_errors(data, second))[:, index]
  measured = data["mask"][:, index]
  months = data["origin_time"].astype("datetime64[M]")

  def difference(rows):  # NaN where no target is measured
    return differences[rows].sum() / measured[rows].sum() if measured[rows].any() else float("nan")
  month = max((month for month in np.unique(months) if measured[months == month].any()),
              key=lambda month: abs(difference(months == month)))
  return str(month), difference(months == month), difference(months != month)
