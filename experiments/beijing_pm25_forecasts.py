"""The Beijing PM2.5 page's committed forecasts, written from the runs and read back: the test forecasts of the kept
and equal-input runs (``FORECASTS_FILE``, ``EQUAL_INPUTS_FILE``) and every recorded run's validation forecasts
(``VALIDATION_FILE``), each seed's from its best checkpoint, in tenths of µg/m³."""
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
VALIDATION_FILE = "forecasts_validation.npz"  # every recorded run's validation forecasts, each on its own windows
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


def write_validation_forecasts(workdirs: dict[str, str], path: str, previous: str) -> None:
  """Writes ``load_forecasts``' file of every seed's validation forecasts of the runs ``workdirs`` (row -> workdir)
  and of the other rows of the file ``previous`` (a row recorded again replaces its entry), on the union of their
  windows: a row's forecasts are NaN (-1) on the windows it lacks (a longer input window's start later), the
  actual values and their mask are stored once. A run's windows are every window of its validation split, those
  its training's ``eval/mae`` averaged (on the device, in float32) to choose the best checkpoint."""
  sources = []  # load_forecasts' layout, each on its own windows
  if os.path.exists(previous):
    saved = load_forecasts(previous)
    sources.append({**saved, "forecasts": {row: forecasts for row, forecasts in saved["forecasts"].items()
                                           if row not in workdirs}})
  for row, workdir in workdirs.items():
    seeds, split, task = predict_seeds(workdir, "validation")
    sources.append({"horizons": task.horizons, "origin_time": split["origin_time"], "actual": split["actual"],
                    "mask": split["mask"], "forecasts": {row: seeds}})
  origins = np.unique(np.concatenate([source["origin_time"] for source in sources]))
  shape = (len(origins), len(sources[-1]["horizons"]))  # [windows, H]
  data = {"horizons": sources[-1]["horizons"], "origin_time": origins, "actual": np.full(shape, np.nan),
          "mask": np.zeros(shape, bool), "forecasts": {}}
  for source in sources:
    if list(source["horizons"]) != list(data["horizons"]):
      raise ValueError(f"write_validation_forecasts: the runs and {previous} forecast other horizons "
                       f"({source['horizons']}, {data['horizons']}); write {path} from runs of one experiment")
    rows = np.searchsorted(origins, source["origin_time"])
    data["actual"][rows], data["mask"][rows] = source["actual"], source["mask"]
    for row, forecasts in source["forecasts"].items():
      data["forecasts"][row] = np.full((len(forecasts), *shape), np.nan)
      data["forecasts"][row][:, rows] = forecasts
  save_forecasts(path, data)


def save_forecasts(path: str, data: dict) -> None:
  """Writes ``data`` (``load_forecasts``' layout; ``horizons``, ``actual`` and ``mask`` optional) in tenths of µg/m³:
  ``actual`` -1 where unmeasured, a forecast -1 where NaN (none: forecasts are never below 0); int16, int32 past
  3276.7 µg/m³ (int16 would wrap). A failure midway keeps the old file whole."""
  arrays = {"origin_time": np.asarray(data["origin_time"]).astype("datetime64[h]").astype(np.int64)}
  if "horizons" in data:
    arrays["horizons"] = np.asarray(data["horizons"])
  if "actual" in data:
    arrays["actual"] = np.where(data["mask"], np.round(np.nan_to_num(data["actual"]) * 10), -1)
  arrays.update({name: np.round(np.nan_to_num(values, nan=-0.1) * 10) for name, values in data["forecasts"].items()})
  for name in arrays.keys() - {"origin_time", "horizons"}:
    fits = np.abs(arrays[name]).max() < np.iinfo(np.int16).max
    arrays[name] = arrays[name].astype(np.int16 if fits else np.int32)
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
