"""Plots: a run's ``metrics.jsonl`` as curves (the command the end of every training run names), and the
figure helpers the results pages draw with.

    python -m transformer.plot WORKDIR                       # WORKDIR/curves.png: loss and every eval metric
    python -m transformer.plot WORKDIR OTHER_WORKDIR --metrics=train/loss,eval/bleu --output=/tmp/compare.png

Several workdirs give one line each per panel; up to 4 panels a row. A sweep's variants (``config.sweep``:
metrics logged as ``NAME/variant_v``) are lines of the same panels, one per variant. For live curves, TensorBoard
reads the same run: ``pip install -e ".[tensorboard]"`` then ``tensorboard --logdir WORKDIR/tensorboard``.
"""
from __future__ import annotations

import argparse
import contextlib
import os

from transformer.train.workdir import METRICS, RunDirectory, read_metrics

VARIANT = "/variant_"  # a sweep's per-variant metrics: NAME/variant_v (transformer/train/loop.py)


def panel_grid(num_panels: int) -> tuple[int, int]:
  """``(rows, columns)`` of a figure of ``num_panels`` panels: one row up to 4, then a grid (a forecaster's
  per-horizon errors read as a grid, not one long row)."""
  columns = max(1, min(num_panels, 4))
  return -(-num_panels // columns), columns


@contextlib.contextmanager
def figure(path: str, rows: int, columns: int, size: tuple[float, float], dpi: int = 110):
  """``with figure(path, rows, columns, (width, height)) as (figure, axes):`` a matplotlib figure of a grid of
  panels (``axes[row, column]``), laid out, written to ``path`` and closed at the end of the block."""
  import matplotlib
  matplotlib.use("Agg")  # no display: the pages are written on servers
  import matplotlib.pyplot as plt
  drawing, axes = plt.subplots(rows, columns, figsize=size, squeeze=False)
  try:
    yield drawing, axes
    drawing.tight_layout()
    drawing.savefig(path, dpi=dpi)
  finally:
    plt.close(drawing)


def plot_curves(runs: dict[str, list[dict]], metrics: list[str], path: str, title: str) -> None:
  """One panel per metric (``panel_grid``), one line per run (``name -> metric records``, as ``read_metrics``)."""
  rows, columns = panel_grid(len(metrics))
  with figure(path, rows, columns, (5 * columns, 3.6 * rows)) as (drawing, axes):
    for axis in axes.flat[len(metrics):]:
      axis.set_visible(False)
    for axis, metric in zip(axes.flat, metrics):
      for name, records in runs.items():
        points = [(record["step"], record[metric]) for record in records if metric in record]
        if points:
          axis.plot(*zip(*points), marker="." if len(points) < 30 else None, label=name)
      axis.set_xlabel("step")
      axis.set_title(metric)
      if "loss" in metric:
        axis.set_yscale("log")
      axis.grid(alpha=0.3)
      if axis.get_legend_handles_labels()[0]:
        axis.legend()
    drawing.suptitle(title)


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
  plot_curves(runs, metrics, output, ", ".join(runs))
  return output


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   allow_abbrev=False)
  parser.add_argument("workdirs", nargs="+", metavar="WORKDIR", help="A training run's --workdir; one line each.")
  parser.add_argument("--metrics", type=lambda text: [part for part in text.split(",") if part], default=[],
                      help="Metrics to draw, one panel each; default: train/loss and every eval/ metric the runs "
                      "logged (per-seed values left out).")
  parser.add_argument("--output", default="", help="PNG to write; default: curves.png in the first workdir.")
  args = parser.parse_args(argv)
  print(f"wrote {plot_runs(args.workdirs, args.metrics, args.output)}")


if __name__ == "__main__":
  main()
