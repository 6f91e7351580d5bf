"""Draw a run's ``metrics.jsonl`` as curves, to a PNG beside it.

    python -m experiments.plot WORKDIR                       # WORKDIR/curves.png: loss and every eval metric
    python -m experiments.plot WORKDIR OTHER_WORKDIR --metrics=train/loss,eval/bleu --output=/tmp/compare.png
    python /path/to/repo/experiments/plot.py WORKDIR         # the same from any directory (the end-of-run hint)

Several workdirs give one line each per panel; up to 4 panels a row. A sweep's variants (``config.sweep``:
metrics logged as ``NAME/variant_v``) are lines of the same panels, one per variant. For live curves, TensorBoard
reads the same run: ``pip install -e ".[tensorboard]"`` then ``tensorboard --logdir WORKDIR/tensorboard``.
"""
from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__" and not __package__:  # run by its path (the end-of-run hint), from any directory
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the root holds `experiments`

from experiments import report
from transformer.train.run_directory import METRICS, RunDirectory, read_metrics

VARIANT = "/variant_"  # a sweep's per-variant metrics: NAME/variant_v (transformer/train/loop.py)


def split_variants(name: str, records: list[dict]) -> dict[str, list[dict]]:
  """A sweep's records as one run per variant (``NAME/variant_v`` read as ``NAME``), to be drawn as lines of the
  same panels; a run without variants as it is."""
  variants = sorted({key.rsplit(VARIANT, 1)[1] for record in records for key in record if VARIANT in key}, key=int)
  if not variants:
    return {name: records}
  return {f"{name} variant_{variant}": [
      {"step": record["step"], **{key.rsplit(VARIANT, 1)[0]: value for key, value in record.items()
                                  if key.endswith(f"{VARIANT}{variant}")}} for record in records]
          for variant in variants}


def default_metrics(runs: dict[str, list[dict]]) -> list[str]:
  """``train/loss`` and the runs' ``eval/*`` metrics, in first-logged order, without per-seed copies."""
  names = ["train/loss"]
  for records in runs.values():
    for record in records:
      names += [name for name in record if name.startswith("eval/") and "/seed_" not in name and name not in names]
  return names


def plot_runs(workdirs: list[str], metrics: list[str] | None = None, output: str = "") -> str:
  """Draw the runs in ``workdirs`` (one line each) and return the PNG's path."""
  runs = {}
  for workdir in workdirs:
    if not RunDirectory(workdir).has(METRICS):
      raise SystemExit(f"error: {workdir} has no metrics.jsonl; give the --workdir of a training run.")
    runs.update(split_variants(os.path.basename(os.path.normpath(workdir)), read_metrics(workdir)))
  metrics = metrics or default_metrics(runs)
  missing = [name for name in metrics if not any(name in r for records in runs.values() for r in records)]
  if missing:
    logged = sorted({name for records in runs.values() for r in records for name in r} - {"step"})
    raise SystemExit(f"error: no run logged {', '.join(missing)}; logged metrics: {', '.join(logged)}")
  output = output or os.path.join(workdirs[0], "curves.png")
  report.plot_curves(runs, metrics, output, ", ".join(runs))
  return output


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   allow_abbrev=False)
  parser.add_argument("workdirs", nargs="+", metavar="WORKDIR", help="A training run's --workdir; one line each.")
  parser.add_argument("--metrics", type=report.comma_list, default=[], help="Metrics to draw, one panel each; "
                      "default: train/loss and every eval/ metric the runs logged (per-seed values left out).")
  parser.add_argument("--output", default="", help="PNG to write; default: curves.png in the first workdir.")
  args = parser.parse_args(argv)
  print(f"wrote {plot_runs(args.workdirs, args.metrics, args.output)}")


if __name__ == "__main__":
  main()
