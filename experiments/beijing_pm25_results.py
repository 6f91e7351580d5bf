"""Score the Beijing PM2.5 runs and the persistence baselines on 2014 (test); write RESULTS.md and the plots.

    TRANSFORMER_DATA_DIR=../shared/data python -m experiments.beijing_pm25_results --workdir_root=/tmp/pm25
    ... --update_committed      # into experiments/beijing_pm25/ (else --output_dir, default <root>/results)

Each model's runs are ``<workdir_root>/<variant>`` (``python launch.py --config=experiments/beijing_pm25.py:<variant>
--workdir=<workdir_root>/<variant>``); nothing is trained here. Every seed of a run (``config.num_seeds``) is
restored from the run's best checkpoint (lowest validation MAE) and forecasts every test window; MAE and RMSE in
ug/m3 per horizon are then averaged over seeds (mean +- standard deviation). A run that has not finished is
reported as such (steps done, wall time), one that has not started is listed with its command.
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np
from absl import app

from experiments import report
from transformer import load, read_run_config
from transformer.data import timeseries
from transformer.tasks.forecasting import PREDICTIONS_FILE
from transformer.train.writers import read_metrics

_ROOT = report.workdir_root_flag()  # default /tmp/pm25
_OUTPUT = report.output_flags()  # --output_dir, --update_committed, --force
DEFAULT_ROOT = "/tmp/pm25"

MODELS = ("rnn", "lstm", "gru", "transformer", "transformer_encoder")
RECURRENT = ("rnn", "lstm", "gru")
BASELINES = ("persistence", "daily_persistence")
COMMITTED_DIR = os.path.join(report.REPO, "experiments", "beijing_pm25")
# Where data lives and how a run printed: not settings, left out of the recorded command.
NOT_SETTINGS = ("task.source_dir", "task.data_dir", "quiet", "tensorboard")
EXAMPLE_HORIZON = 24  # hours ahead in the example forecast plot
EXAMPLE_DAYS = 14


def variant_config(variant: str):
  """``experiments/beijing_pm25.py``'s config of ``variant``, as the command line would build it."""
  spec = importlib.util.spec_from_file_location("beijing_pm25", os.path.join(report.REPO, "experiments",
                                                                             "beijing_pm25.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


def run_command(variant: str, config=None) -> str:
  """The command that trains ``variant``, with the overrides its run's config has over the variant's."""
  parts = ["python", "launch.py", f"--config=experiments/beijing_pm25.py:{variant}", "--workdir=WORKDIR"]
  if config is not None:
    parts += report.config_overrides(variant_config(variant), config, ignored=NOT_SETTINGS)
  return "TRANSFORMER_DATA_DIR=../shared/data " + report.command_line(parts)


def score_run(workdir: str) -> dict:
  """Test metrics of every seed of the run in ``workdir``: ``{"mae", "rmse": [seeds, H], "predicted": seed 0's
  ``predict_split``, "config", "step"}``."""
  config = read_run_config(workdir)
  maes, rmses, predicted, step = [], [], None, None
  for replica in range(config.num_seeds):
    model = load(workdir, replica=replica)
    split = model.task.predict_split(model.model_config, model.params, "test")
    metrics = timeseries.forecast_metrics(split["forecast"], np.nan_to_num(split["actual"]), split["mask"])
    maes.append(metrics["mae"])
    rmses.append(metrics["rmse"])
    predicted = split if predicted is None else predicted
    step = model.step
  return {"mae": np.array(maes), "rmse": np.array(rmses), "predicted": predicted, "config": config,
          "step": step, "task": model.task}


def score_baselines(task) -> dict:
  """The persistence baselines on the test windows of ``task``'s series (its input length)."""
  windows = task.windows("test")
  actual, mask = task.series.concentration_targets(windows)
  scored = {}
  for name, forecast in task.series.baselines(windows).items():
    usable = mask & np.isfinite(forecast)  # NaN only before the split's first measurement
    metrics = timeseries.forecast_metrics(np.nan_to_num(forecast), np.nan_to_num(actual), usable)
    scored[name] = {"mae": metrics["mae"][None], "rmse": metrics["rmse"][None], "forecast": forecast,
                    "unscored": int(mask.sum() - usable.sum())}
  return scored


def mean_std(values: np.ndarray) -> str:
  """``mean +- std`` over seeds (axis 0); a single value alone."""
  if len(values) == 1:
    return f"{values[0]:.1f}"
  return f"{values.mean():.1f} ± {values.std(ddof=1):.1f}"


def plot_errors(scores: dict, horizons, path: str) -> None:
  """MAE and RMSE against the horizon: one line per model (error bars: std over seeds)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  figure, axes = plt.subplots(1, 2, figsize=(11, 4))
  for axis, metric in zip(axes, ("mae", "rmse")):
    for name, score in scores.items():
      values = score[metric]
      style = "--" if name in BASELINES else "-"
      axis.errorbar(horizons, values.mean(0), yerr=values.std(0, ddof=1) if len(values) > 1 else None,
                    linestyle=style, marker="o", capsize=3, label=name)
    axis.set_xscale("log")
    axis.set_xticks(horizons)
    axis.set_xticklabels([str(h) for h in horizons])
    axis.set_xlabel("horizon (hours ahead)")
    axis.set_ylabel(f"{metric.upper()} (µg/m³)")
    axis.grid(alpha=0.3)
  axes[0].legend()
  figure.suptitle("Beijing PM2.5, 2014 (test): error by horizon (mean over seeds)")
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def plot_example(scores: dict, horizons, path: str) -> None:
  """``EXAMPLE_HORIZON``-hour-ahead forecasts of every model (seed 0) against the measured pm2.5, over
  ``EXAMPLE_DAYS`` days of the test year (the window with the largest variation among a few candidates)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  index = list(horizons).index(EXAMPLE_HORIZON)
  first = next(iter(s for s in scores.values() if "predicted" in s))["predicted"]
  actual, mask = first["actual"][:, index], first["mask"][:, index]
  span = min(EXAMPLE_DAYS * 24, len(actual))
  starts = np.arange(0, len(actual) - span + 1, span)
  start = max(starts, key=lambda s: np.nanstd(np.where(mask[s:s + span], actual[s:s + span], np.nan)))
  rows = slice(start, start + span)
  times = first["target_time"][rows, index]
  figure, axis = plt.subplots(figsize=(12, 4))
  axis.plot(times, np.where(mask[rows], actual[rows], np.nan), color="black", linewidth=1.5, label="measured")
  for name, score in scores.items():
    if EXAMPLE_HORIZON == 24 and name == "daily_persistence":
      continue  # at 24 h both baselines forecast the value a day earlier: one line
    forecast = score["predicted"]["forecast"] if "predicted" in score else score["forecast"]
    axis.plot(times, forecast[rows, index], linewidth=1, linestyle="--" if name in BASELINES else "-",
              label=name)
  axis.set_ylabel("PM2.5 (µg/m³)")
  axis.set_title(f"{EXAMPLE_HORIZON}-hour-ahead forecasts, {str(times[0])[:10]} to {str(times[-1])[:10]} "
                 f"(each point: forecast made {EXAMPLE_HORIZON} h earlier)")
  axis.grid(alpha=0.3)
  axis.legend(ncol=4, fontsize=8)
  figure.autofmt_xdate()
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def verdicts(scores: dict, horizons) -> list[str]:
  """The issue's targets, checked on the mean test MAE: each a sentence saying met or not, and where."""
  means = {name: score["mae"].mean(0) for name, score in scores.items()}
  lines = []
  recurrent = [name for name in RECURRENT if name in means]
  for name in ("transformer", "transformer_encoder"):
    if name not in means or not recurrent:
      continue
    for h_index, horizon in enumerate(horizons):
      if horizon < 24:
        continue
      best = min(recurrent, key=lambda r: means[r][h_index])
      met = means[name][h_index] < means[best][h_index]
      lines.append(f"- {name} vs the best recurrent model ({best}) at {horizon} h: "
                   f"{means[name][h_index]:.1f} vs {means[best][h_index]:.1f} µg/m³ MAE: "
                   f"{'beats it' if met else '**does not beat it**'}.")
  for name in MODELS:
    if name not in means:
      continue
    lost = [f"{h} h ({means[name][i]:.1f} vs {means['persistence'][i]:.1f})" for i, h in enumerate(horizons)
            if h >= 6 and not means[name][i] < means["persistence"][i]]
    lines.append(f"- {name} vs persistence at 6 h and more: " + (
        "beats it at every horizon." if not lost else "**does not beat it** at " + ", ".join(lost) + "."))
  return lines


def recorded_steps(output: str) -> dict[str, int]:
  """Model -> training steps done, from the Runs table of the page already in ``output`` (none: {})."""
  page = report.read_page(output)
  if not page:
    return {}
  rows = report.read_markdown_table(page.split("## Runs", 1)[-1], "model")
  return {row["model"]: int(row["steps done"].split("/")[0]) for row in rows}


def write_results(workdir_root: str, output: str, committed: bool = False, replace_only_longer: bool = False) -> str:
  """Score the runs under ``workdir_root`` and write RESULTS.md and the plots into ``output``; returns the page.

  With ``replace_only_longer``, a model whose row in ``output``'s page records more training steps than its run
  now has is refused (``report.check_replacements``) before anything is written.
  """
  os.makedirs(output, exist_ok=True)
  scores, runs, not_run, minutes, steps_done = {}, [], [], {}, {}
  task = None
  for variant in MODELS:
    workdir = os.path.join(workdir_root, variant)
    if not os.path.isdir(os.path.join(workdir, "checkpoints")) or not os.listdir(os.path.join(workdir,
                                                                                            "checkpoints")):
      not_run.append(f"- {variant}: not run yet: `{run_command(variant)}`")
      continue
    score = score_run(workdir)
    task = score["task"]
    records = read_metrics(workdir)
    last = [r for r in records if "wall_seconds" in r][-1]
    speeds = [r["train/steps_per_second"] for r in records if "train/steps_per_second" in r][1:]
    total = score["config"].num_train_steps
    status = "finished" if last["step"] >= total else f"**partial** (stopped at step {last['step']} of {total})"
    scores[variant] = score
    minutes[variant] = last["wall_seconds"] / 60
    steps_done[variant] = last["step"]
    runs.append([variant, score["config"].num_seeds, f"{last['step']} / {total}", score["step"], status,
                 f"{last['wall_seconds'] / 60:.1f} min", f"{np.median(speeds):.1f}" if speeds else "-",
                 f"`{run_command(variant, score['config'])}`"])
  if task is None:
    raise SystemExit(f"error: no run with checkpoints under {workdir_root}; train first:\n" + "\n".join(not_run))
  if replace_only_longer:
    report.check_replacements(os.path.join(output, "RESULTS.md"), recorded_steps(output), steps_done)
  horizons = list(task.horizons)
  baselines = score_baselines(task)
  everything = {**baselines, **scores}

  def table(metric):
    header = ["model"] + [f"{h} h" for h in horizons] + ["seeds"]
    rows = [[name] + [mean_std(score[metric][:, i]) for i in range(len(horizons))] + [len(score[metric])]
            for name, score in everything.items()]
    return report.markdown_table(header, rows)

  plot_errors(everything, horizons, os.path.join(output, "error_by_horizon.png"))
  plot_example(everything, horizons, os.path.join(output, "example_forecast.png"))
  origins = task.series.times[task.windows("test").origins]
  unscored = {name: b["unscored"] for name, b in baselines.items() if b["unscored"]}
  flag = " --update_committed" if committed else ""
  page = f"""# Beijing PM2.5 forecasting

Written by `TRANSFORMER_DATA_DIR=../shared/data python -m experiments.beijing_pm25_results
--workdir_root={workdir_root}{flag}`; do not edit by hand.

Machine: {report.machine_description()} (shared with other jobs while these ran).

Task: pm2.5 at {", ".join(map(str, horizons))} hours after the forecast origin, from the {task.input_length} hours
up to it (pm2.5, weather, wind direction, time of day/week/year). Trained on 2010-2012, best checkpoint by
validation MAE on 2013, scored on every target hour that was measured of the {len(origins):,} test windows
inside 2014 (origins {origins[0]} to {origins[-1]}). MAE and RMSE in µg/m³, mean ± standard deviation over the
seeds of each run (trained together, vmapped; the standard deviation is over seeds, not the uncertainty of the
test estimate). Persistence: the last measured value; daily persistence: the same hour one day earlier (two days
for 48 h); no training.
{f"Baseline targets left unscored for want of an earlier measurement: {unscored}." if unscored else ""}

## MAE (µg/m³) on 2014, by horizon

{table("mae")}

## RMSE (µg/m³) on 2014, by horizon

{table("rmse")}

## Targets

{chr(10).join(verdicts(everything, horizons))}
- Training time (all seeds of a run together, on this shared machine): at most 15 minutes per model:
  {"met" if max(minutes.values()) <= 15 else "**not met**"}, longest {max(minutes, key=minutes.get)}
  ({max(minutes.values()):.1f} min).

## Runs

Wall time: training including compilation, evaluation (every {scores[next(iter(scores))]["config"].eval_every}
steps) and checkpointing, all seeds of the run together.

{report.markdown_table(["model", "seeds", "steps done", "best step (validation MAE)", "status", "wall time",
                        "steps/s (median)", "command"], runs)}
{chr(10).join(["", "Not run yet:", ""] + not_run) if not_run else ""}

![error by horizon](error_by_horizon.png)

![example forecast](example_forecast.png)

## Use

`python launch.py --config=experiments/beijing_pm25.py:gru --workdir=WORKDIR --mode=predict` writes
`WORKDIR/{PREDICTIONS_FILE}` (timestamp = forecast origin, horizon, target_time, forecast, actual, and one
forecast column per seed; `forecast` is their mean). In a notebook:

```python
from transformer import load
model = load("WORKDIR", replica=0)         # one seed's parameters (best checkpoint)
model.forecast(raw_rows)                   # dict of read_csv columns, >= input_length hours, last = origin
model.forecast(features)                   # or prepared features [input_length, 18]; -> [5] ug/m3
```
"""
  return report.write_page(output, page)


def main(argv):
  del argv
  root = _ROOT.value or DEFAULT_ROOT
  output = report.exit_on_user_error(report.results_folder, _OUTPUT, COMMITTED_DIR, os.path.join(root, "results"))
  committed = output == COMMITTED_DIR
  print(report.exit_on_user_error(write_results, root, output, committed,
                                  replace_only_longer=committed and not _OUTPUT.force.value))
  print(f"wrote {output}/RESULTS.md, error_by_horizon.png, example_forecast.png")


if __name__ == "__main__":
  app.run(main)
