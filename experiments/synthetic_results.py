"""Train the three synthetic variants and write their results page: RESULTS.md and curves.png.

    python -m experiments.synthetic_results --workdir_root=/tmp/synthetic
    python -m experiments.synthetic_results --from_records --update_committed   # the page from records.json

Finished runs in ``workdir_root`` are not retrained (the launch resumes). Each task's row is kept in
``records.json`` beside the page, which goes to ``--output_dir`` (default ``<workdir_root>/results/``) or, with
``--update_committed``, to ``experiments/synthetic/`` (where no task may train fewer steps than its row, unless
``--force``). The curves are drawn from the runs' metrics: ``--from_records`` leaves ``curves.png`` as it is.
"""
from __future__ import annotations

import os


from experiments import launching, pages, record_store
from transformer import plot
from experiments.synthetic import get_config
from transformer.train.run_directory import MetricsLog, read_metrics

VARIANTS = ("copy", "reverse", "sort")
HEADER = ["task", "steps", "exact match (512 held-out)", "token accuracy", "first >= 99% exact match",
          "total wall time", "steps/s (median)", "tokens/s (median)", "command"]


def record_values(records: list[dict], workdir_root: str) -> dict:
  """What a task's row shows, from its run's metric records."""
  final = [r for r in records if "eval/exact_match" in r][-1]
  reached = launching.first_reaching(records, "eval/exact_match", 0.99)
  metrics = MetricsLog(tuple(records))
  return {"exact_match": final["eval/exact_match"], "token_accuracy": final["eval/token_accuracy"],
          "reached": reached and {"step": reached["step"], "wall_seconds": reached["wall_seconds"]},
          "wall_seconds": final["wall_seconds"], "steps_per_second": metrics.median_rate(),
          "tokens_per_second": metrics.median_rate("train/tokens_per_second"), "workdir_root": workdir_root}


def row(name: str, record: dict) -> list:
  values, reached = record["values"], record["values"]["reached"]
  return [name, record["steps"], f"{values['exact_match']:.4f}", f"{values['token_accuracy']:.4f}",
          f"step {reached['step']}, {reached['wall_seconds']:.0f} s" if reached else "not reached",
          f"{values['wall_seconds']:.0f} s", f"{values['steps_per_second']:.1f}",
          f"{values['tokens_per_second']:,.0f}", f"`{record['command']}`"]


def collect(store: record_store.RecordStore, folder: str, workdir_root: str) -> None:
  """Train (or resume) each variant under ``workdir_root``, record its row and draw ``folder/curves.png``."""
  store.check({variant: get_config(variant).num_train_steps for variant in VARIANTS})  # before training
  runs = {}
  for variant in VARIANTS:
    workdir = os.path.join(workdir_root, variant)
    command = launching.launch(f"experiments/synthetic.py:{variant}", workdir)
    runs[variant] = read_metrics(workdir)
    store.add(variant, steps=runs[variant][-1]["step"], command=launching.command_line(command),
              machine=record_store.machine_description(), values=record_values(runs[variant], workdir_root))
  plot.plot_curves(runs, ["train/loss", "eval/exact_match"], os.path.join(folder, "curves.png"),
                     "Synthetic tasks: small encoder-decoder (2+2 layers, d_model 64)")


def render(store: record_store.RecordStore, folder: str) -> str:
  names = list(store)
  roots = store.distinct(names, "workdir_root")
  written_by = " and ".join(f"`python -m experiments.synthetic_results --workdir_root={root}`" for root in roots)
  machines = "; ".join(store.distinct(names))
  return f"""# Synthetic sequence tasks

Written by {written_by}; do not edit by hand.

Machine: {machines}.

Exact match: greedy decoding (key/value cache) of 512 held-out sequences of 1-12 symbols, every token and
the end-of-sequence right. Wall time includes compilation, evaluation (every 500 steps) and checkpointing;
tokens/s counts non-padding source and target tokens.

{pages.markdown_table(HEADER, [row(name, store[name]) for name in names])}

{pages.image(folder, "curves.png", "training curves")}
"""


def main(argv=None) -> str:
  parser = pages.results_parser(__doc__, "WORKDIR_ROOT/results", default_root="/tmp/synthetic")
  args = parser.parse_args(argv)
  return pages.make_page(args, os.path.join(record_store.COMMITTED, "synthetic"),
                          os.path.join(args.workdir_root, "results"),
                          lambda store, folder: collect(store, folder, args.workdir_root), render)


if __name__ == "__main__":
  main()
