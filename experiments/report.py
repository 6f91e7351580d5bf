"""Shared pieces of the results scripts: read runs' metrics, write markdown tables and curve plots.

Every number in a RESULTS.md comes from a run's ``metrics.jsonl`` through these functions.
"""
from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys

import jax

from transformer.train.writers import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine_description() -> str:
  devices = jax.devices()
  cores = os.cpu_count()
  return (f"{len(devices)} x {devices[0].device_kind} ({platform.machine()}, {cores} CPU cores), "
          f"JAX {jax.__version__}, {datetime.date.today().isoformat()}")


def launch(config: str, workdir: str, overrides: tuple[str, ...] = ()) -> list[str]:
  """Run ``launch.py`` (resuming if ``workdir`` has checkpoints); returns the command for the record."""
  command = [sys.executable, "launch.py", f"--config={config}", f"--workdir={workdir}", *overrides]
  subprocess.run(command + ["--config.quiet=True"], cwd=REPO, check=True)
  return ["python", "launch.py", f"--config={config}", f"--workdir={workdir}", *overrides]


def series(records: list[dict], name: str) -> tuple[list[int], list[float]]:
  points = [(r["step"], r[name]) for r in records if name in r]
  return [p[0] for p in points], [p[1] for p in points]


def first_reaching(records: list[dict], name: str, threshold: float) -> dict | None:
  """The first record whose ``name`` is at least ``threshold``."""
  for record in records:
    if record.get(name, float("-inf")) >= threshold:
      return record
  return None


def markdown_table(header: list[str], rows: list[list]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
  return "\n".join(lines)


def plot_curves(runs: dict[str, list[dict]], metrics: list[str], path: str, title: str) -> None:
  """One panel per metric, one line per run (``name -> metric records``, as read by ``read_metrics``)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  figure, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.6), squeeze=False)
  for axis, metric in zip(axes[0], metrics):
    for name, records in runs.items():
      steps, values = series(records, metric)
      if not steps:
        continue
      axis.plot(steps, values, marker="." if len(steps) < 30 else None, label=name)
    axis.set_xlabel("step")
    axis.set_title(metric)
    if "loss" in metric:
      axis.set_yscale("log")
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
      axis.legend()
  figure.suptitle(title)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def portable_command(parts: list[str]) -> str:
  """``parts`` as a shell line without this machine's paths: ``--workdir=WORKDIR``, no TFDS data dir, and a
  source folder relative to the repository (e.g. ``../shared/data/multi30k``)."""
  kept = []
  for part in parts:
    name, _, value = part.partition("=")
    if name == "--workdir":
      part = "--workdir=WORKDIR"
    elif name == "--config.task.data_dir":
      continue
    elif name == "--config.task.source_dir" and os.path.isabs(value):
      part = f"{name}={os.path.relpath(value, REPO)}"
    kept.append(part)
  return command_line(kept)


def command_line(parts: list[str]) -> str:
  return " ".join(shlex.quote(p) for p in parts)
