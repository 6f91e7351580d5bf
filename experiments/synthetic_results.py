"""Train the three synthetic variants and write their results page: RESULTS.md and curves.png.

    python -m experiments.synthetic_results --workdir_root=/tmp/synthetic
    python -m experiments.synthetic_results --from_records --update_committed   # the page from records.json

Finished runs in ``workdir_root`` are not retrained (the launch resumes). Each task's row is kept in
``records.json`` beside the page; its final checkpoint's outputs on the held-out set, in ``outputs/<task>.tsv``,
give its exact match and token accuracy (``recompute``), its training log in ``logs/<task>.jsonl`` the rest
(``log_values``). ``--from_records`` leaves ``curves.png`` and the outputs
as they are.
"""
from __future__ import annotations

import os

from experiments import launching, output_pages, pages, record_store, reruns
from experiments.synthetic import VARIANTS, get_config
from transformer import plot
from transformer.tasks.synthetic import outputs_metrics, read_outputs
from transformer.train.workdir import MetricsLog

HEADER = ["task", "steps", "exact match (512 held-out)", "token accuracy", "first >= 99% exact match",
          "total wall time", "steps/s (median)", "tokens/s (median)", "command"]
# The columns the committed outputs give (``recompute``); a rerun's page says where they changed.
RECOMPUTED_COLUMNS = ("exact match (512 held-out)", "token accuracy")
HEADLINE_COLUMNS = (*RECOMPUTED_COLUMNS, "first >= 99% exact match")
OUTPUTS = "outputs"  # beside the page: <task>.tsv, the final checkpoint's outputs on the held-out set
TEMPLATE = pages.read_template("synthetic/page_template.md")  # the page's prose


def outputs_path(folder: str, name: str) -> str:
  return os.path.join(folder, OUTPUTS, f"{name}.tsv")


def write_outputs(folder: str, name: str, workdir: str, step: int) -> dict:
  """The held-out outputs of the run's checkpoint at ``step`` (its last) into ``outputs_path``; their metrics."""
  import transformer
  model = transformer.load(workdir, checkpoint=step)
  os.makedirs(os.path.join(folder, OUTPUTS), exist_ok=True)
  return model.task.write_outputs(model.model_config, model.params, outputs_path(folder, name))


def recompute(folder: str, name: str, record: dict) -> dict | None:
  """The row's values that its committed outputs give (``exact_match``, ``token_accuracy``); None without them."""
  path = outputs_path(folder, name)
  return outputs_metrics(read_outputs(path)) if os.path.exists(path) else None


def log_values(log: MetricsLog) -> dict:
  """The row's values its training log gives (``experiments.verify`` recomputes them from the committed log): the
  last step, the final evaluation's exact match and token accuracy as logged, the first evaluation reaching 99%
  exact match, the wall time and the median rates."""
  evaluations = [record for record in log.records if "eval/exact_match" in record]
  final, reached = evaluations[-1], launching.first_reaching(evaluations, "eval/exact_match", 0.99)
  return {"steps": log.records[-1]["step"],
          "logged": {"exact_match": final["eval/exact_match"], "token_accuracy": final["eval/token_accuracy"]},
          "reached": reached and {"step": reached["step"], "wall_seconds": reached["wall_seconds"]},
          "wall_seconds": final["wall_seconds"], "steps_per_second": log.median_rate(),
          "tokens_per_second": log.median_rate("train/tokens_per_second")}


def row(name: str, record: dict) -> list:
  """The cells of the row ``name`` of the table (``HEADER``)."""
  values, reached = record["values"], record["values"]["reached"]
  return [name, record["steps"], f"{values['exact_match']:.4f}", f"{values['token_accuracy']:.4f}",
          f"step {reached['step']}, {reached['wall_seconds']:.0f} s" if reached else "not reached",
          f"{values['wall_seconds']:.0f} s", f"{values['steps_per_second']:.1f}",
          f"{values['tokens_per_second']:,.0f}", f"`{record['command']}`"]


def collect(store: record_store.RecordStore, folder: str, args) -> None:
  """Train (or resume) each variant under ``--workdir_root``, record its row and draw ``folder/curves.png``: exact
  match and token accuracy from the final checkpoint's outputs (as its final evaluation logged them too), the rest
  from the run's metric records."""
  store.check({variant: get_config(variant).num_train_steps for variant in VARIANTS})  # before training
  runs = {}
  for variant in VARIANTS:
    workdir = os.path.join(args.workdir_root, variant)
    command = launching.launch(f"experiments/synthetic.py:{variant}", workdir)
    log = launching.run_metrics(workdir)
    runs[variant], from_log = list(log.records), log_values(log)
    steps = from_log.pop("steps")
    store.check({variant: steps})  # before its outputs replace the row's
    outputs = write_outputs(folder, variant, workdir, steps)
    values = {"exact_match": outputs["exact_match"], "token_accuracy": outputs["token_accuracy"], **from_log,
              "workdir_root": args.workdir_root}
    output_pages.add_row(store, variant, steps, launching.command_line(command), values, row, HEADER, HEADLINE_COLUMNS,
                         workdir=workdir)
  plot.plot_curves(runs, ["train/loss", "eval/exact_match"], os.path.join(folder, "curves.png"),
                   "Synthetic tasks: small encoder-decoder (2+2 layers, d_model 64)")


def render(store: record_store.RecordStore, folder: str, args) -> str:
  """The page's markdown."""
  names = list(store)
  return TEMPLATE["page"].substitute(
      heading=output_pages.heading("Synthetic sequence tasks", store, "synthetic_results"), outputs=OUTPUTS,
      table=pages.markdown_table(HEADER, [row(name, store[name]) for name in names]),
      curves=pages.image(folder, "curves.png", "training curves"), reruns=reruns.section(store, names))


def main(argv=None) -> str:
  """The page's text (``output_pages.make_page``)."""
  parser = pages.results_parser(__doc__, "WORKDIR_ROOT/results", default_root="/tmp/synthetic")
  return output_pages.make_page(parser, argv, os.path.join(record_store.COMMITTED, "synthetic"), collect, render)


if __name__ == "__main__":
  main()
