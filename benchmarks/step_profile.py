"""Questions 3 and 7: where the time of our train step goes, from a profiler trace.

    python -m benchmarks.step_profile --flax_stock     # base config, float32, batch 16, beside flax-stock (CPU)
    python -m benchmarks.step_profile --dtype=bfloat16 --batch 512 --steps 10   # on a GPU
    python -m benchmarks.step_profile --smoke          # a tiny model, prints only

``train_step.py`` says how fast the step is (tokens/s, MFU); this says why. It compiles ours exactly as
``train_step.py`` does (``compile_step``), runs ``--steps`` steps under ``jax.profiler.trace`` (a Perfetto
trace, plain JSON: no TensorBoard needed), and attributes each XLA op's time to

- a part of the model, from the op's ``op_name`` metadata in the compiled HLO (the Flax module path and
  JAX name scopes): dropout and its random bits, layer norm, attention, feed-forward, the loss
  (``cross_entropy`` scope of ``transformer.ops``), the rest of the model (embeddings, the tied output
  projection), the optimizer (``optimizer`` scope of the train step), and whatever names none of these;
- matmul or not: a ``dot``/``convolution``, a fusion whose computation holds one, or a cuBLAS/cuDNN call.

Op time is exclusive (an op's time minus the ops nested inside it, e.g. a while loop's body). On a GPU it is
kernel time on the device; on the CPU it is thread time summed over the threads that run XLA's ops, which
can exceed the wall time when ops run in parallel. Two numbers explain an MFU: the matmul share of the op
time, and the matmul efficiency (model FLOPs over the matmul time, against the matmul peak measured in this
run; counted only on a GPU, where the kernels run one at a time). ``ratios`` has both, and the device's busy
fraction (op time over wall time; below 1 means the device waited for the host).

``--flax_stock`` profiles ``train_step.py``'s flax-stock model (the same model from flax's stock layers) beside
ours: both run the same matmuls, so the notes say how much of the other ops ours would have to shed for a
given speed-up over it.
"""
from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

import jax

from benchmarks import common, measure
from benchmarks import train_step
from experiments.record_store import host_description
from transformer.nn.config import transformer_flops
from transformer.train.config import build_task

# (part, pattern on the lower-cased op_name): the first that matches names the part. Norms before attention
# ("self_attention_norm" is a norm); dropout's random bits come from jax.random (threefry) inside the
# "dropout" name scope of transformer.ops.dropout, and Flax's make_rng folds module paths into keys.
PARTS = (
    ("dropout and RNG", re.compile(r"dropout|threefry|random_bits|random_fold_in|bernoulli")),
    ("layer norm", re.compile(r"_norm\b|/norm\b|layer_norm|layernorm")),
    ("attention", re.compile(r"attention")),
    ("feed-forward", re.compile(r"feed_forward|/dense_\d+/")),  # flax-stock's feed-forward: Dense_N
    ("loss", re.compile(r"cross_entropy|take_along_axis|logsumexp")),
    ("embeddings, output projection, rest of model", re.compile(r"encoderdecoder|flaxstocktransformer|embed")),
    ("optimizer (gradient scaling, clipping, Adam)", re.compile(r"optimizer")),
)
OTHER_PART = "other"
MATMUL_INSTRUCTION = re.compile(r"\b(dot|convolution)\(|__cublas|__cudnn|custom_call_target=\"[^\"]*(gemm|matmul)")
_COMPUTATION_START = re.compile(r"^(?:ENTRY )?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = ")
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def add_arguments(parser):
  parser.add_argument("--config", default="transformer_base", choices=sorted(train_step.VOCAB_SIZES))
  parser.add_argument("--batch", type=common.positive_int, default=16)
  parser.add_argument("--length", type=common.positive_int, default=64, help="source and target tokens per example")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--steps", type=common.positive_int, default=3, help="steps inside the trace")
  parser.add_argument("--matmul_size", type=common.positive_int, default=None,
                      help="side of the peak matmul (default 2048 on CPU, 8192 on an accelerator)")
  parser.add_argument("--no_dropout", action="store_true", help="train without dropout")
  parser.add_argument("--top", type=common.positive_int, default=10, help="how many of the slowest ops to list")
  parser.add_argument("--flax_stock", action="store_true",
                      help="also profile the model built from flax's stock layers (train_step.py's flax-stock)")
  parser.add_argument("--trace_dir", default=None, help="keep the trace here (default: a temporary folder)")


# ------------------------------------------------------------------------------------------ the compiled HLO

@dataclasses.dataclass(frozen=True)
class HloOp:
  """What the compiled HLO says about one instruction: where in the program it came from, and whether it
  multiplies matrices."""
  op_name: str
  matmul: bool


def parse_hlo(text: str) -> dict[str, HloOp]:
  """Instruction name -> ``HloOp`` for every instruction of the compiled HLO ``text`` (``Compiled.as_text()``).

  An instruction is a matmul when it is a ``dot``/``convolution`` or a cuBLAS/cuDNN call, or when it is a
  fusion whose computation (or one it calls) holds one.
  """
  computations: dict[str, list[tuple[str, str]]] = {}
  current = None
  for line in text.splitlines():
    instruction = _INSTRUCTION.match(line)
    if instruction and current is not None:
      computations[current].append((instruction.group(1), line))
      continue
    start = _COMPUTATION_START.match(line)
    if start:
      current = start.group(1)
      computations[current] = []

  holds_matmul: dict[str, bool] = {}

  def computation_has_matmul(name: str, seen=()) -> bool:
    if name not in holds_matmul:
      holds_matmul[name] = False  # no recursion through cycles
      holds_matmul[name] = any(line_is_matmul(line, seen + (name,)) for _, line in computations.get(name, ()))
    return holds_matmul[name]

  def line_is_matmul(line: str, seen) -> bool:
    if MATMUL_INSTRUCTION.search(line):
      return True
    called = _CALLS.search(line)
    return bool(called and " fusion(" in line and called.group(1) not in seen
                and computation_has_matmul(called.group(1), seen))

  ops = {}
  for instructions in computations.values():
    for name, line in instructions:
      op_name = _OP_NAME.search(line)
      ops[name] = HloOp(op_name.group(1) if op_name else "", line_is_matmul(line, ()))
  return ops


GPU_TRACE_FLAGS = "--xla_gpu_enable_command_buffer="

# Kernel names of vendor matmul libraries (cuBLAS, CUTLASS), for kernels the HLO text cannot name.
MATMUL_KERNEL = re.compile(r"gemm|xmma|nvjet|cutlass|matmul", re.IGNORECASE)


def hlo_op_info(hlo: dict[str, HloOp], op: str) -> HloOp:
  """The ``HloOp`` of a trace's op: by instruction name, else by XLA's kernel name for it (``fusion_3`` for
  ``fusion.3``), else unnamed (a matmul if the kernel name says so)."""
  info = hlo.get(op) or hlo.get(re.sub(r"_(\d+)$", r".\1", op))
  return info or HloOp("", bool(MATMUL_KERNEL.search(op)))


def model_part(op_name: str) -> str:
  """The part of the train step an ``op_name`` belongs to (``PARTS``, else ``OTHER_PART``)."""
  lowered = op_name.lower()
  for part, pattern in PARTS:
    if pattern.search(lowered):
      return part
  return OTHER_PART


# ----------------------------------------------------------------------------------------------- the trace

def exclusive_op_times(events, by_event_name: bool = False) -> dict[str, float]:
  """Microseconds per HLO op: each complete event that names an ``hlo_op``, minus the time of the
  ``hlo_op`` events nested inside it on the same thread (a while loop's body, a fusion's kernels).

  ``by_event_name``: events without an ``hlo_op`` argument count under their own name (device kernels of a
  trace that does not annotate them; ``hlo_op_info`` then matches XLA's kernel names to HLO instructions).
  """
  by_thread = collections.defaultdict(list)  # thread -> [(start, duration, op)]; the events are not modified
  for event in events:
    if event.get("ph") != "X":
      continue
    op = event.get("args", {}).get("hlo_op") or (event.get("name") if by_event_name else None)
    if op:
      by_thread[(event.get("pid"), event.get("tid"))].append(
          (float(event["ts"]), float(event.get("dur", 0.0)), op))
  totals = collections.Counter()
  for thread_events in by_thread.values():
    # Parents first: earlier start, and at equal starts the longer event.
    thread_events.sort(key=lambda item: (item[0], -item[1]))
    open_events = []  # [end, op, child time] of the enclosing events
    for start, duration, op in thread_events:
      while open_events and open_events[-1][0] <= start:
        _, closed_op, children = open_events.pop()
        totals[closed_op] -= children
      if open_events:
        open_events[-1][2] += duration
      totals[op] += duration
      open_events.append([start + duration, op, 0.0])
    for _, still_open_op, children in open_events:
      totals[still_open_op] -= children
  return dict(totals)


def device_events(events) -> list[dict]:
  """The trace events of the accelerator (processes named ``/device:GPU:...`` etc.); on the CPU, all."""
  processes = {event["pid"]: event.get("args", {}).get("name", "") for event in events
               if event.get("ph") == "M" and event.get("name") == "process_name"}
  device_pids = {pid for pid, name in processes.items() if name.startswith("/device:")}
  if not device_pids or jax.default_backend() == "cpu":
    return list(events)
  return [event for event in events if event.get("pid") in device_pids]


def read_trace(trace_dir: str) -> list[dict]:
  paths = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True))
  if not paths:
    raise FileNotFoundError(f"jax.profiler wrote no perfetto_trace.json.gz under {trace_dir}; this JAX may not "
                            "support create_perfetto_trace.")
  with gzip.open(paths[-1], "rt") as f:
    trace = json.load(f)
  return trace["traceEvents"] if isinstance(trace, dict) else trace


def profile(step: train_step.CompiledStep, steps: int, trace_dir: str) -> tuple[dict[str, float], float]:
  """(microseconds per HLO op per step, wall seconds per step) over ``steps`` traced steps of ``step``."""
  jax.block_until_ready(step())  # warm: the first call after compiling allocates
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    start = time.perf_counter()
    for _ in range(steps):
      metrics = step()
    jax.block_until_ready(metrics)
    wall = (time.perf_counter() - start) / steps
  events = device_events(read_trace(trace_dir))
  annotated = any("hlo_op" in event.get("args", {}) for event in events)
  times = exclusive_op_times(events, by_event_name=not annotated and jax.default_backend() != "cpu")
  return {op: micros / steps for op, micros in times.items()}, wall


# -------------------------------------------------------------------------------------------------- report

@dataclasses.dataclass
class StepProfile:
  """One implementation's traced step: microseconds per step by part (``[matmul, other]``), in total, in
  matmuls and in ops the HLO does not name; wall seconds per step; the slowest ops."""
  per_part: dict[str, list[float]]
  total: float
  matmul: float
  unknown: float
  wall: float
  slowest: list[str]


def profile_implementation(config, model, batch, args, trace_dir: str | None) -> StepProfile:
  """Compile ``model``'s train step as ``train_step.py`` does, trace ``args.steps`` steps, attribute op time."""
  with measure.persistent_cache_disabled():  # op_name metadata of this trace, not of a cached program
    step = train_step.compile_step(config, model, batch, smoke=args.smoke)
  hlo = parse_hlo(step.compiled.as_text())
  if trace_dir:
    op_micros, wall = profile(step, args.steps, trace_dir)
  else:
    with tempfile.TemporaryDirectory() as temporary:
      op_micros, wall = profile(step, args.steps, temporary)
  if not op_micros:
    raise RuntimeError("the trace holds no XLA op events (no 'hlo_op' arguments); cannot attribute the step's time.")
  per_part = collections.defaultdict(lambda: [0.0, 0.0])
  for op, micros in op_micros.items():
    info = hlo_op_info(hlo, op)
    per_part[model_part(info.op_name)][0 if info.matmul else 1] += micros
  slowest = []
  for op, micros in sorted(op_micros.items(), key=lambda item: -item[1])[:args.top]:
    info = hlo_op_info(hlo, op)
    slowest.append(f"{op} ({model_part(info.op_name)}{', matmul' if info.matmul else ''}) {micros / 1e3:.2f} ms")
  return StepProfile(dict(per_part), total=sum(op_micros.values()),
                     matmul=sum(matmul for matmul, _ in per_part.values()),
                     unknown=sum(micros for op, micros in op_micros.items() if not hlo_op_info(hlo, op).op_name), wall=wall,
                     slowest=slowest)


def use_one_traced_op_per_kernel() -> None:
  """A GPU's command buffers (CUDA graphs) replay many kernels as one traced op; off, each kernel is its own op."""
  if GPU_TRACE_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {GPU_TRACE_FLAGS}".strip()


def method_note(args, batch_size: int, length: int, accelerator: bool) -> str:
  """What was traced, and what op time and the parts mean."""
  where = "GPU kernel time" if accelerator else "thread time summed over XLA's CPU threads"
  return (f"Batch {batch_size} x {length} source + {length} target tokens, {args.dtype} compute, dropout "
          f"{'off' if args.no_dropout else 'as configured'}; {args.steps} traced steps after a warm-up of the "
          f"compiled step that benchmarks/train_step.py times. Op time is {where}. Parts come from each op's "
          f"op_name metadata (Flax module path and JAX name scopes); a fusion counts wholly as its root op's part.")


def add_part_rows(report: common.Report, name: str, implementation: str, result: StepProfile) -> None:
  """One row per model part (in ``PARTS`` order) of ``implementation``'s profile, then its total."""
  order = [part for part, _ in PARTS] + [OTHER_PART]
  for part in sorted(result.per_part, key=order.index):
    matmul_us, other_us = result.per_part[part]
    report.rows.append([name, implementation, part, matmul_us / 1e3, other_us / 1e3,
                        100 * (matmul_us + other_us) / result.total])
  report.rows.append([name, implementation, "total", result.matmul / 1e3, (result.total - result.matmul) / 1e3,
                      100.0])


def matmul_efficiency(report: common.Report, implementation: str, result: StepProfile, flops: float,
                      peaks) -> str:
  """On an accelerator, where kernels run one at a time so matmul kernel time is the matmuls' share of the wall
  time: model FLOPs / matmul time / peak into ``report.ratios`` (or a note saying why not); the clause that
  explains the MFU with it, for the implementation's note."""
  if not result.matmul:
    report.notes.append(
        f"{implementation}: no op of the trace was recognised as a matmul, so no matmul efficiency (a "
        f"measurement error, not a result); its slowest ops: {', '.join(result.slowest[:5])}.")
    return ""
  efficiency = flops / (result.matmul / 1e6) / peaks.measured
  error = measure.mfu_error(f"{implementation} matmul efficiency (matmul kernel time)", efficiency,
                            peaks.mfu(flops / (result.matmul / 1e6))[1])
  if error:
    report.notes.append(error)
  else:
    prefix = "" if implementation == "ours" else f"{implementation} "
    report.ratios[f"{prefix}matmul efficiency"] = efficiency
  return (f"; matmul efficiency (model FLOPs / matmul kernel time / peak) {efficiency:.0%}, so MFU "
          f"= efficiency x matmul share ({result.matmul / result.total:.0%}) x busy fraction "
          f"({result.total / 1e6 / result.wall:.0%})")


def add_ratios_and_notes(report: common.Report, implementation: str, result: StepProfile, flops: float, peaks,
                         accelerator: bool) -> None:
  """``implementation``'s matmul share, busy fraction, MFU (and matmul efficiency on an accelerator) as ratios,
  and its note: times, shares and slowest ops."""
  mfu, theoretical_mfu = peaks.mfu(flops / result.wall)
  prefix = "" if implementation == "ours" else f"{implementation} "
  report.ratios[f"{prefix}matmul share of op time"] = result.matmul / result.total
  report.ratios[f"{prefix}op time / wall time"] = result.total / 1e6 / result.wall
  error = measure.mfu_error(f"{implementation} (wall time under the profiler)", mfu, theoretical_mfu)
  if error:
    report.notes.append(error)
  else:
    report.ratios[f"{prefix}MFU"] = mfu
  efficiency_note = matmul_efficiency(report, implementation, result, flops, peaks) if accelerator else ""
  report.notes.append(
      f"{implementation}: wall {1e3 * result.wall:.2f} ms/step under the profiler, op time "
      f"{result.total / 1e3:.2f} ms/step, matmuls {result.matmul / result.total:.1%} of it, MFU {mfu:.1%}"
      f"{efficiency_note}"
      + (f"; {result.unknown / result.total:.1%} of the op time is in ops without op_name metadata (copies "
         f"XLA adds, or kernels not matched to the HLO)"
         if result.unknown else "") + f". Slowest ops per step: {'; '.join(result.slowest)}.")


def comparison_note(ours: StepProfile, stock: StepProfile, accelerator: bool) -> str:
  """Ours against flax-stock: wall, op, matmul and other-op time, and what ours' other ops would need for 1.2x."""
  note = (f"ours / flax-stock: wall time {ours.wall / stock.wall:.2f}x, op time {ours.total / stock.total:.2f}x "
          f"(matmuls {ours.matmul / stock.matmul:.2f}x, other ops "
          f"{(ours.total - ours.matmul) / (stock.total - stock.matmul):.2f}x).")
  if accelerator:  # kernels run one after another: op time is the busy part of the wall time
    needed = stock.total / 1.2 - ours.matmul
    return note + (f" With ours' matmul time as measured, 1.2x flax-stock's speed needs ours' other ops at "
                   f"{needed / 1e3:.2f} ms/step ({needed / (ours.total - ours.matmul):.0%} of their time now).")
  return note + (" On the CPU, ops run on a thread pool and concurrently, so op time is not wall time: compare "
                 "the parts, not the sums.")


def main(argv=None) -> common.Report:
  use_one_traced_op_per_kernel()
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  machine = host_description(load_average=True)
  accelerator = jax.default_backend() != "cpu"
  batch_size, length = (2, 8) if args.smoke else (args.batch, args.length)
  peaks = measure.measure_peaks(args.dtype, args.smoke, args.warmup, max(args.repeats, 3),
                                sizes=(args.matmul_size,) if args.matmul_size else None)

  config, model_config = train_step.experiment_config(args.config, args.smoke, args.no_dropout, dtype=args.dtype)
  models = {"ours": build_task(config).build_model(model_config)}
  if args.flax_stock:
    models["flax-stock"] = train_step.FlaxStockTransformer(model_config)
  batch = train_step.random_batch(batch_size, length, length, model_config.vocab_size)
  flops = transformer_flops(model_config, batch_size, length, length)["total"]
  name = args.config + (" (smoke size)" if args.smoke else "")
  report = common.Report(
      "step_profile", "Where the train step's time goes: a profiler trace by model part (benchmarks/step_profile.py)",
      ["config", "implementation", "part", "matmul ms/step", "other ms/step", "share of op time %"])
  report.notes.append(method_note(args, batch_size, length, accelerator))
  profiles = {}
  for implementation, model in models.items():
    print(f"{name} batch {batch_size} {implementation}: compiling and tracing {args.steps} steps", flush=True)
    trace_dir = os.path.join(args.trace_dir, implementation) if args.trace_dir else None
    profiles[implementation] = profile_implementation(config, model, batch, args, trace_dir)
  peaks.measure_after(args.warmup, max(args.repeats, 3))
  report.notes.append(f"MFU and matmul efficiency against the {peaks.describe()}.")
  for implementation, result in profiles.items():
    add_part_rows(report, name, implementation, result)
    add_ratios_and_notes(report, implementation, result, flops, peaks, accelerator)
  if "flax-stock" in profiles:
    report.ratios["ours / flax-stock op time"] = profiles["ours"].total / profiles["flax-stock"].total
    report.notes.append(comparison_note(profiles["ours"], profiles["flax-stock"], accelerator))
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
