"""Train the three synthetic variants and write their results page: RESULTS.md and curves.png.

    python -m experiments.synthetic_results --workdir_root=/tmp/synthetic

Runs that already finished in ``workdir_root`` are not retrained (the launch resumes, and has nothing to do).
The page holds only the rows of this invocation (one per task). It goes to ``--output_dir``, by default
``<workdir_root>/results/`` (printed at the end); the committed page ``experiments/synthetic/`` is written only
with ``--update_committed``, and then only when no task trained fewer steps than the committed row records
(its ``steps`` column), unless ``--force``.
"""
from __future__ import annotations

import os

import numpy as np
from absl import app

from experiments import report
from transformer.train.writers import read_metrics

_ROOT = report.workdir_root_flag()  # default /tmp/synthetic
DEFAULT_ROOT = "/tmp/synthetic"
_OUTPUT = report.output_flags()  # --output_dir, --update_committed, --force
VARIANTS = ("copy", "reverse", "sort")
HEADER = ["task", "steps", "exact match (512 held-out)", "token accuracy", "first >= 99% exact match",
          "total wall time", "steps/s (median)", "tokens/s (median)", "command"]


def row(variant: str, records: list[dict], command: list[str]) -> list:
  """The table row of one run from its metric records."""
  final = [r for r in records if "eval/exact_match" in r][-1]
  reached = report.first_reaching(records, "eval/exact_match", 0.99)
  speeds = [r["train/steps_per_second"] for r in records if "train/steps_per_second" in r][1:]
  tokens = [r["train/tokens_per_second"] for r in records if "train/tokens_per_second" in r][1:]
  return [
      variant, final["step"], f"{final['eval/exact_match']:.4f}", f"{final['eval/token_accuracy']:.4f}",
      f"step {reached['step']}, {reached['wall_seconds']:.0f} s" if reached else "not reached",
      f"{final['wall_seconds']:.0f} s", f"{np.median(speeds):.1f}", f"{np.median(tokens):,.0f}",
      f"`{report.command_line(command)}`"]


def write_results(output: str, runs: dict[str, tuple[list[dict], list[str]]], workdir_root: str, *,
                  replace_only_longer: bool = False) -> str:
  """Writes ``output/RESULTS.md`` and ``output/curves.png`` from ``runs`` (task -> (metric records, launch
  command)); returns the page's text.

  Args:
    replace_only_longer: refuse (``UserError``, before anything is written) when a task trained fewer steps than
      the page in ``output`` records for it: for the committed page.
  """
  rows = [row(variant, records, command) for variant, (records, command) in runs.items()]
  if replace_only_longer:
    report.check_replacements(os.path.join(output, "RESULTS.md"), report.recorded_steps(output, "task"),
                              {cells[0]: cells[1] for cells in rows})
  os.makedirs(output, exist_ok=True)
  report.plot_curves({variant: records for variant, (records, _) in runs.items()},
                     ["train/loss", "eval/exact_match"], os.path.join(output, "curves.png"),
                     "Synthetic tasks: small encoder-decoder (2+2 layers, d_model 64)")
  text = f"""# Synthetic sequence tasks

Written by `python -m experiments.synthetic_results --workdir_root={workdir_root}`; do not edit by hand.

Machine: {report.machine_description()}.

Exact match: greedy decoding (key/value cache) of 512 held-out sequences of 1-12 symbols, every token and
the end-of-sequence right. Wall time includes compilation, evaluation (every 500 steps) and checkpointing;
tokens/s counts non-padding source and target tokens.

{report.markdown_table(HEADER, rows)}

![training curves](curves.png)
"""
  return report.write_page(output, text)


def main(argv):
  del argv
  root = _ROOT.value or DEFAULT_ROOT
  committed = os.path.join(report.COMMITTED, "synthetic")
  output = report.exit_on_user_error(report.results_folder, _OUTPUT, committed,
                                     os.path.join(root, "results"))
  runs = {}
  for variant in VARIANTS:
    workdir = os.path.join(root, variant)
    command = report.exit_on_user_error(report.launch, f"experiments/synthetic.py:{variant}", workdir)
    runs[variant] = (read_metrics(workdir), command)
  print(report.exit_on_user_error(write_results, output, runs, root,
                                  replace_only_longer=output == committed and not _OUTPUT.force.value))
  print(f"Wrote the page to {output}/RESULTS.md")


if __name__ == "__main__":
  app.run(main)
