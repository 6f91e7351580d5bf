"""Train the three synthetic variants and write experiments/synthetic/RESULTS.md and curves.png.

    python -m experiments.synthetic_results --workdir_root=/tmp/synthetic

Runs that already finished in ``workdir_root`` are not retrained (the launch resumes, and has nothing to do).
"""
from __future__ import annotations

import os

import numpy as np
from absl import app, flags

from experiments import report
from transformer.train.writers import read_metrics

_ROOT = flags.DEFINE_string("workdir_root", "/tmp/synthetic", "Where the runs' workdirs go.")
VARIANTS = ("copy", "reverse", "sort")
OUTPUT = os.path.join(report.REPO, "experiments", "synthetic")


def main(argv):
  del argv
  os.makedirs(OUTPUT, exist_ok=True)
  rows, runs = [], {}
  for variant in VARIANTS:
    workdir = os.path.join(_ROOT.value, variant)
    command = report.launch(f"experiments/synthetic.py:{variant}", workdir)
    records = read_metrics(workdir)
    runs[variant] = records
    final = [r for r in records if "eval/exact_match" in r][-1]
    reached = report.first_reaching(records, "eval/exact_match", 0.99)
    speeds = [r["train/steps_per_second"] for r in records if "train/steps_per_second" in r][1:]
    tokens = [r["train/tokens_per_second"] for r in records if "train/tokens_per_second" in r][1:]
    rows.append([
        variant, final["step"], f"{final['eval/exact_match']:.4f}", f"{final['eval/token_accuracy']:.4f}",
        f"step {reached['step']}, {reached['wall_seconds']:.0f} s" if reached else "not reached",
        f"{final['wall_seconds']:.0f} s", f"{np.median(speeds):.1f}", f"{np.median(tokens):,.0f}",
        f"`{report.command_line(command)}`"])
  report.plot_curves(runs, ["train/loss", "eval/exact_match"], os.path.join(OUTPUT, "curves.png"),
                     "Synthetic tasks: small encoder-decoder (2+2 layers, d_model 64)")
  table = report.markdown_table(
      ["task", "steps", "exact match (512 held-out)", "token accuracy", "first >= 99% exact match",
       "total wall time", "steps/s (median)", "tokens/s (median)", "command"], rows)
  with open(os.path.join(OUTPUT, "RESULTS.md"), "w") as f:
    f.write(f"""# Synthetic sequence tasks

Written by `python -m experiments.synthetic_results --workdir_root={_ROOT.value}`; do not edit by hand.

Machine: {report.machine_description()}.

Exact match: greedy decoding (key/value cache) of 512 held-out sequences of 1-12 symbols, every token and
the end-of-sequence right. Wall time includes compilation, evaluation (every 500 steps) and checkpointing;
tokens/s counts non-padding source and target tokens.

{table}

![training curves](curves.png)
""")
  print(open(os.path.join(OUTPUT, "RESULTS.md")).read())


if __name__ == "__main__":
  app.run(main)
