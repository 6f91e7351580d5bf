"""Metric outputs: ``metrics.jsonl`` (one JSON object per logging step) and TensorBoard; on the console the tqdm bar
(``progress_bar``) or, when stderr is a file, a line per logging step (``log_line``); and what a step costs
(``StepCost``: parameters, model FLOPs, TFLOP/s per device and MFU against ``DEVICE_PEAKS``).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import sys
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from transformer.data.files import is_write_refused, write_atomically, write_refused_error
from transformer.nn.config import transformer_flops
from transformer.train.workdir import METRICS, TENSORBOARD, read_records

log = logging.getLogger(__name__)


def progress_bar(total: int, initial: int, quiet: bool):
  """tqdm bar with step, loss, throughput and ETA; silent when quiet or when stderr is not a terminal."""
  return tqdm.tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                   disable=quiet or not sys.stderr.isatty())


def log_line(step: int, total: int, metrics: dict, seconds_per_step: float | None, window_steps: int = 0) -> str:
  """One progress line for logs written to a file (where the tqdm bar is off), e.g.
  ``step 100/4000 (2%): loss 6.5280, 1135 tokens/s, 0.37 steps/s, 0.0123 TFLOP/s per device, ETA 2h56m`` (and
  ``MFU 41.2%`` after the TFLOP/s where the device's peak is known); with skipped non-finite
  steps in the window (``train/skipped_steps`` of its ``window_steps``) ``..., 3 of 50 steps skipped``.
  ``seconds_per_step``: the pace of steps that did not compile (None, a window that only compiled: no ETA)."""
  eta = ""
  if seconds_per_step is not None:
    hours, minutes = divmod(int(max(total - step, 0) * seconds_per_step // 60), 60)
    eta = f", ETA {hours}h{minutes:02d}m"
  skipped = metrics.get("train/skipped_steps", 0)
  cost = (f", {metrics['train/tflops_per_device']:.3g} TFLOP/s per device" if "train/tflops_per_device" in metrics
          else "") + (f", MFU {100 * metrics['train/mfu']:.1f}%" if "train/mfu" in metrics else "")
  return (f"step {step}/{total} ({100 * step / max(total, 1):.0f}%): loss {metrics['train/loss']:.4f}, "
          f"{metrics['train/tokens_per_second']:.0f} tokens/s, {metrics['train/steps_per_second']:.2f} steps/s"
          + cost + eta + (f", {skipped:g} of {window_steps} steps skipped" if skipped else ""))


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


# Dense (no sparsity) peak matmul FLOP/s of one chip by device kind (data sheets), first match in the device's
# ``device_kind`` wins: the denominator of MFU. float32 matmuls at JAX's default precision may run as TF32 on
# these GPUs, so their TF32 peak bounds them; a TPU's float32 (several bfloat16 passes) is left unknown.
DEVICE_PEAKS = (
    ("H100 PCIe", {"bfloat16": 756e12, "float32": 378e12}),
    ("H100 NVL", {"bfloat16": 835e12, "float32": 418e12}),
    ("H100", {"bfloat16": 989e12, "float32": 494e12}),  # SXM
    ("H200", {"bfloat16": 989e12, "float32": 494e12}),
    ("A100", {"bfloat16": 312e12, "float32": 156e12}),
    ("V100", {"float16": 125e12, "float32": 15.7e12}),  # no bfloat16 tensor cores
    ("TPU v4", {"bfloat16": 275e12}),
    ("TPU v5 lite", {"bfloat16": 197e12}),  # v5e
    ("TPU v5", {"bfloat16": 459e12}),  # v5p (device kind "TPU v5" or "TPU v5p")
    ("TPU v6 lite", {"bfloat16": 918e12}),  # v6e
)


def device_peak(device_kind: str, dtype: str) -> tuple[float | None, str]:
  """``(peak FLOP/s or None, the table's name for the device)`` of a chip whose ``device_kind`` is given (e.g.
  ``"NVIDIA H100 80GB HBM3"``), computing in ``dtype``; ``(None, "")`` for a device or dtype not in
  ``DEVICE_PEAKS`` (a CPU)."""
  for name, peaks in DEVICE_PEAKS:
    if name.lower() in device_kind.lower():
      return peaks.get(dtype), name
  return None, ""


def batch_shapes(model_name: str, batch: Mapping[str, Any]) -> tuple[int, int, int] | None:
  """``(batch_size, source_length, target_length)`` of a batch for ``transformer_flops``: an encoder-decoder's
  ``source`` and ``target``, a language model's ``tokens`` (no source), a classifier's ``tokens`` (no target);
  None for the models it does not count (RNNs, forecasters)."""
  if model_name == "transformer" and "source" in batch and "target" in batch:
    (rows, source), (_, target) = np.shape(batch["source"]), np.shape(batch["target"])
    return rows, source, target
  if model_name in ("lm", "encoder_classifier") and "tokens" in batch:
    rows, length = np.shape(batch["tokens"])
    return (rows, 0, length) if model_name == "lm" else (rows, length, 0)
  return None


def _flops_text(flops: float) -> str:
  """``"9.46 TFLOP"``, ``"398 MFLOP"``: three significant digits in the unit that keeps them above 1."""
  for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
    if flops >= scale:
      return f"{flops / scale:.3g} {unit}"
  return f"{flops:.3g} FLOP"


@dataclasses.dataclass(frozen=True)
class StepCost:
  """What a training step costs, for the log: the model's parameters, the model FLOPs of a batch
  (``transformer.nn.transformer_flops`` at the batch's shape, padding included as the device computes it, times
  the replicas that each train on it) and the peak of the devices this process computes on (``DEVICE_PEAKS``;
  None: unknown, and no MFU is logged)."""
  model_name: str
  model_config: Any
  num_params: int
  replicas: int = 1  # vmapped seeds and variants, each computing the whole batch
  devices: int = 1  # that this process's rows are computed on
  peak: float | None = None  # FLOP/s per device
  peak_name: str = ""

  @classmethod
  def of(cls, model_name: str, model_config, params_shapes, replicas: int, devices: int) -> StepCost:
    """The cost of a run's step: ``params_shapes`` (shapes of the parameters, a leading replica axis when
    ``replicas`` > 1) counted; the peak of this process's first device in the model's compute dtype."""
    num_params = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params_shapes)) // max(replicas, 1)
    dtype = jnp.dtype(getattr(model_config, "compute_dtype", jnp.float32)).name
    peak, name = device_peak(jax.local_devices()[0].device_kind, dtype)
    return cls(model_name, model_config, num_params, replicas, max(devices, 1), peak, f"{name} {dtype}".strip())

  def flops(self, batch: Mapping[str, Any]) -> float | None:
    """Model FLOPs of a training step on ``batch`` (this process's rows); None for a model not counted."""
    shapes = batch_shapes(self.model_name, batch)
    if shapes is None or not hasattr(self.model_config, "d_ff"):
      return None
    return self.replicas * transformer_flops(self.model_config, *shapes)["total"]

  def describe(self, batch: Mapping[str, Any]) -> str:
    """The line at the start of training: parameters, FLOPs per step at ``batch``'s shape and the peak."""
    flops = self.flops(batch)
    shape = " + ".join("x".join(map(str, np.shape(value))) for key, value in batch.items()
                       if key in ("source", "target", "tokens"))
    counted = (f"model FLOPs per step {_flops_text(flops)} at the first batch's shape ({shape}; 6 x "
               f"parameters x tokens + attention, transformer.nn.transformer_flops)" if flops is not None else
               f"model FLOPs not counted for model {self.model_name!r}")
    peak = (f"peak {self.peak / 1e12:,.0f} TFLOP/s per device ({self.peak_name}, dense)" if self.peak else
            f"no known peak for {jax.local_devices()[0].device_kind} ({self.peak_name}): MFU not logged")
    return f"parameters {self.num_params:,}; {counted}; {peak}"

  def log_metrics(self, flops: float, seconds: float) -> dict[str, float]:
    """``train/tflops_per_device`` and, with a known peak, ``train/mfu`` of ``flops`` done in ``seconds``."""
    if not flops or not seconds > 0:
      return {}
    per_device = flops / seconds / self.devices
    metrics = {"train/tflops_per_device": per_device / 1e12}
    if self.peak:
      metrics["train/mfu"] = per_device / self.peak
    return metrics
