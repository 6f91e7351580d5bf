"""Score the Beijing PM2.5 runs and the persistence baselines on 2014 (test); write RESULTS.md, plots, forecasts.

    TRANSFORMER_DATA_DIR=../shared/data python -m experiments.beijing_pm25_results --workdir_root=/tmp/pm25
    ... --update_committed      # into experiments/beijing_pm25/ (else --output_dir, default <root>/results)
    python -m experiments.beijing_pm25_results --from_records --update_committed   # no runs, no data needed

Reads the runs ``<workdir_root>/<variant>-<hours>h`` (nothing is trained here) and keeps per model the input window of
lowest validation MAE (2013), whose seeds forecast the test windows every run has (``forecasts_2014.npz``); runs on
other inputs than published (``...h-pm25_only``, ``...h-all_inputs``) are never kept, they forecast the same windows
into ``forecasts_2014_equal_inputs.npz``. Every run's seeds forecast its own validation windows, whose absolute
errors go into ``errors_validation.npz`` (the rows recorded before keep theirs), which gives the validation MAEs.
With each run's row (``records.json``) these give every number and plot of the page, all that ``--from_records``
reads (a new folder: the committed ones). Prose: beijing_pm25/page_template.md.
"""
from __future__ import annotations

import os

import numpy as np

from experiments import pages, record_store, reruns, stats
from experiments.beijing_pm25 import RECURRENT, TRANSFORMERS, WINDOW_CANDIDATES
from experiments.beijing_pm25_forecasts import (
    BASELINES, COMMITTED_DIR, EQUAL_INPUTS_FILE, FORECASTS_FILE, VALIDATION_FILE, equal_inputs_data, forecasts_path,
    load_forecasts)
from experiments.beijing_pm25_scores import (
    BOOTSTRAP_BLOCK_HOURS, BOOTSTRAP_RESAMPLES, MODELS, RESAMPLING_SEEDS, best_of, better_at, equal_input_pairs,
    equal_input_runs, kept_windows, largest_month, logged_validation_rows, paired_comparison, reads_pm25_only,
    record_runs, run_command, run_order, test_metrics, validation_maes)
from transformer import plot
from transformer.tasks.forecasting import PREDICTIONS_FILE

# The models of Shi, Jain & Narasimhan (2022), whose ranking the page tests: all read every feature of an hour.
STYLE_2017 = RECURRENT + ("transformer", "transformer_encoder")
TEMPLATE = pages.read_template("beijing_pm25/page_template.md")
EXAMPLE_HORIZONS = (6, 48)  # hours ahead in the forecast figure
EXAMPLE_DAYS = 14


def comparison_table(rows: list[dict], first: str, second: str) -> tuple[list[str], list[list]]:
  """The header and rows of a table of ``paired_comparison``'s ``rows`` (``first`` against ``second``)."""
  return (["horizon", f"{first} MAE", f"{second} MAE", "difference", "95% interval (weeks resampled)",
           "beyond the interval", "Welch's t over seeds", "seeds' forecasts averaged first: difference (95% interval)"],
          [[f"{row['horizon']} h", f"{row['first']:.1f}", f"{row['second']:.1f}", f"{row['difference']:+.1f}",
            f"{row['low']:+.1f} to {row['high']:+.1f}", beyond_cell(row), row["welch"],
            "{:+.1f} ({:+.1f} to {:+.1f})".format(*row["ensemble"])] for row in rows])


def beyond_cell(row: dict) -> str:
  """Who is better beyond the interval at every resampling seed; else at how many seeds, where some say so."""
  if row["better"]:
    return f"**{row['better']} better**"
  named = [name for name in row["better_by_seed"] if name]
  if not named:
    return "no"
  return " and ".join(f"{name} better at {named.count(name)} of {len(row['better_by_seed'])} resampling seeds"
                      for name in sorted(set(named)))


def verdict(rows: list[dict], first: str, second: str, linear_rows: list[dict] | None) -> str:
  """One sentence on the long horizons (24 h and more), with the numbers behind it."""
  def numbers(rows):
    return "; ".join(f"{row['horizon']} h {row['first']:.1f} vs {row['second']:.1f} ({row['difference']:+.1f}, "
                     f"{row['low']:+.1f} to {row['high']:+.1f})" for row in rows if row["horizon"] >= 24)
  long = [row for row in rows if row["horizon"] >= 24]
  won, lost = better_at(long, first, ""), better_at(long, second, "")
  outcome = "won_everywhere" if all(row["better"] == first for row in long) else "won_at" if won else "won_nowhere"
  claim = TEMPLATE[outcome].substitute(second=second, won=won)
  claim += f"; {second} is better beyond it at {lost}" if lost else ""
  sentence = TEMPLATE["verdict"].substitute(first=first, claim=claim, numbers=numbers(rows))
  return sentence + (f"; DLinear against {first}: {numbers(linear_rows)}." if linear_rows else ".")


def comparison_section(data: dict, metrics: dict, transformer: str, recurrent: str) -> str:
  """The verdict, its paired tables and DLinear's, and the comparison of the test year's best where they differ."""
  rows = paired_comparison(data, metrics, transformer, recurrent)
  linear = paired_comparison(data, metrics, "dlinear", transformer) if "dlinear" in metrics else None
  text = TEMPLATE["comparison"].substitute(
      verdict=verdict(rows, transformer, recurrent, linear), transformer=transformer, recurrent=recurrent,
      table=pages.markdown_table(*comparison_table(rows, transformer, recurrent)), family=", ".join(TRANSFORMERS),
      seed_spread=f"{max(row['seed_spread'] for row in rows):.2f}")
  text += "\n"
  if linear:
    text += pages.section(TEMPLATE["linear_caption"].substitute(transformer=transformer),
                          *comparison_table(linear, "dlinear", transformer))
  from_24h = [index for index, horizon in enumerate(data["horizons"]) if horizon >= 24]
  on_test = {name: values["mae"].mean(0)[from_24h].mean() for name, values in metrics.items()}
  first, second = best_of(TRANSFORMERS, on_test), best_of(RECURRENT, on_test)
  if (first, second) == (transformer, recurrent):
    return text
  long = [row for row in paired_comparison(data, metrics, first, second) if row["horizon"] >= 24]
  differences = "; ".join(f"{row['horizon']} h {row['difference']:+.1f} ({row['low']:+.1f} to {row['high']:+.1f})"
                          for row in long)
  return text + "\n" + TEMPLATE["test_year"].substitute(
      first=first, second=second, differences=differences, won=better_at(long, first, "none of these horizons")) + "\n"


def error_table(metrics: dict, metric: str, horizons: list[int], header: list[str], second_column: dict) -> str:
  """A table of ``metric`` by horizon, mean ± std over seeds, a row per model: its name, ``second_column``'s value."""
  rows = [[name, second_column.get(name, "-")] + [stats.mean_std(values, 1) for values in metrics[name][metric].T]
          + [len(metrics[name][metric])] for name in metrics]
  return pages.markdown_table(header + [f"{h} h" for h in horizons] + ["seeds"], rows)


def equal_inputs_section(store: record_store.RecordStore, data: dict, folder: str) -> str:
  """The equal-input runs' test MAE and paired comparisons, each with the month moving its 24 h difference most."""
  data = equal_inputs_data(data, forecasts_path(EQUAL_INPUTS_FILE, folder, COMMITTED_DIR), equal_input_runs(store))
  if not data["forecasts"]:
    return ""
  metrics, kept = test_metrics(data), kept_windows(store)
  runs = {row: store[row]["values"] for row in data["forecasts"]}
  inputs = {row: "pm2.5 alone" if reads_pm25_only(values) else "all 18 features" for row, values in runs.items()}
  windows = "; ".join(f"{row} at {values['hours']} h ({values['wall_seconds'] / 60:.1f} min), not "
                      f"{values['model']}'s kept {kept[values['model']]} h" for row, values in runs.items()
                      if values["hours"] != kept.get(values["model"]))
  table = error_table(metrics, "mae", data["horizons"], ["run", "inputs"], inputs)
  text = TEMPLATE["equal_inputs"].substitute(table=table, windows=windows, forecasts_equal=EQUAL_INPUTS_FILE) + "\n"
  for first, second in equal_input_pairs(store, list(metrics)):
    rows = paired_comparison(data, metrics, first, second)
    month, difference, rest = largest_month(data, first, second, 24)
    text += "\n" + TEMPLATE["equal_pair"].substitute(
        first=first, second=second, first_inputs=inputs[first], second_inputs=inputs[second], month=month,
        first_better=better_at(rows, first), second_better=better_at(rows, second), difference=f"{difference:+.1f}",
        rest=f"{rest:+.1f}", table=pages.markdown_table(*comparison_table(rows, first, second))) + "\n"
  return text


def published_ranking(metrics: dict, horizons: list[int]) -> str:
  """Whether Shi et al.'s ranking holds here: per horizon the transformer's rank by test MAE among their models."""
  compared = [name for name in STYLE_2017 if name in metrics]
  if "transformer" not in compared:
    return ""
  orders = {horizon: sorted(compared, key=lambda name: metrics[name]["mae"].mean(0)[index])
            for index, horizon in enumerate(horizons)}  # by test MAE (mean over seeds), best first
  held = ", ".join(f"{horizon} h" for horizon, order in orders.items() if order[0] == "transformer") or "no horizon"
  ranks = [f"{horizon} h transformer {order.index('transformer') + 1} of {len(order)}"
           + ("" if order[0] == "transformer" else f" ({order[0]} best)") for horizon, order in orders.items()]
  return (f"Here, among their models ({', '.join(compared)}) by test MAE (mean over seeds), their ranking holds "
          f"at {held} (this page has no 3-hour horizon): {'; '.join(ranks)}.")


def plot_errors(metrics: dict, horizons, path: str) -> None:
  """MAE and RMSE against the horizon: one line per model (error bars: std over seeds)."""
  with plot.figure(path, 1, 2, (12, 4.5)) as (drawing, axes):
    for axis, metric in zip(axes[0], ("mae", "rmse")):
      for name, values in metrics.items():
        values = values[metric]
        axis.errorbar(horizons, values.mean(0), yerr=values.std(0, ddof=1) if len(values) > 1 else None,
                      linestyle="--" if name in BASELINES else "-", marker="o", capsize=3, label=name)
      axis.set(xscale="log", xlabel="horizon (hours ahead)", ylabel=f"{metric.upper()} (µg/m³)")
      axis.set_xticks(horizons, [str(h) for h in horizons])
      axis.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    drawing.suptitle("Beijing PM2.5, 2014 (test): error by horizon (mean over seeds)")


def plot_forecasts(data: dict, names: list[str], path: str) -> None:
  """Measured pm2.5 and ``names``' seed-mean forecasts ``EXAMPLE_HORIZONS`` ahead, in the span that varies most."""
  horizons, target_time, measured = data["horizons"], data["target_time"], data["actual"]  # NaN: unmeasured
  first = horizons.index(EXAMPLE_HORIZONS[0])
  span = min(EXAMPLE_DAYS * 24, len(measured))
  start = max(np.arange(0, len(measured) - span + 1, span), key=lambda s: np.nanstd(measured[s:s + span, first]))
  period = target_time[start, first], target_time[start, first] + np.timedelta64(span, "h")
  with plot.figure(path, len(EXAMPLE_HORIZONS), 1, (12, 3.8 * len(EXAMPLE_HORIZONS))) as (drawing, axes):
    for axis, horizon in zip(axes[:, 0], EXAMPLE_HORIZONS):
      index = horizons.index(horizon)
      rows = (target_time[:, index] >= period[0]) & (target_time[:, index] < period[1])
      axis.plot(target_time[rows, index], measured[rows, index], color="black", linewidth=1.5, label="measured")
      for name in names:
        axis.plot(target_time[rows, index], data["forecasts"][name][:, rows, index].mean(0), linewidth=1,
                  linestyle="--" if name in BASELINES else "-", label=name)
      axis.set(ylabel="PM2.5 (µg/m³)", title=f"forecasts made {horizon} h ahead")
      axis.grid(alpha=0.3)
      axis.legend(ncol=4, fontsize=8)
    drawing.suptitle(f"Beijing PM2.5, {str(period[0])[:10]} to {str(period[1])[:10]} (2014, test)")
    drawing.autofmt_xdate()


def window_table(tried: dict[str, dict[int, float]], kept: dict[str, int]) -> str:
  """Validation MAE of each model and window (``validation_maes``: from the committed validation errors where
  they are there); the kept one in bold."""
  windows = sorted({hours for candidates in WINDOW_CANDIDATES.values() for hours in candidates}
                   | {hours for by_hours in tried.values() for hours in by_hours})
  rows = [[name] + [("**{:.2f}**" if hours == kept.get(name) else "{:.2f}").format(tried[name][hours])
                    if hours in tried.get(name, {}) else "-" for hours in windows] for name in MODELS]
  return pages.markdown_table(["model"] + [f"{hours} h" for hours in windows], rows)


def runs_table(store: record_store.RecordStore) -> str:
  """Every run: seeds, steps, best step, status, wall time, speed, command."""
  rows = []
  for run in sorted(store, key=run_order):
    record = store[run]
    values, done, total = record["values"], record["steps"], record["values"]["num_train_steps"]
    status = "finished" if done >= total else f"**partial** (stopped at step {done} of {total})"
    rows.append([run, values["seeds"], f"{done} / {total}", values["best_step"], status,
                 f"{values['wall_seconds'] / 60:.1f} min", f"{values['steps_per_second']:.1f}",
                 f"`{record['command']}`"])
  return pages.markdown_table(["run", "seeds", "steps done", "best step (validation MAE)", "status", "wall time",
                              "steps/s (median)", "command"], rows)


def render(store: record_store.RecordStore, folder: str, committed: bool) -> str:
  """The page (and its plots) from the records and the folder's forecasts, else the committed page's."""
  data = load_forecasts(forecasts_path(FORECASTS_FILE, folder, COMMITTED_DIR))
  metrics, horizons, tried, kept = test_metrics(data), data["horizons"], validation_maes(store), kept_windows(store)
  validation = {name: tried[name][hours] for name, hours in kept.items()}
  transformer, recurrent = best_of(TRANSFORMERS, validation), best_of(RECURRENT, validation)
  both = transformer in metrics and recurrent in metrics
  plot_errors(metrics, horizons, os.path.join(folder, "error_by_horizon.png"))
  plot_forecasts(data, ["persistence"] + [n for n in (recurrent, transformer) if n in metrics],
                 os.path.join(folder, "forecasts_6h_48h.png"))
  not_run = [f"- {name}-{hours}h: `{run_command(name, hours)}`" for name in MODELS
             for hours in WINDOW_CANDIDATES[name] if f"{name}-{hours}h" not in store]
  names, origins = sorted(store, key=run_order), data["origin_time"]
  mae, rmse = (error_table(metrics, metric, horizons, ["model", "input hours"], kept) for metric in ("mae", "rmse"))
  logged = logged_validation_rows(store)  # the rows of no committed validation errors
  logged_note = TEMPLATE["logged"].substitute(rows=", ".join(logged)) if logged else ""
  return TEMPLATE["page"].substitute(
      root=",".join(store.distinct(names, "workdir_root")), flag=" --update_committed" if committed else "",
      machine="; ".join(store.distinct(names)), horizons=", ".join(map(str, horizons)),
      windows=f"{len(origins):,}", first_origin=origins[0], last_origin=origins[-1], mae=mae, rmse=rmse,
      comparison=comparison_section(data, metrics, transformer, recurrent) if both else "",
      equal_inputs=equal_inputs_section(store, data, folder),
      published_ranking=published_ranking(metrics, horizons), window_table=window_table(tried, kept),
      validation_errors=VALIDATION_FILE, logged=logged_note,
      runs=runs_table(store), reruns=reruns.section(store, names), eval_every=", ".join(map(str, store.distinct(names, "eval_every"))),
      not_run="\n".join(["", "Not run yet:", ""] + not_run) if not_run else "",
      predictions=PREDICTIONS_FILE, forecasts=FORECASTS_FILE, num_horizons=len(horizons),
      resamples=f"{BOOTSTRAP_RESAMPLES:,}", resampling_seeds=RESAMPLING_SEEDS,
      block_days=BOOTSTRAP_BLOCK_HOURS // 24) + "\n"


def not_committed(folder: str) -> list[tuple[str, str]]:
  """For ``experiments.verify``, which lists them as not verified: (what, why) of the page's numbers that nothing
  committed in ``folder`` besides ``records.json`` gives: the validation MAEs of the rows of no validation
  forecasts."""
  store = record_store.RecordStore(folder)
  logged = logged_validation_rows(store)
  if not logged:
    return []
  return [(f"the validation MAE of {', '.join(logged)} (input window table)",
           f"their training logs' eval/mae: recorded before {VALIDATION_FILE} was kept, from workdirs since gone "
           f"({', '.join(store.distinct(logged, 'workdir_root'))}); recording their reruns adds them")]


def main(argv=None) -> str:
  args = pages.results_parser(__doc__, "WORKDIR_ROOT/results", default_root="/tmp/pm25").parse_args(argv)
  return pages.make_page(args, COMMITTED_DIR, os.path.join(args.workdir_root, "results"),
                         lambda store, folder: record_runs(store, folder, args.workdir_root),
                         lambda store, folder: render(store, folder, args.update_committed))


if __name__ == "__main__":
  main()
