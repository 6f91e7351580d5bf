"""Score the Beijing PM2.5 runs and the persistence baselines on 2014 (test); write RESULTS.md, plots, forecasts.

    TRANSFORMER_DATA_DIR=../shared/data python -m experiments.beijing_pm25_results --workdir_root=/tmp/pm25
    ... --update_committed      # into experiments/beijing_pm25/ (else --output_dir, default <root>/results)
    python -m experiments.beijing_pm25_results --from_records --update_committed   # no runs, no data needed

A model's runs are ``<workdir_root>/<variant>-<hours>h``, one per input window tried (``python launch.py
--config=experiments/beijing_pm25.py:<variant> --config.model.input_length=<hours> --workdir=...``); nothing is
trained here. Per model, the window whose run reached the lowest validation MAE (2013) is kept. Every seed of a
kept run is restored from its best checkpoint and forecasts the test windows; all models and baselines are
scored on the same windows (the origins that the longest input window leaves in 2014). The best
Transformer-family model and the best recurrent model (each by validation MAE) are compared per horizon on the
same windows: the MAE difference with a block-bootstrap interval over weeks of origins, and Welch's t over seeds.

Each run's row (validation MAE, steps, command) is kept in ``records.json`` beside the page, and the kept runs'
test forecasts in ``forecasts_2014.npz``; every number and plot of the page is computed from these two, which is
all ``--from_records`` reads (in a new folder: the committed ones).
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
from transformer.train.writers import read_metrics

MODELS = RECURRENT + TRANSFORMERS + ("dlinear",)
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
BOOTSTRAP_RESAMPLES = 2000
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
    checkpoints = os.path.join(workdir_root, name, "checkpoints")
    if match and match["variant"] in MODELS and os.path.isdir(checkpoints) and os.listdir(checkpoints):
      runs.setdefault(match["variant"], {})[int(match["hours"])] = os.path.join(workdir_root, name)
  return runs


def best_validation(workdir: str) -> dict:
  """The evaluation record with the lowest validation MAE (the best checkpoint's), with ``wall_seconds``, the
  last step and the median steps/s of the run added."""
  records = read_metrics(workdir)
  best = dict(min((r for r in records if "eval/mae" in r), key=lambda r: r["eval/mae"]))
  last = [r for r in records if "wall_seconds" in r][-1]
  speeds = [r["train/steps_per_second"] for r in records if "train/steps_per_second" in r][1:]
  best.update(last_step=last["step"], wall_seconds=last["wall_seconds"],
              steps_per_second=float(np.median(speeds)) if speeds else float("nan"))
  return best


def score_run(workdir: str) -> dict:
  """Every seed of the run in ``workdir`` on the test windows: ``{"forecasts": [seeds, windows, H] ug/m3,
  "actual", "mask": [windows, H], "origin_time", "task"}``."""
  config = read_run_config(workdir)
  forecasts = []
  for replica in range(config.num_seeds):
    model = load(workdir, replica=replica)
    split = model.task.predict_split(model.model_config, model.params, "test")
    forecasts.append(split["forecast"])
  return {**{key: split[key] for key in ("actual", "mask", "origin_time")}, "forecasts": np.stack(forecasts),
          "task": model.task}


def on_origins(score: dict, origins: np.ndarray) -> dict:
  """``score`` restricted to the windows whose origin is in ``origins`` (in their order)."""
  rows = np.searchsorted(score["origin_time"], origins)
  if not np.array_equal(score["origin_time"][rows], origins):
    raise ValueError("on_origins: a run lacks some of the common test origins")
  kept = {key: score[key][rows] for key in ("actual", "mask", "origin_time")}
  return {**score, **kept, "forecasts": score["forecasts"][:, rows]}


def baseline_scores(task, origins: np.ndarray) -> dict:
  """The persistence baselines, as one-seed scores on the test windows of ``task`` at ``origins``."""
  windows = task.windows("test")
  actual, mask = task.series.concentration_targets(windows)
  rows = np.searchsorted(task.series.times[windows.origins], origins)
  return {name: {"forecasts": forecast[rows][None], "actual": actual[rows], "mask": mask[rows],
                 "origin_time": origins} for name, forecast in task.series.baselines(windows).items()}


def test_metrics(score: dict) -> dict:
  """``{"mae", "rmse": [seeds, H]}`` in ug/m3 over the measured targets (a baseline's NaN forecast, before
  the split's first measurement, unscored)."""
  per_seed = []
  for forecast in score["forecasts"]:
    usable = score["mask"] & np.isfinite(forecast)
    per_seed.append(forecast_metrics(np.nan_to_num(forecast), np.nan_to_num(score["actual"]), usable))
  return {metric: np.stack([m[metric] for m in per_seed]) for metric in ("mae", "rmse")}


def seed_mean_absolute_errors(score: dict) -> np.ndarray:
  """``[windows, H]`` absolute error of each forecast averaged over seeds (0 where unmeasured): its mean over
  the measured targets is the seeds' mean MAE."""
  errors = np.abs(score["forecasts"] - np.nan_to_num(score["actual"])[None]).mean(axis=0)
  return np.where(score["mask"], errors, 0.0)


def family_best(validation: dict[str, float], family: tuple[str, ...]) -> str | None:
  """The model of ``family`` with the lowest validation MAE over all horizons (``validation``: model -> that of
  its kept run; None: none was run)."""
  candidates = [name for name in family if name in validation]
  return min(candidates, key=validation.get) if candidates else None


def test_best(metrics: dict, family: tuple[str, ...], horizons) -> str | None:
  """The model of ``family`` with the lowest mean test MAE over the horizons from 24 h: an optimistic choice,
  only to check that the verdict does not hang on the validation year's ranking."""
  long = [index for index, horizon in enumerate(horizons) if horizon >= 24]
  candidates = [name for name in family if name in metrics]
  return min(candidates, key=lambda name: metrics[name]["mae"].mean(0)[long].mean()) if candidates else None


def paired_comparison(scores: dict, metrics: dict, first: str, second: str, horizons) -> list[dict]:
  """Per horizon: both MAEs (seed means), the block-bootstrap difference and Welch's t over seeds."""
  compared = report.block_bootstrap_difference(
      seed_mean_absolute_errors(scores[first]), seed_mean_absolute_errors(scores[second]), scores[first]["mask"],
      block_length=BOOTSTRAP_BLOCK_HOURS, resamples=BOOTSTRAP_RESAMPLES)
  rows = []
  for index, horizon in enumerate(horizons):
    a, b = metrics[first]["mae"][:, index], metrics[second]["mae"][:, index]
    low, high = compared["low"][index], compared["high"][index]
    rows.append({"horizon": horizon, "first": a.mean(), "second": b.mean(),
                 "difference": compared["difference"][index], "low": low, "high": high,
                 "better": first if high < 0 else second if low > 0 else None,
                 "welch": report.welch_t_test(a, b) if len(a) > 1 and len(b) > 1 else None})
  return rows


def comparison_table(rows: list[dict], first: str, second: str) -> str:
  def welch(row):
    if row["welch"] is None:
      return "-"
    t, df, p = row["welch"]
    return f"t = {t:.2f}, df = {df:.1f}, {report.format_p_value(p)}"
  return report.markdown_table(
      ["horizon", f"{first} MAE", f"{second} MAE", "difference", "95% interval (weeks resampled)",
       "beyond the interval", "Welch's t over seeds"],
      [[f"{row['horizon']} h", f"{row['first']:.1f}", f"{row['second']:.1f}", f"{row['difference']:+.1f}",
        f"{row['low']:+.1f} to {row['high']:+.1f}", f"**{row['better']} better**" if row["better"] else "no",
        welch(row)] for row in rows])


def verdict(rows: list[dict], first: str, second: str, linear_rows: list[dict] | None) -> str:
  """One sentence on the long horizons (24 h and more), with the numbers behind it."""
  long = [row for row in rows if row["horizon"] >= 24]
  won = [row for row in long if row["better"] == first]
  numbers = "; ".join(f"{row['horizon']} h {row['first']:.1f} vs {row['second']:.1f} "
                      f"({row['difference']:+.1f}, {row['low']:+.1f} to {row['high']:+.1f})" for row in long)
  if len(won) == len(long):
    claim = f"beats the best recurrent model ({second}) at every horizon from 24 h, beyond the uncertainty"
  elif won:
    claim = (f"beats the best recurrent model ({second}) beyond the uncertainty only at "
             f"{', '.join(str(row['horizon']) + ' h' for row in won)} of the horizons from 24 h")
  else:
    claim = f"does not beat the best recurrent model ({second}) beyond the uncertainty at any horizon from 24 h"
  lost = [f"{row['horizon']} h" for row in long if row["better"] == second]
  if lost:
    claim += f"; {second} is better beyond it at {', '.join(lost)}"
  sentence = (f"**On 2014, the best Transformer-family model ({first}) {claim}** (test MAE in µg/m³, "
              f"difference and its 95% interval: {numbers})")
  if linear_rows:
    linear = "; ".join(f"{row['horizon']} h {row['first']:.1f} vs {row['second']:.1f} ({row['difference']:+.1f}, "
                       f"{row['low']:+.1f} to {row['high']:+.1f})" for row in linear_rows if row["horizon"] >= 24)
    sentence += f"; DLinear against {first}: {linear}"
  return sentence + "."


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


def plot_forecasts(scores: dict, names: list[str], horizons, path: str) -> None:
  """Measured pm2.5 and the forecasts of ``names`` (seed means) made ``EXAMPLE_HORIZONS`` hours earlier, over
  the ``EXAMPLE_DAYS`` days of 2014 whose measurements vary most (of consecutive spans)."""
  reference = scores[names[0]]
  first = list(horizons).index(EXAMPLE_HORIZONS[0])
  span = min(EXAMPLE_DAYS * 24, len(reference["mask"]))
  measured = np.where(reference["mask"][:, first], reference["actual"][:, first], np.nan)
  starts = np.arange(0, len(measured) - span + 1, span)
  start = max(starts, key=lambda s: np.nanstd(measured[s:s + span]))
  period = reference["target_time"][start, first], reference["target_time"][start, first] + span
  size = (12, 3.8 * len(EXAMPLE_HORIZONS))
  with report.figure(path, len(EXAMPLE_HORIZONS), 1, size) as (drawing, axes):
    for axis, horizon in zip(axes[:, 0], EXAMPLE_HORIZONS):
      index = list(horizons).index(horizon)
      times = reference["target_time"][:, index]
      rows = (times >= period[0]) & (times < period[1])
      axis.plot(times[rows], np.where(reference["mask"][rows, index], reference["actual"][rows, index], np.nan),
                color="black", linewidth=1.5, label="measured")
      for name in names:
        axis.plot(times[rows], scores[name]["forecasts"][:, rows, index].mean(0), linewidth=1,
                  linestyle="--" if name in BASELINES else "-", label=name)
      axis.set_ylabel("PM2.5 (µg/m³)")
      axis.set_title(f"forecasts made {horizon} h ahead")
      axis.grid(alpha=0.3)
      axis.legend(ncol=4, fontsize=8)
    drawing.suptitle(f"Beijing PM2.5, {str(period[0])[:10]} to {str(period[1])[:10]} (2014, test)")
    drawing.autofmt_xdate()


def save_forecasts(scores: dict, horizons, path: str) -> None:
  """The test forecasts behind every table, in tenths of µg/m³ (int16: the rounding moves an MAE by < 0.05):
  ``origin_time`` (hours since 1970), ``horizons``, ``actual`` (-1 where unmeasured) and one ``[seeds,
  windows, H]`` array per model."""
  reference = next(iter(scores.values()))
  arrays = {"origin_time": reference["origin_time"].astype("datetime64[h]").astype(np.int64),
            "horizons": np.asarray(horizons),
            "actual": np.where(reference["mask"], np.round(np.nan_to_num(reference["actual"]) * 10), -1)}
  for name, score in scores.items():
    arrays[name] = np.round(np.nan_to_num(score["forecasts"], nan=-0.1) * 10)
  for name, values in arrays.items():
    if name not in ("origin_time", "horizons"):
      if np.abs(values).max() >= np.iinfo(np.int16).max:
        raise ValueError(f"save_forecasts: {name} holds a value beyond int16 tenths of µg/m³")
      arrays[name] = values.astype(np.int16)
  np.savez_compressed(path, **arrays)


def load_forecasts(path: str) -> tuple[dict, list[int]]:
  """``save_forecasts`` read back: ``(scores, horizons)``, a score per model (baselines first) as ``score_run``
  and ``on_origins`` give them, in µg/m³ (a baseline's -0.1, before the split's first measurement, NaN)."""
  saved = np.load(path)
  horizons = saved["horizons"].tolist()
  origins = saved["origin_time"].astype("datetime64[h]")
  mask = saved["actual"] >= 0
  common = {"actual": np.where(mask, saved["actual"] / 10, np.nan), "mask": mask, "origin_time": origins,
            "target_time": origins[:, None] + np.asarray(horizons).astype("timedelta64[h]")}
  names = [name for name in BASELINES if name in saved] + sorted(
      set(saved.files) - {"origin_time", "horizons", "actual", *BASELINES})
  return {name: {**common, "forecasts": np.where((saved[name] == -1) & (name in BASELINES), np.nan,
                                                   saved[name] / 10)} for name in names}, horizons


def kept_windows(store: report.RecordStore) -> dict[str, int]:
  """Model -> the input hours of its run with the lowest validation MAE, over the store's runs."""
  tried = {}
  for record in store.records.values():
    values = record["values"]
    tried.setdefault(values["model"], {})[values["hours"]] = values["validation_mae"]
  return {name: min(by_hours, key=by_hours.get) for name, by_hours in tried.items()}


def window_table(store: report.RecordStore, kept: dict[str, int]) -> str:
  """Validation MAE (best checkpoint, all horizons) of each model and window; the kept one in bold."""
  tried = {(r["values"]["model"], r["values"]["hours"]): r["values"]["validation_mae"] for r in store.records.values()}
  windows = sorted({hours for candidates in WINDOW_CANDIDATES.values() for hours in candidates}
                   | {hours for _, hours in tried})
  rows = [[name] + [("**{:.2f}**" if hours == kept.get(name) else "{:.2f}").format(tried[name, hours])
                    if (name, hours) in tried else "-" for hours in windows] for name in MODELS]
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
    values, done = record["values"], record["steps"]
    total = values["num_train_steps"]
    status = "finished" if done >= total else f"**partial** (stopped at step {done} of {total})"
    rows.append([run, values["seeds"], f"{done} / {total}", values["best_step"], status,
                 f"{values['wall_seconds'] / 60:.1f} min", f"{values['steps_per_second']:.1f}",
                 f"`{record['command']}`"])
  header = ["run", "seeds", "steps done", "best step (validation MAE)", "status", "wall time", "steps/s (median)",
            "command"]
  return report.markdown_table(header, rows)


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
  store.check({f"{name}-{hours}h": best["last_step"] for (name, hours), best in validation.items()})
  for (name, hours), best in validation.items():
    config = read_run_config(runs[name][hours])
    store.add(f"{name}-{hours}h", steps=best["last_step"], command=run_command(name, hours, config),
              machine=report.machine_description(),
              values={"model": name, "hours": hours, "seeds": config.num_seeds,
                      "num_train_steps": config.num_train_steps, "best_step": best["step"],
                      "validation_mae": best["eval/mae"], "wall_seconds": best["wall_seconds"],
                      "steps_per_second": best["steps_per_second"], "eval_every": config.eval_every,
                      "workdir_root": workdir_root})
  kept = kept_windows(store)
  scores = {name: score_run(runs[name][hours]) for name, hours in kept.items() if hours in runs.get(name, {})}
  if not scores:  # every model's kept run is an earlier one: its forecasts stay
    return
  longest = max(scores, key=lambda name: kept[name])
  origins, horizons = scores[longest]["origin_time"], list(scores[longest]["task"].horizons)
  scores = {**baseline_scores(scores[longest]["task"], origins),
            **{name: on_origins(score, origins) for name, score in scores.items()}}
  save_forecasts(scores, horizons, os.path.join(folder, FORECASTS_FILE))


def forecasts_path(folder: str) -> str:
  """The folder's forecasts, else the committed page's (a new folder starts from the committed records)."""
  path = os.path.join(folder, FORECASTS_FILE)
  return path if os.path.exists(path) else os.path.join(COMMITTED_DIR, FORECASTS_FILE)


def render(store: report.RecordStore, folder: str, committed: bool) -> str:
  """The page, its plots from the records and the forecasts."""
  scores, horizons = load_forecasts(forecasts_path(folder))
  metrics = {name: test_metrics(score) for name, score in scores.items()}
  kept = kept_windows(store)
  kept_validation = {name: store[f"{name}-{hours}h"]["values"]["validation_mae"] for name, hours in kept.items()}
  transformer, recurrent = family_best(kept_validation, TRANSFORMERS), family_best(kept_validation, RECURRENT)
  comparison = ""
  if transformer in scores and recurrent in scores:
    rows = paired_comparison(scores, metrics, transformer, recurrent, horizons)
    linear = paired_comparison(scores, metrics, "dlinear", transformer, horizons) if "dlinear" in scores else None
    comparison = comparison_section(rows, linear, transformer, recurrent)
    on_test = test_best(metrics, TRANSFORMERS, horizons), test_best(metrics, RECURRENT, horizons)
    if on_test != (transformer, recurrent):
      comparison += robustness_line(paired_comparison(scores, metrics, *on_test, horizons), *on_test)
  plot_errors(metrics, horizons, os.path.join(folder, "error_by_horizon.png"))
  plot_forecasts(scores, ["persistence"] + [n for n in (recurrent, transformer) if n in scores], horizons,
                 os.path.join(folder, "forecasts_6h_48h.png"))

  def table(metric):
    rows = [[name, kept.get(name, "-")] + [mean_std(metrics[name][metric][:, i]) for i in range(len(horizons))]
            + [len(metrics[name][metric])] for name in scores]
    return report.markdown_table(["model", "input hours"] + [f"{h} h" for h in horizons] + ["seeds"], rows)

  origins = next(iter(scores.values()))["origin_time"]
  not_run = [f"- {name}-{hours}h: `{run_command(name, hours)}`" for name in MODELS
             for hours in WINDOW_CANDIDATES[name] if f"{name}-{hours}h" not in store]
  names = run_names(store)
  return PAGE.format(
      root=",".join(store.distinct(names, "workdir_root")), flag=" --update_committed" if committed else "",
      machine="; ".join(store.distinct(names)), horizons=", ".join(map(str, horizons)),
      windows=len(origins), first=origins[0], last=origins[-1], comparison=comparison, mae=table("mae"),
      rmse=table("rmse"), window_table=window_table(store, kept), runs=runs_table(store),
      eval_every=", ".join(map(str, store.distinct(names, "eval_every"))),
      not_run="\n".join(["", "Not run yet:", ""] + not_run) if not_run else "",
      predictions=PREDICTIONS_FILE, forecasts=FORECASTS_FILE, num_horizons=len(horizons),
      resamples=BOOTSTRAP_RESAMPLES, block_days=BOOTSTRAP_BLOCK_HOURS // 24)


def comparison_section(rows: list[dict], linear: list[dict] | None, transformer: str, recurrent: str) -> str:
  text = (f"{verdict(rows, transformer, recurrent, linear)}\n\nBest by validation MAE: {transformer} of the "
          f"Transformer family ({', '.join(TRANSFORMERS)}), {recurrent} of the recurrent models. Difference = "
          f"MAE({transformer}) - MAE({recurrent}) on the same test windows, seeds' forecasts averaged per window "
          f"(negative: {transformer} better).\n\n{comparison_table(rows, transformer, recurrent)}\n")
  if linear:
    text += (f"\nDLinear, the linear reference, against {transformer} (negative: DLinear better):\n\n"
             f"{comparison_table(linear, 'dlinear', transformer)}\n")
  return text


def robustness_line(rows: list[dict], first: str, second: str) -> str:
  """The comparison of the models that the test year itself ranks best in each family, from 24 h."""
  long = [row for row in rows if row["horizon"] >= 24]
  won = [f"{row['horizon']} h" for row in long if row["better"] == first]
  return (f"\nChosen on the test year instead (optimistic, only to check that the verdict does not hang on the "
          f"validation ranking): {first} against {second}: " + "; ".join(
              f"{row['horizon']} h {row['difference']:+.1f} ({row['low']:+.1f} to {row['high']:+.1f})" for row in long)
          + f"; {first} better beyond the interval at {', '.join(won) if won else 'none of these horizons'}.\n")


def mean_std(values: np.ndarray) -> str:
  """``mean ± std`` over seeds; a single value alone (a baseline)."""
  return f"{values[0]:.1f}" if len(values) == 1 else report.mean_std(values, digits=1)


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
daily persistence: the target's hour of day on the latest day at or before the origin; no training.

## Verdict: the best Transformer-family model against the best recurrent model

{comparison}
Interval: 95% percentile interval of {resamples} block-bootstrap resamples of whole {block_days}-day blocks of
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

- Shi, Jain & Narasimhan (2022), whose comparison this experiment follows on the same dataset, report the
  Transformer best for long-term forecasts and LSTM/GRU better than a plain RNN short-term. Their splits, input
  features, horizons and training budgets are not this page's, so their numbers are not comparable to these;
  the ranking is what this page tests.
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
