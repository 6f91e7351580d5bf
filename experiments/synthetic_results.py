"""Train the three synthetic variants and write their results page: RESULTS.md and curves.png.

    python -m experiments.synthetic_results --workdir_root=/tmp/synthetic
    python -m experiments.synthetic_results --from_records --update_committed   # the page from records.json

Finished runs in ``workdir_root`` are not retrained (the launch resumes). Each task's row is kept in
``records.json`` beside the page, which goes to ``--output_dir`` (default ``<workdir_root>/results/``) or, with
``--update_committed``, to ``experiments/synthetic/`` (where no task may train fewer steps than its row, unless
``--force``). Each run's final checkpoint writes the held-out set's outputs (``outputs/<task>.tsv``: sources,
targets, greedy predictions, teacher-forced token counts), from which the row's exact match and token accuracy are
computed (and ``python -m experiments.verify`` recomputes them). The curves are drawn from the runs' metrics:
``--from_records`` leaves ``curves.png`` and the outputs as they are.
"""
from __future__ import annotations

import os


from experiments import launching, pages, record_store, reruns
from transformer import plot
from experiments.synthetic import get_config
from transformer.tasks.synthetic import outputs_metrics, read_outputs
from transformer.train.run_directory import MetricsLog, read_metrics

VARIANTS = ("copy", "reverse", "sort")
HEADER = ["task", "steps", "exact match (512 held-out)", "token accuracy", "first >= 99% exact match",
          "total wall time", "steps/s (median)", "tokens/s (median)", "command"]
# The columns the committed outputs give (``recompute``); a rerun's page says where they changed.
RECOMPUTED_COLUMNS = ("exact match (512 held-out)", "token accuracy")
HEADLINE_COLUMNS = (*RECOMPUTED_COLUMNS, "first >= 99% exact match")
OUTPUTS = "outputs"  # beside the page: <task>.tsv, the final checkpoint's outputs on the held-out set


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
  del record
  path = outputs_path(folder, name)
  return outputs_metrics(read_outputs(path)) if os.path.exists(path) else None


def record_values(records: list[dict], workdir_root: str, outputs: dict) -> dict:
  """What a task's row shows: exact match and token accuracy from the final checkpoint's ``outputs`` (as logged
  by its final evaluation too), the rest from its run's metric records."""
  final = [r for r in records if "eval/exact_match" in r][-1]
  reached = launching.first_reaching(records, "eval/exact_match", 0.99)
  metrics = MetricsLog(tuple(records))
  return {"exact_match": outputs["exact_match"], "token_accuracy": outputs["token_accuracy"],
          "logged": {"exact_match": final["eval/exact_match"], "token_accuracy": final["eval/token_accuracy"]},
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
    steps = runs[variant][-1]["step"]
    store.check({variant: steps})  # before its outputs replace the row's
    outputs = write_outputs(folder, variant, workdir, steps)
    record = {"steps": steps, "command": launching.command_line(command), "machine": record_store.machine_description(),
              "values": record_values(runs[variant], workdir_root, outputs)}
    record["values"]["reruns"] = reruns.history(store.records.get(variant), record, variant, row, HEADER,
                                                HEADLINE_COLUMNS)
    store.add(variant, **record)
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
the end-of-sequence right; token accuracy: the target tokens the teacher-forced model ranks first. Both are of
the final checkpoint, computed from its outputs in `{OUTPUTS}/<task>.tsv` (source, target and prediction as token
ids, and the teacher-forced counts), which `python -m experiments.verify` recomputes them from. Wall time includes compilation, evaluation (every 500 steps) and checkpointing;
tokens/s counts non-padding source and target tokens.

{pages.markdown_table(HEADER, [row(name, store[name]) for name in names])}

{pages.image(folder, "curves.png", "training curves")}

{reruns.section(store, names)}"""


def main(argv=None) -> str:
  parser = pages.results_parser(__doc__, "WORKDIR_ROOT/results", default_root="/tmp/synthetic")
  args = parser.parse_args(argv)
  return pages.make_page(args, os.path.join(record_store.COMMITTED, "synthetic"),
                         os.path.join(args.workdir_root, "results"),
                         lambda store, folder: collect(store, folder, args.workdir_root), render)


if __name__ == "__main__":
  main()
