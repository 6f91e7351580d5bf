"""Metric outputs: ``metrics.jsonl`` (one JSON object per logging step) and TensorBoard.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re

from transformer.data.files import is_write_refused, write_atomically, write_refused_error
from transformer.train.workdir import METRICS, TENSORBOARD, read_records

log = logging.getLogger(__name__)


class MetricWriter:
  """Appends ``{"step": ..., name: value}`` lines to ``workdir/metrics.jsonl`` and TensorBoard scalars.

  On resume, lines for steps after the restored checkpoint (written before a crash) are dropped, so the
  file of a resumed run equals that of an uninterrupted one.
  """

  def __init__(self, workdir: str, resume_step: int = 0, enabled: bool = True, tensorboard: bool = True):
    self.enabled = enabled
    self.path = os.path.join(workdir, METRICS)
    self._tensorboard = None
    if not enabled:
      return
    if os.path.exists(self.path):
      kept = [record for record in read_records(self.path, ("step",))
              if record["step"] <= resume_step]
      write_atomically(self.path, "".join(json.dumps(record) + "\n" for record in kept))  # a crash loses no line
    if tensorboard:
      from tensorboardX import SummaryWriter  # imported lazily: optional at read time
      self._tensorboard = SummaryWriter(os.path.join(workdir, TENSORBOARD))

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
    line = json.dumps(record) + "\n"
    try:
      with open(self.path, "a") as f:
        f.write(line)
    except OSError as error:  # a half-written line is dropped on resume (see read_records)
      if not is_write_refused(error):
        raise
      raise write_refused_error(error, self.path, len(line), f"the metrics of step {step}") from None
    if self._tensorboard is not None:
      for name, value in metrics.items():
        if math.isfinite(float(value)):
          self._tensorboard.add_scalar(name, float(value), step)
      self._tensorboard.flush()

  def close(self) -> None:
    if self._tensorboard is not None:
      self._tensorboard.close()


def _format_value(value: float) -> str:
  text = f"{value:.4f}"
  return text.rstrip("0").rstrip(".") if "." in text else text


def metric_order(name: str) -> list:
  """Sort key of a metric name that orders its numbers by value: ``eval/mae_1h``, ``eval/mae_6h``,
  ``eval/mae_12h`` (a plain sort puts ``12h`` first), ``layer_2`` before ``layer_10``."""
  return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def shown_metrics(metrics: dict) -> dict:
  """``metrics`` as printed: in ``metric_order``, without the per-seed copies (``eval/loss/seed_0``), which
  ``metrics.jsonl`` holds."""
  return {name: metrics[name] for name in sorted(metrics, key=metric_order) if "/seed_" not in name}


FINAL_LINE_METRICS = 8  # more final metrics than this (a forecaster's per horizon) are a table, not one line


def final_lines(metrics: dict) -> list[str]:
  """The end-of-run ``final:`` of ``metrics`` (already ``shown_metrics``): one line, or, for more than
  ``FINAL_LINE_METRICS``, the line ``final:`` and a ``results_table`` (a forecaster's mae/mse/rmse per horizon
  made a line of hundreds of characters)."""
  if not metrics:
    return []
  if len(metrics) <= FINAL_LINE_METRICS:
    return ["final: " + " ".join(f"{name}={value:.4f}" for name, value in metrics.items())]
  return ["final:", results_table(metrics)]


def results_table(metrics: dict) -> str:
  """Metrics named ``<split>/<name>`` (``eval/bleu``, ``test/f1``) as a text table, one row per metric and one
  column per split (rows in ``metric_order``), e.g.::

      metric  eval    test_2016_flickr
      bleu    38.12   39.86
      loss    1.9021

  Values that are not numbers (signatures, nested dicts) and per-seed copies (``f1/seed_0``) are left out:
  the results JSON file has them."""
  columns, rows = [], {}
  for key, value in metrics.items():
    split, _, name = key.partition("/")
    if not name or "/" in name or isinstance(value, bool) or not isinstance(value, (int, float)):
      continue
    if split not in columns:
      columns.append(split)
    rows.setdefault(name, {})[split] = _format_value(float(value))
  table = [["metric", *columns]] + [[name, *(row.get(split, "") for split in columns)]
                                    for name, row in sorted(rows.items(), key=lambda item: metric_order(item[0]))]
  widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
  return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in table)


def variant_tables(metrics: dict, names: list[str]) -> str:
  """A ``results_table`` per variant of a sweep (its ``<split>/<name>/variant_v`` metrics: the mean over its
  seeds), each under its name from ``Replicas.variant_names``; "" without variants."""
  blocks = []
  for index, name in enumerate(names):
    suffix = f"/variant_{index}"
    own = {key[:-len(suffix)]: value for key, value in metrics.items() if key.endswith(suffix)}
    blocks.append(f"{name}:\n" + results_table(own))
  return "\n".join(blocks)
