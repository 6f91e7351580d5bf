r"""Score the Disaster Tweets runs on the fixed test split and write RESULTS.md and the plots.

    TRANSFORMER_DATA_DIR=... TRANSFORMER_MODELS_DIR=... \
        python -m experiments.disaster_tweets_results --workdir_root=/tmp/dt                # into /tmp/dt/results
    python -m experiments.disaster_tweets_results --workdir_root=/tmp/dt --update_committed   # the repo's page
    python -m experiments.disaster_tweets_results --from_records --update_committed   # the page from records.json

Reads the runs of ``experiments/disaster_tweets.py`` in ``WORKDIR_ROOT/<variant>`` (it trains nothing) and scores
every seed's best checkpoint on the test split. Each row is kept in ``records.json`` beside the page and each
seed's probabilities in ``predictions/<variant>.<split>.csv`` (``experiments.disaster_tweets_scores``), which give
every test metric of the row (``recompute``); the curves are drawn from the runs' metrics alone.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from experiments import disaster_tweets, launching, output_pages, pages, record_store, reruns
from experiments.disaster_tweets_scores import (METRICS, SPLITS, predictions_path, read_predictions, score_run,
                                                score_probabilities, score_values, write_predictions)
from transformer import plot
from transformer.errors import ConfigError, UserError
from transformer.train.workdir import CONFIG, RunDirectory

VARIANTS = ("static_scratch", "static_minilm", "transformer_scratch", "minilm_frozen", "minilm_finetune")
COMMITTED_DIR = os.path.join(record_store.COMMITTED, "disaster_tweets")
# The targets: test F1 of the class "disaster".
TARGETS = {"static_scratch": 0.75, "static_minilm": 0.75, "minilm_finetune": 0.83}
HEADER = ["variant", "seeds", "test F1 (disaster)", "precision", "recall", "accuracy",
          "test F1, threshold chosen on validation (mean of the seeds' thresholds)",
          "test F1 of the seeds' ensemble (95% interval)", "target F1", "validation F1 (chosen step)", "chosen step",
          "training wall time", "command"]
# The columns the committed predictions give (``recompute``); a rerun's page says where they changed.
RECOMPUTED_COLUMNS = (*HEADER[2:9], "validation F1 (chosen step)")
TEMPLATE = pages.read_template("disaster_tweets/page_template.md")  # the page's prose


def training_command(variant: str, workdir: str | None = None) -> str:
  """The command that trains ``variant`` (``output_pages.training_command``)."""
  return output_pages.training_command("experiments/disaster_tweets.py", variant, disaster_tweets.get_config, workdir)


def recompute(folder: str, variant: str, record: dict) -> dict | None:
  """The row's values its committed predictions give (``score_values``); None without them."""
  probabilities = read_predictions(folder, variant)
  return None if probabilities is None else score_values(score_probabilities(probabilities))


def predictions_section(folder: str, commands: dict[str, str]) -> str:
  """Markdown section: where each row's per-seed predictions are, or that they are not committed and how to make
  them; ``commands``: variant -> its training command."""
  lines = []
  for variant, command in commands.items():
    paths = [os.path.relpath(predictions_path(folder, variant, split), folder) for split in SPLITS]
    lines.append(f"- `{variant}`: " + (", ".join(f"`{path}`" for path in paths)
                 if all(os.path.exists(os.path.join(folder, path)) for path in paths) else
                 f"not committed (the run's workdir is gone): train it with `{command}`, then this script writes "
                 f"`{paths[0]}`"))
  return TEMPLATE["predictions"].substitute(files="\n".join(lines)) + "\n"


def published_section() -> str:
  """Markdown section: the seed experiment's published F1 (quoted in the template) and why it is not comparable."""
  return TEMPLATE["published"].substitute() + "\n"


def mean_std(summary: dict) -> str:
  """``0.812 ± 0.004`` (sample standard deviation over seeds), or the value alone for one seed."""
  return f"{summary['mean']:.3f} (1 seed)" if summary["std"] is None else (
      f"{summary['mean']:.3f} ± {summary['std']:.3f}")


def row(variant: str, record: dict) -> list:
  """The cells of the row ``variant`` of the table (``HEADER``)."""
  values = record["values"]
  target = TARGETS.get(variant)
  f1, tuned_f1, ensemble_f1 = values["f1"]["mean"], values["tuned_f1"]["mean"], values["ensemble_f1"]

  def met(value):
    return "met" if value >= target else "not met"
  return [
      variant, values["seeds"], *(mean_std(values[name]) for name in METRICS),
      f"{mean_std(values['tuned_f1'])} ({values['threshold']:.2f})",
      "{:.3f} ({:.3f}-{:.3f})".format(ensemble_f1, *values["ensemble_interval"]),
      "" if target is None else (f"{target:.2f}: argmax {met(f1)}, threshold {met(tuned_f1)} (means), "
                                 f"ensemble {met(ensemble_f1)}"),
      "" if values["validation_f1"] is None else f"{values['validation_f1']:.3f}",
      f"{values['chosen_step']} of {values['num_train_steps']}"
      + ("" if record["steps"] >= values["num_train_steps"] else " (stopped early)"),
      f"{values['wall_seconds'] / 60:.1f} min", f"`{record['command']}`"]


def plot_confusion_matrices(store: record_store.RecordStore, names: list[str], path: str) -> None:
  """One panel per row ``names`` of ``store``: its test confusion counts, summed over its seeds."""
  with plot.figure(path, 1, len(names), (3.4 * len(names), 3.3)) as (_, axes):
    for axis, variant in zip(axes[0], names):
      counts, seeds = store[variant]["values"]["confusion"], store[variant]["values"]["seeds"]
      matrix = np.array([[counts[name] for name in row] for row in (("tn", "fp"), ("fn", "tp"))])
      axis.imshow(matrix, cmap="Blues")
      for (row, column), value in np.ndenumerate(matrix):
        axis.text(column, row, str(value), ha="center", va="center",
                  color="white" if value > matrix.max() / 2 else "black")
      axis.set_xticks([0, 1], ["not disaster", "disaster"])
      axis.set_yticks([0, 1], ["not disaster", "disaster"])
      axis.set(xlabel="predicted", ylabel="true")
      axis.set_title(f"{variant}\n({f'{seeds} seeds summed' if seeds > 1 else '1 seed'})", fontsize=9)


def collect(store: record_store.RecordStore, folder: str, args, not_scored: dict[str, str]) -> None:
  """Score each variant's run under ``--workdir_root`` into its record, its predictions and the curves;
  ``not_scored``: variant -> why a run there was not scored (for the page)."""
  workdir_root = args.workdir_root
  workdirs = {variant: os.path.join(workdir_root, variant) for variant in VARIANTS
              if RunDirectory(os.path.join(workdir_root, variant)).has(CONFIG)}
  if not workdirs:  # a mistyped root would otherwise rewrite the page from the records alone, silently
    raise UserError(f"--workdir_root={workdir_root} holds no run of {', '.join(VARIANTS)} (a folder "
                           "<root>/<variant> with config.json); give the root of the runs, or --from_records.")
  store.check({variant: launching.run_metrics(workdir).last_step  # before scoring
               for variant, workdir in workdirs.items()})
  curves = {}
  for variant, workdir in workdirs.items():
    command = training_command(variant, workdir)
    try:
      result = score_run(workdir)
    except ConfigError as error:  # started, no checkpoint yet
      not_scored[variant] = f"started, not scored ({error}): `{command}`"
      continue
    values = {"seeds": len(result["seeds"]), **score_values(result), "validation_f1": result["validation_f1"],
              "chosen_step": int(result["step"]), "num_train_steps": result["config"].num_train_steps,
              "wall_seconds": result["wall_seconds"], "workdir_root": workdir_root, "conditions": args.conditions}
    output_pages.add_row(store, variant, result["last_step"], command, values, row, HEADER, RECOMPUTED_COLUMNS,
                         workdir=workdir)
    write_predictions(folder, variant, result["probabilities"])
    curves[variant] = result["records"]
  if curves:
    plot.plot_curves(curves, ["train/loss", "eval/f1"], os.path.join(folder, "curves.png"),
                     "Disaster Tweets: training loss and validation F1")


def render(store: record_store.RecordStore, folder: str, args, not_scored: dict[str, str]) -> str:
  """The page's markdown (its confusion matrices drawn first)."""
  names = list(store)
  if names:
    plot_confusion_matrices(store, names, os.path.join(folder, "confusion_matrices.png"))
  pending = "\n".join(f"- `{variant}`: " + not_scored.get(variant, f"`{training_command(variant)}`")
                      for variant in VARIANTS if variant not in store) or "- none"
  heading = output_pages.heading("Disaster Tweets (Kaggle nlp-getting-started)", store, "disaster_tweets_results",
                                 " --update_committed" if args.update_committed else "")
  folders = ", ".join(f"`{root}`" for root in store.distinct(names, "workdir_root"))
  conditions = " ".join(store.distinct(names, "conditions"))
  return TEMPLATE["page"].substitute(
      heading=heading, folders=folders, conditions=conditions,
      table=pages.markdown_table(HEADER, [row(name, store[name]) for name in names]),
      confusion_matrices=pages.image(folder, "confusion_matrices.png", "confusion matrices"),
      curves=pages.image(folder, "curves.png", "training loss and validation F1"),
      predictions=predictions_section(folder, {name: store[name]["command"] for name in names}),
      reruns=reruns.section(store, names), published=published_section(), pending=pending,
      runs_not_kept=pages.runs_not_kept(COMMITTED_DIR))


def main(argv=None) -> str:
  """The page's text (``output_pages.make_page``)."""
  parser = pages.results_parser(__doc__, "WORKDIR_ROOT/results", default_root="/tmp/dt")
  parser.add_argument("--conditions", default="", help="What else the machine ran during the runs (their wall "
                      "times depend on it), printed on the page.")
  not_scored = {}  # variant -> why its run was not scored: collect finds it, render prints it
  return output_pages.make_page(parser, argv, COMMITTED_DIR, functools.partial(collect, not_scored=not_scored),
                                functools.partial(render, not_scored=not_scored))


if __name__ == "__main__":
  main()
