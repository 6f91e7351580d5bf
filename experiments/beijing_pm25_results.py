"""Score the Beijing PM2.5 runs and the persistence baselines on 2014 (test); write RESULTS.md, plots, forecasts.

    TRANSFORMER_DATA_DIR=../shared/data python -m experiments.beijing_pm25_results --workdir_root=/tmp/pm25
    ... --update_committed      # into experiments/beijing_pm25/ (else --output_dir, default <root>/results)
    python -m experiments.beijing_pm25_results --from_records --update_committed   # no runs, no data needed

Reads the runs ``<workdir_root>/<variant>-<hours>h``, one per input window tried (nothing is trained here), and keeps
per model the window of lowest validation MAE (2013), whose seeds forecast the test windows every run has. Each run's
row is kept in ``records.json`` beside the page and the kept runs' test forecasts in ``forecasts_2014.npz``: every
number and plot of the page comes from these two, all that ``--from_records`` reads (in a new folder: the committed
ones). The page says how the models are compared.
"""
from __future__ import annotations

import os
import re

import numpy as np

from experiments import report
from experiments.beijing_pm25 import RECURRENT, TRANSFORMERS, WINDOW_CANDIDATES, get_config
from transformer import load, read_run_config
from transformer.tasks.forecasting import PREDICTIONS_FILE
from transformer.tasks.metrics import forecast_metrics
from transformer.train.run_directory import CHECKPOINTS, RunDirectory

MODELS = RECURRENT + TRANSFORMERS + ("dlinear",)
# The models of Shi, Jain & Narasimhan (2022), whose ranking the page tests: all read every feature of an hour.
STYLE_2017 = RECURRENT + ("transformer", "transformer_encoder")
BASELINES = ("persistence", "daily_persistence")
COMMITTED_DIR = os.path.join(report.REPO, "experiments", "beijing_pm25")
# Where data lives and how a run printed: not settings, left out of the recorded command.
NOT_SETTINGS = ("task.source_dir", "task.data_dir", "quiet", "tensorboard")
RUN_NAME = re.compile(r"^(?P<variant>[a-z_]+)-(?P<hours>\d+)h$")
EXAMPLE_HORIZONS = (6, 48)  # hours ahead in the forecast figure
EXAMPLE_DAYS = 14
# Forecasts up to 96 h ahead from origins a few days apart share target hours and weather episodes: resample
# whole weeks of origins, not hours, so that the interval reflects that dependence.
BOOTSTRAP_BLOCK_HOURS = 168
BOOTSTRAP_RESAMPLES = 10_000  # enough that an interval's first decimal does not move with the resampling seed
FORECASTS_FILE = "forecasts_2014.npz"


def run_command(variant: str, hours: int, config=None) -> str:
  """The command that trains ``variant`` on ``hours`` of input: the variant's, plus the overrides its run's
  config has (the input window among them, where it is not the variant's own)."""
  parts = ["python", "launch.py", f"--config=experiments/beijing_pm25.py:{variant}", "--workdir=WORKDIR"]
  reference = get_config(variant)
  if config is not None:
    parts += report.config_overrides(reference, config, ignored=NOT_SETTINGS)
  elif hours != reference.model.input_length:
    parts.append(f"--config.model.input_length={hours}")
  return "TRANSFORMER_DATA_DIR=../shared/data " + report.command_line(parts)


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
  ensembles' MAEs (seeds' forecasts averaged first), and Welch's t over seeds."""
  def bootstrap(ensemble):
    return report.block_bootstrap_difference(
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
                 "welch": report.welch_t_test(a, b) if len(a) > 1 and len(b) > 1 else None})
  return rows


def comparison_table(rows: list[dict], first: str, second: str) -> str:
  def welch(row):
    return "-" if row["welch"] is None else "t = {:.2f}, df = {:.1f}, {}".format(
        *row["welch"][:2], report.format_p_value(row["welch"][2]))
  return report.markdown_table(
      ["horizon", f"{first} MAE", f"{second} MAE", "difference", "95% interval (weeks resampled)",
       "beyond the interval", "Welch's t over seeds", "seeds' forecasts averaged first: difference (95% interval)"],
      [[f"{row['horizon']} h", f"{row['first']:.1f}", f"{row['second']:.1f}", f"{row['difference']:+.1f}",
        f"{row['low']:+.1f} to {row['high']:+.1f}", f"**{row['better']} better**" if row["better"] else "no",
        welch(row), "{:+.1f} ({:+.1f} to {:+.1f})".format(*row["ensemble"])] for row in rows])


def verdict(rows: list[dict], first: str, second: str, linear_rows: list[dict] | None) -> str:
  """One sentence on the long horizons (24 h and more), with the numbers behind it."""
  def numbers(rows):
    return "; ".join(f"{row['horizon']} h {row['first']:.1f} vs {row['second']:.1f} ({row['difference']:+.1f}, "
                     f"{row['low']:+.1f} to {row['high']:+.1f})" for row in rows if row["horizon"] >= 24)
  long = [row for row in rows if row["horizon"] >= 24]
  won = [f"{row['horizon']} h" for row in long if row["better"] == first]
  lost = [f"{row['horizon']} h" for row in long if row["better"] == second]
  if len(won) == len(long):
    claim = f"beats the best recurrent model ({second}) at every horizon from 24 h, beyond the uncertainty"
  elif won:
    claim = (f"beats the best recurrent model ({second}) beyond the uncertainty only at {', '.join(won)} of the "
             "horizons from 24 h")
  else:
    claim = f"does not beat the best recurrent model ({second}) beyond the uncertainty at any horizon from 24 h"
  if lost:
    claim += f"; {second} is better beyond it at {', '.join(lost)}"
  sentence = (f"**On 2014, the best Transformer-family model ({first}) {claim}** (test MAE in µg/m³, "
              f"difference and its 95% interval: {numbers(rows)})")
  return sentence + (f"; DLinear against {first}: {numbers(linear_rows)}." if linear_rows else ".")


def comparison_section(data: dict, metrics: dict, transformer: str, recurrent: str) -> str:
  """The verdict, the paired tables (DLinear against the Transformer too), and where the test year ranks others
  best in each family (by the mean MAE from 24 h: optimistic), their comparison from 24 h in one line."""
  rows = paired_comparison(data, metrics, transformer, recurrent)
  linear = paired_comparison(data, metrics, "dlinear", transformer) if "dlinear" in metrics else None
  text = (f"{verdict(rows, transformer, recurrent, linear)}\n\nBest by validation MAE: {transformer} of the "
          f"Transformer family ({', '.join(TRANSFORMERS)}), {recurrent} of the recurrent models. Difference = "
          f"MAE({transformer}) - MAE({recurrent}) on the same test windows, each MAE the mean over its seeds: per "
          f"window the seeds' absolute errors are averaged, so the difference is that of the MAEs in the tables "
          f"below, and its interval resamples weeks of windows (negative: {transformer} better). The verdict rests "
          f"on it, because a model here is one trained seed. The last column averages the seeds' forecasts per "
          f"window first and takes that ensemble's error: another model (three trainings in one), whose errors "
          f"partly cancel.\n\n{comparison_table(rows, transformer, recurrent)}\n")
  if linear:
    text += (f"\nDLinear, the linear reference, against {transformer} (negative: DLinear better):\n\n"
             f"{comparison_table(linear, 'dlinear', transformer)}\n")
  from_24h = [index for index, horizon in enumerate(data["horizons"]) if horizon >= 24]
  on_test = {name: values["mae"].mean(0)[from_24h].mean() for name, values in metrics.items()}
  first, second = best_of(TRANSFORMERS, on_test), best_of(RECURRENT, on_test)
  if (first, second) == (transformer, recurrent):
    return text
  long = [row for row in paired_comparison(data, metrics, first, second) if row["horizon"] >= 24]
  won = [f"{row['horizon']} h" for row in long if row["better"] == first]
  return text + (f"\nChosen on the test year instead (optimistic, only to check that the verdict does not hang on "
                 f"the validation ranking): {first} against {second}: " + "; ".join(
                     f"{row['horizon']} h {row['difference']:+.1f} ({row['low']:+.1f} to {row['high']:+.1f})"
                     for row in long)
                 + f"; {first} better beyond the interval at {', '.join(won) if won else 'none of these horizons'}.\n")


def published_ranking(metrics: dict, horizons: list[int]) -> str:
  """Whether Shi et al.'s ranking (the Transformer best) holds here, per horizon: the rank of the 2017 Transformer
  by test MAE among the models they compared (mean over seeds), and which is best."""
  compared = [name for name in STYLE_2017 if name in metrics]
  if "transformer" not in compared:
    return ""
  ranks, held = [], []
  for index, horizon in enumerate(horizons):
    order = sorted(compared, key=lambda name: metrics[name]["mae"].mean(0)[index])
    rank = order.index("transformer") + 1
    held += [f"{horizon} h"] if rank == 1 else []
    ranks.append(f"{horizon} h transformer {rank} of {len(order)}" + ("" if rank == 1 else f" ({order[0]} best)"))
  return (f"Here, among their models ({', '.join(compared)}) by test MAE (mean over seeds), their ranking holds "
          f"at {', '.join(held) if held else 'no horizon'} (this page has no 3-hour horizon): {'; '.join(ranks)}.")


def plot_errors(metrics: dict, horizons, path: str) -> None:
  """MAE and RMSE against the horizon: one line per model (error bars: std over seeds)."""
  with report.figure(path, 1, 2, (12, 4.5)) as (drawing, axes):
    for axis, metric in zip(axes[0], ("mae", "rmse")):
      for name, values in metrics.items():
        values = values[metric]
        axis.errorbar(horizons, values.mean(0), yerr=values.std(0, ddof=1) if len(values) > 1 else None,
                      linestyle="--" if name in BASELINES else "-", marker="o", capsize=3, label=name)
      axis.set_xscale("log")
      axis.set_xticks(horizons)
      axis.set_xticklabels([str(h) for h in horizons])
      axis.set_xlabel("horizon (hours ahead)")
      axis.set_ylabel(f"{metric.upper()} (µg/m³)")
      axis.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    drawing.suptitle("Beijing PM2.5, 2014 (test): error by horizon (mean over seeds)")


def plot_forecasts(data: dict, names: list[str], path: str) -> None:
  """Measured pm2.5 and the forecasts of ``names`` (seed means) made ``EXAMPLE_HORIZONS`` hours earlier, over
  the ``EXAMPLE_DAYS`` days of 2014 whose measurements vary most (of consecutive spans)."""
  horizons, target_time = list(data["horizons"]), data["target_time"]
  measured = np.where(data["mask"], data["actual"], np.nan)
  first = horizons.index(EXAMPLE_HORIZONS[0])
  span = min(EXAMPLE_DAYS * 24, len(measured))
  start = max(np.arange(0, len(measured) - span + 1, span), key=lambda s: np.nanstd(measured[s:s + span, first]))
  period = target_time[start, first], target_time[start, first] + span
  with report.figure(path, len(EXAMPLE_HORIZONS), 1, (12, 3.8 * len(EXAMPLE_HORIZONS))) as (drawing, axes):
    for axis, horizon in zip(axes[:, 0], EXAMPLE_HORIZONS):
      index = horizons.index(horizon)
      rows = (target_time[:, index] >= period[0]) & (target_time[:, index] < period[1])
      axis.plot(target_time[rows, index], measured[rows, index], color="black", linewidth=1.5, label="measured")
      for name in names:
        axis.plot(target_time[rows, index], data["forecasts"][name][:, rows, index].mean(0), linewidth=1,
                  linestyle="--" if name in BASELINES else "-", label=name)
      axis.set_ylabel("PM2.5 (µg/m³)")
      axis.set_title(f"forecasts made {horizon} h ahead")
      axis.grid(alpha=0.3)
      axis.legend(ncol=4, fontsize=8)
    drawing.suptitle(f"Beijing PM2.5, {str(period[0])[:10]} to {str(period[1])[:10]} (2014, test)")
    drawing.autofmt_xdate()


def validation_maes(store: report.RecordStore) -> dict[str, dict[int, float]]:
  """Model -> {input hours: validation MAE (best checkpoint, all horizons)} of the store's runs."""
  tried = {}
  for record in store.records.values():
    tried.setdefault(record["values"]["model"], {})[record["values"]["hours"]] = record["values"]["validation_mae"]
  return tried


def kept_windows(store: report.RecordStore) -> dict[str, int]:
  """Model -> the input hours of its run with the lowest validation MAE, over the store's runs."""
  return {name: min(by_hours, key=by_hours.get) for name, by_hours in validation_maes(store).items()}


def window_table(store: report.RecordStore, kept: dict[str, int]) -> str:
  """Validation MAE of each model and window; the kept one in bold."""
  tried = validation_maes(store)
  windows = sorted({hours for candidates in WINDOW_CANDIDATES.values() for hours in candidates}
                   | {hours for by_hours in tried.values() for hours in by_hours})
  rows = [[name] + [("**{:.2f}**" if hours == kept.get(name) else "{:.2f}").format(tried[name][hours])
                    if hours in tried.get(name, {}) else "-" for hours in windows] for name in MODELS]
  return report.markdown_table(["model"] + [f"{hours} h" for hours in windows], rows)


def run_names(store: report.RecordStore) -> list[str]:
  """The store's runs, by model (``MODELS``' order), then input hours."""
  order = {name: index for index, name in enumerate(MODELS)}
  return sorted(store, key=lambda run: (order.get(store[run]["values"]["model"], len(order)),
                                        store[run]["values"]["hours"]))


def runs_table(store: report.RecordStore) -> str:
  """Every run: seeds, steps, best step, status, wall time, speed, command."""
  rows = []
  for run in run_names(store):
    record = store[run]
    values, done, total = record["values"], record["steps"], record["values"]["num_train_steps"]
    status = "finished" if done >= total else f"**partial** (stopped at step {done} of {total})"
    rows.append([run, values["seeds"], f"{done} / {total}", values["best_step"], status,
                 f"{values['wall_seconds'] / 60:.1f} min", f"{values['steps_per_second']:.1f}",
                 f"`{record['command']}`"])
  return report.markdown_table(["run", "seeds", "steps done", "best step (validation MAE)", "status", "wall time",
                                "steps/s (median)", "command"], rows)


def collect(store: report.RecordStore, folder: str, workdir_root: str) -> None:
  """Record every run under ``workdir_root``; score each model's kept run found there and the baselines on the
  common test origins into ``folder/forecasts_2014.npz`` (a model whose kept run is elsewhere has no test rows)."""
  runs = find_runs(workdir_root)
  if not runs:
    commands = [f"- {name}: `{run_command(name, hours)}`" for name in MODELS for hours in WINDOW_CANDIDATES[name]]
    raise report.UserError(f"no run with checkpoints under {workdir_root} (named <variant>-<hours>h); train "
                           f"first, e.g.:\n" + "\n".join(commands))
  validation = {(name, hours): best_validation(workdir) for name, tried in runs.items()
                for hours, workdir in tried.items()}
  store.check({f"{name}-{hours}h": steps for (name, hours), (steps, _) in validation.items()})
  for (name, hours), (steps, values) in validation.items():
    config = read_run_config(runs[name][hours])
    store.add(f"{name}-{hours}h", steps=steps, command=run_command(name, hours, config),
              machine=report.machine_description(),
              values={"model": name, "hours": hours, "seeds": config.num_seeds, "eval_every": config.eval_every,
                      "num_train_steps": config.num_train_steps, "workdir_root": workdir_root, **values})
  kept = sorted(kept_windows(store).items(), key=lambda item: -item[1])  # the longest input window first
  workdirs = {name: runs[name][hours] for name, hours in kept if hours in runs.get(name, {})}
  if workdirs:  # else every model's kept run is an earlier one: its forecasts stay
    write_forecasts(workdirs, os.path.join(folder, FORECASTS_FILE))


def render(store: report.RecordStore, folder: str, committed: bool) -> str:
  """The page and its plots, from the records and the folder's forecasts (else the committed page's: a new
  folder starts from the committed records)."""
  path = os.path.join(folder, FORECASTS_FILE)
  data = load_forecasts(path if os.path.exists(path) else os.path.join(COMMITTED_DIR, FORECASTS_FILE))
  metrics, horizons, tried, kept = test_metrics(data), data["horizons"], validation_maes(store), kept_windows(store)
  validation = {name: tried[name][hours] for name, hours in kept.items()}
  transformer, recurrent = best_of(TRANSFORMERS, validation), best_of(RECURRENT, validation)
  both = transformer in metrics and recurrent in metrics
  plot_errors(metrics, horizons, os.path.join(folder, "error_by_horizon.png"))
  plot_forecasts(data, ["persistence"] + [n for n in (recurrent, transformer) if n in metrics],
                 os.path.join(folder, "forecasts_6h_48h.png"))

  def table(metric):  # mean ± std over seeds; a baseline's one value alone
    rows = [[name, kept.get(name, "-")] + [f"{values[0]:.1f}" if len(values) == 1 else report.mean_std(values, 1)
                                           for values in metrics[name][metric].T] + [len(metrics[name][metric])]
            for name in metrics]
    return report.markdown_table(["model", "input hours"] + [f"{h} h" for h in horizons] + ["seeds"], rows)

  not_run = [f"- {name}-{hours}h: `{run_command(name, hours)}`" for name in MODELS
             for hours in WINDOW_CANDIDATES[name] if f"{name}-{hours}h" not in store]
  names, origins = run_names(store), data["origin_time"]
  return PAGE.format(
      root=",".join(store.distinct(names, "workdir_root")), flag=" --update_committed" if committed else "",
      machine="; ".join(store.distinct(names)), horizons=", ".join(map(str, horizons)),
      windows=len(origins), first=origins[0], last=origins[-1], mae=table("mae"), rmse=table("rmse"),
      comparison=comparison_section(data, metrics, transformer, recurrent) if both else "",
      published_ranking=published_ranking(metrics, horizons),
      window_table=window_table(store, kept), runs=runs_table(store),
      eval_every=", ".join(map(str, store.distinct(names, "eval_every"))),
      not_run="\n".join(["", "Not run yet:", ""] + not_run) if not_run else "",
      predictions=PREDICTIONS_FILE, forecasts=FORECASTS_FILE, num_horizons=len(horizons),
      resamples=BOOTSTRAP_RESAMPLES, block_days=BOOTSTRAP_BLOCK_HOURS // 24)


PAGE = """# Beijing PM2.5 forecasting

Written by `TRANSFORMER_DATA_DIR=../shared/data python -m experiments.beijing_pm25_results
--workdir_root={root}{flag}`; do not edit by hand.

Machine: {machine} (shared with other jobs while these ran).

Task: pm2.5 at {horizons} hours after the forecast origin. Trained on 2010-2012, best checkpoint by validation
MAE on 2013, scored on every measured target hour of the {windows:,} test windows with origins in 2014 from
{first} to {last}: the same windows for every model and baseline (those the longest input window leaves). The
2017-style models (rnn, lstm, gru, transformer, transformer_encoder) read all 18 features of each input hour
(pm2.5, weather, wind direction, time of day/week/year) and forecast the change from the last hour; PatchTST and
DLinear read the pm2.5 history alone (channel independent, as published) and forecast its level. Each model's
input window is the one of its candidates with the lowest validation MAE (table below). MAE and RMSE in µg/m³,
mean ± standard deviation over the seeds of each run (trained together, vmapped: the spread of training, not the
uncertainty of the test estimate, which the paired comparison gives). Persistence: the last measured value;
daily persistence: the target's hour of day on the latest day at or before the origin, or where that hour is
unmeasured the last measurement before it (both read the series filled forward); no training.

## Verdict: the best Transformer-family model against the best recurrent model

{comparison}
Interval: 95% percentile interval of {resamples:,} block-bootstrap resamples of whole {block_days}-day blocks of
origins (forecasts from nearby origins share target hours and weather episodes, so single hours are not
independent). Welch's t: the seeds' MAEs of the two models (3 each), which sees training noise only.

## MAE (µg/m³) on 2014, by horizon

{mae}

## RMSE (µg/m³) on 2014, by horizon

{rmse}

![error by horizon](error_by_horizon.png)

![forecasts 6 h and 48 h ahead](forecasts_6h_48h.png)

## Input window, chosen on validation

Validation MAE (µg/m³, 2013, all horizons, best checkpoint) of each window tried; the kept one in bold ("-":
not tried). The 2017 Transformers' attention over a week of hours costs several times their 72-hour step on this
CPU host, and a week-long LSTM run did not fit the session that made this page: they kept 72 hours. Where the
longest window tried is kept (DLinear, PatchTST: two weeks), a longer one might do better still.

{window_table}

## Published anchors

- Shi, Jain & Narasimhan (2022), whose comparison this experiment follows on the same dataset, found the
  Transformer best for most single-step and multi-step predictions at horizons of 1 and 3 hours. Their splits,
  input features, horizons and training budgets are not this page's, so their numbers are not comparable to
  these; the ranking is what this page tests. {published_ranking}
- PatchTST (Nie et al., ICLR 2023) and DLinear (Zeng et al., AAAI 2023) report MSE/MAE of z-normalised series
  on the ETT, Weather, Electricity and Traffic benchmarks, 96 to 720 steps ahead, not on this dataset: not
  comparable numbers. There DLinear beat the Transformer forecasters of its time and PatchTST beat DLinear; the
  same two models run here, under this page's protocol.

## Runs

Wall time: training including compilation, evaluation (every {eval_every} steps) and checkpointing, all seeds of
the run together.

{runs}
{not_run}

## Use and recompute

`python launch.py --config=experiments/beijing_pm25.py:gru --workdir=WORKDIR --mode=predict` writes
`WORKDIR/{predictions}` (timestamp = forecast origin, horizon, target_time, forecast, actual, and one
forecast column per seed; `forecast` is their mean). In a notebook:

```python
from transformer import load
model = load("WORKDIR", replica=0)         # one seed's parameters (best checkpoint)
model.forecast(raw_rows)                   # dict of read_csv columns, >= input_length hours, last = origin
model.forecast(features)                   # or prepared features [input_length, 18]; -> [{num_horizons}] ug/m3
```

Every table above from the committed test forecasts (`{forecasts}`, tenths of µg/m³: the rounding moves an MAE
by less than 0.05):

```python
import numpy as np
saved = np.load("experiments/beijing_pm25/{forecasts}")
measured = saved["actual"] >= 0                                   # [windows, horizons]
actual = saved["actual"] / 10
mae = (np.abs(saved["gru"] / 10 - actual) * measured).sum(1) / measured.sum(0)   # [seeds, horizons]
```
"""


def main(argv=None) -> str:
  args = report.results_parser(__doc__, "WORKDIR_ROOT/results", default_root="/tmp/pm25").parse_args(argv)
  return report.make_page(args, COMMITTED_DIR, os.path.join(args.workdir_root, "results"),
                          lambda store, folder: collect(store, folder, args.workdir_root),
                          lambda store, folder: render(store, folder, args.update_committed))


if __name__ == "__main__":
  main()
