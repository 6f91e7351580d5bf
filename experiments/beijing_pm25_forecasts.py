"""The Beijing PM2.5 page's committed outputs, written from the runs and read back: the test forecasts of the kept and
equal-input runs (``FORECASTS_FILE``, ``EQUAL_INPUTS_FILE``) and every recorded run's absolute validation errors per
window (``VALIDATION_FILE``: every seed's forecasts of every horizon are too large to commit), each seed's from its
best checkpoint, in tenths of µg/m³."""
from __future__ import annotations

import os

import numpy as np

from experiments import record_store
from transformer import load, read_run_config
from transformer.data.files import replacing

COMMITTED_DIR = os.path.join(record_store.COMMITTED, "beijing_pm25")
BASELINES = ("persistence", "daily_persistence")
FORECASTS_FILE = "forecasts_2014.npz"
EQUAL_INPUTS_FILE = "forecasts_2014_equal_inputs.npz"  # the equal-input comparison's runs, FORECASTS_FILE's windows
VALIDATION_FILE = "errors_validation.npz"  # every recorded run's absolute validation errors, each on its own windows
SHARED = ("origin_time", "horizons", "actual")  # a file's arrays that are no run's forecasts


def predict_seeds(workdir: str, split: str) -> tuple[np.ndarray, dict, object]:
  """Every seed of the run in ``workdir``, restored from its best checkpoint, on every window of ``split``: the
  forecasts [seeds, windows, H] in µg/m³, the last seed's ``predict_split`` (``actual``, ``mask``, ``origin_time``)
  and its task."""
  seeds = []
  for replica in range(read_run_config(workdir).num_seeds):
    model = load(workdir, replica=replica)
    predicted = model.task.predict_split(model.model_config, model.params, split)
    seeds.append(predicted["forecast"])
  return np.stack(seeds), predicted, model.task


def write_forecasts(workdirs: dict[str, str], path: str, origins: np.ndarray | None = None) -> None:
  """Writes ``load_forecasts``' file: every seed's forecasts of the first run's test windows (the longest input
  window's: every run has them) with the baselines', or of ``origins`` without baselines (nor actual values)."""
  forecasts, common = {}, None
  for name, workdir in workdirs.items():
    seeds, split, task = predict_seeds(workdir, "test")
    if common is None:
      common = split
      forecasts.update({baseline: forecast[None] for baseline, forecast in
                        task.series.baselines(task.windows("test")).items() if origins is None})
    wanted = common["origin_time"] if origins is None else origins.astype(split["origin_time"].dtype)
    rows = np.minimum(np.searchsorted(split["origin_time"], wanted), len(split["origin_time"]) - 1)
    if not np.array_equal(split["origin_time"][rows], wanted):
      raise ValueError(f"write_forecasts: the run of {name} lacks some of the common test origins")
    forecasts[name] = seeds[:, rows]
  data = {"origin_time": wanted, "forecasts": forecasts}
  if origins is None:
    data.update(horizons=task.horizons, actual=common["actual"], mask=common["mask"])
  save_forecasts(path, data)


def write_validation_errors(workdirs: dict[str, str], path: str, previous: str) -> None:
  """Writes ``load_validation_errors``' file of the runs ``workdirs`` (row -> workdir) and of the other rows of the
  file ``previous`` (a row recorded again replaces its entry), on the union of their windows. A run's windows are
  every window of its validation split, those its training's ``eval/mae`` averaged (on the device, in float32) to
  choose the best checkpoint; each seed forecasts them from that checkpoint, and the file keeps per seed and window
  the absolute error summed over the window's measured horizons (the forecasts themselves: ``--mode=predict``)."""
  sources = []  # load_validation_errors' layout, each on its own windows
  if os.path.exists(previous):
    saved = load_validation_errors(previous)
    sources.append({**saved, "errors": {row: errors for row, errors in saved["errors"].items()
                                        if row not in workdirs}})
  for row, workdir in workdirs.items():
    seeds, split, task = predict_seeds(workdir, "validation")
    errors = np.where(split["mask"], np.abs(seeds - np.nan_to_num(split["actual"])), 0.0).sum(-1)
    sources.append({"horizons": task.horizons, "origin_time": split["origin_time"],
                    "measured": split["mask"].sum(-1), "errors": {row: errors}})
  origins = np.unique(np.concatenate([source["origin_time"] for source in sources]))
  data = {"horizons": sources[-1]["horizons"], "origin_time": origins, "measured": np.zeros(len(origins), int),
          "errors": {}}
  for source in sources:
    if list(source["horizons"]) != list(data["horizons"]):
      raise ValueError(f"write_validation_errors: the runs and {previous} forecast other horizons "
                       f"({source['horizons']}, {data['horizons']}); write {path} from runs of one experiment")
    rows = np.searchsorted(origins, source["origin_time"])
    data["measured"][rows] = source["measured"]
    for row, errors in source["errors"].items():
      data["errors"][row] = np.full((len(errors), len(origins)), np.nan)
      data["errors"][row][:, rows] = errors
  arrays = {"origin_time": origins.astype("datetime64[h]").astype(np.int64), "horizons": np.asarray(data["horizons"]),
            "measured": data["measured"].astype(np.int8), **{row: tenths(errors) for row, errors in
                                                               data["errors"].items()}}
  save_tenths(path, arrays)


def load_validation_errors(path: str) -> dict:
  """``write_validation_errors``' file in µg/m³: ``horizons``, ``origin_time`` and ``measured`` (how many of a
  window's targets are measured) [windows], ``errors``: row -> [seeds, windows] each seed's absolute error summed
  over the window's measured targets (NaN: a window the row's run lacks, a longer input window's start later)."""
  with np.load(path) as saved:
    return {"horizons": saved["horizons"].tolist(), "origin_time": saved["origin_time"].astype("datetime64[h]"),
            "measured": saved["measured"].astype(int), "errors": {
                row: np.where(saved[row] == -1, np.nan, saved[row] / 10) for row in saved.files
                if row not in ("horizons", "origin_time", "measured")}}


def tenths(values: np.ndarray) -> np.ndarray:
  """``values`` (µg/m³, never below 0; NaN: none) as integer tenths, -1 where NaN: int16, int32 past 3276.7 µg/m³
  (int16 would wrap)."""
  scaled = np.round(np.nan_to_num(values, nan=-0.1) * 10)
  return scaled.astype(np.int16 if np.abs(scaled).max() < np.iinfo(np.int16).max else np.int32)


def save_forecasts(path: str, data: dict) -> None:
  """Writes ``data`` (``load_forecasts``' layout; ``horizons``, ``actual`` and ``mask`` optional) in tenths of µg/m³:
  ``actual`` -1 where unmeasured, a forecast -1 where NaN (none: forecasts are never below 0); int16, int32 past
  3276.7 µg/m³ (int16 would wrap)."""
  arrays = {"origin_time": np.asarray(data["origin_time"]).astype("datetime64[h]").astype(np.int64)}
  if "horizons" in data:
    arrays["horizons"] = np.asarray(data["horizons"])
  if "actual" in data:
    arrays["actual"] = tenths(np.where(data["mask"], data["actual"], np.nan))
  arrays.update({name: tenths(values) for name, values in data["forecasts"].items()})
  save_tenths(path, arrays)


def save_tenths(path: str, arrays: dict[str, np.ndarray]) -> None:
  """``np.savez_compressed`` of ``arrays`` into ``path``; a failure midway keeps the old file whole."""
  with replacing(path, binary=True) as file:
    np.savez_compressed(file, **arrays)


def forecasts_path(name: str, folder: str, committed: str = COMMITTED_DIR) -> str:
  """``folder/name`` where it exists, else the committed page's (a new folder starts from the committed records)."""
  path = os.path.join(folder, name)
  return path if os.path.exists(path) else os.path.join(committed, name)


def validation_path(store: record_store.RecordStore) -> str:
  """The ``VALIDATION_FILE`` of the store's runs: in its folder, else beside the records it started from."""
  return forecasts_path(VALIDATION_FILE, store.folder, os.path.dirname(store.source))


def load_forecasts(path: str) -> dict:
  """``save_forecasts``' file in µg/m³: ``horizons``, ``origin_time`` [windows], ``target_time``, ``actual`` (NaN
  where unmeasured), ``mask`` [windows, H], ``forecasts``: model or row -> [seeds, windows, H] (baselines first; NaN:
  a baseline before the split's first measurement, a window the row's run lacks)."""
  with np.load(path) as saved:
    horizons, mask = saved["horizons"].tolist(), saved["actual"] >= 0
    origins = saved["origin_time"].astype("datetime64[h]")
    names = [name for name in BASELINES if name in saved] + sorted(set(saved.files) - {*SHARED, *BASELINES})
    return {"horizons": horizons, "origin_time": origins, "mask": mask,
            "target_time": origins[:, None] + np.asarray(horizons).astype("timedelta64[h]"),
            "actual": np.where(mask, saved["actual"] / 10, np.nan),
            "forecasts": {name: np.where(saved[name] == -1, np.nan, saved[name] / 10) for name in names}}


def equal_inputs_data(data: dict, path: str, rows: dict[str, str]) -> dict:
  """``data`` with ``forecasts`` row -> [seeds, windows, H] of those ``rows`` in it or in the ``EQUAL_INPUTS_FILE``."""
  saved = np.load(path) if os.path.exists(path) else {}
  if len(saved) and not np.array_equal(saved["origin_time"], data["origin_time"].astype(np.int64)):
    raise ValueError(f"{path} holds other test windows than {FORECASTS_FILE}; write both from the same runs")
  forecasts = {row: data["forecasts"][name] if name != row else saved[row] / 10 for row, name in rows.items()
               if (name != row and name in data["forecasts"]) or (name == row and row in saved)}
  return {**data, "forecasts": forecasts}
