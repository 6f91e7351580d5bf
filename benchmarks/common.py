"""What every benchmark shares: flags, timing, compiled-memory analysis, matmul peak, FLOP counts, reports.

Conventions of the scripts in this folder:

- ``python -m benchmarks.<name>`` measures at full size, prints its table and rewrites its own section of
  ``benchmarks/RESULTS.md`` (command, machine, JAX version, date, table). ``--smoke`` shrinks every size to
  something that runs in seconds (what the tests run) and never writes RESULTS.md.
- ``main(argv) -> Report``: the table and a dict of ratios (ours / reference, measured side by side in the
  same process), so tests can check that every ratio is a finite number.
- Times are medians of ``--repeats`` calls after ``--warmup`` calls, each ended by ``block_until_ready``;
  compilation is never inside a timed call.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

RESULTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")
# Sections of RESULTS.md, in the order of the questions (benchmarks/README.md).
SCRIPTS = ("attention", "chunked_attention", "train_step", "step_profile", "decoding", "input_pipeline",
           "sequence_length")
RESULTS_HEADER = ("# Benchmark results\n\nWritten by the scripts in `benchmarks/` (one section each, replaced "
                  "when the script runs again without `--smoke`); do not edit by hand.\n")


# ----------------------------------------------------------------------------------------------- flags

def parse_args(description: str, argv: Sequence[str] | None,
               add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
  """The flags every script has (``--smoke``, ``--repeats``, ``--warmup``) plus its own."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--smoke", action="store_true",
                      help="tiny sizes and one repeat, for tests; does not write RESULTS.md")
  parser.add_argument("--repeats", type=int, default=None, help="timed calls per measurement (median)")
  parser.add_argument("--warmup", type=int, default=None, help="untimed calls before timing")
  if add_arguments is not None:
    add_arguments(parser)
  args = parser.parse_args(list(argv) if argv is not None else None)
  if args.repeats is None:
    args.repeats = 1 if args.smoke else 5
  if args.warmup is None:
    args.warmup = 1
  if args.repeats < 1 or args.warmup < 0:
    parser.error(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}.")
  return args


def positive_int(text: str) -> int:
  """An argparse type: an integer of at least 1 (batch size, steps, ...), else a usage error naming the value."""
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
  return value


# ---------------------------------------------------------------------------------------------- timing

@dataclasses.dataclass(frozen=True)
class Timing:
  """Seconds per call: ``median`` of the timed calls (what tables report), their ``minimum``, all of them."""
  median: float
  minimum: float
  times: tuple[float, ...]


def time_fn(fn: Callable, *args, warmup: int = 1, repeats: int = 5, budget_s: float | None = None) -> Timing:
  """Time ``fn(*args)``: ``warmup`` untimed calls (compilation, caches), then ``repeats`` timed calls, each
  waited for with ``jax.block_until_ready`` (JAX dispatches asynchronously: without it the clock would
  stop before the device finished).

  ``budget_s``: when one warm-up call shows that ``repeats`` calls would take longer, time fewer (at least
  one): a median of calls lasting minutes gains little over one of them.
  """
  return time_interleaved({"": lambda: fn(*args)}, warmup=warmup, repeats=repeats, budget_s=budget_s)[""]


def time_interleaved(calls: Mapping[str, Callable[[], Any]], warmup: int = 1, repeats: int = 5,
                     budget_s: float | None = None) -> dict[str, Timing]:
  """Time competing implementations side by side: name -> ``Timing`` of ``calls[name]()``.

  After ``warmup`` untimed calls of each, the timed calls go round robin, one of each per round, with the
  starting one rotated every round. Load from other processes, clock changes and cache state then fall on
  every implementation alike, rather than on whichever was timed first or last, which is what the ratios
  between them need. ``budget_s`` caps each implementation's timed calls (at least one), judged by the
  slowest warm-up call (with no warm-up, by the slowest call of the first round).
  """
  names = list(calls)
  call_seconds = 0.0
  for name in names:
    for _ in range(warmup):
      start = time.perf_counter()
      jax.block_until_ready(calls[name]())
      call_seconds = max(call_seconds, time.perf_counter() - start)
  def within_budget(repeats, call_seconds):
    return repeats if budget_s is None or call_seconds <= 0 else max(1, min(repeats, int(budget_s / call_seconds)))

  repeats = within_budget(repeats, call_seconds)
  times = {name: [] for name in names}
  round_index = 0
  while round_index < repeats:
    offset = round_index % len(names)
    for name in names[offset:] + names[:offset]:
      start = time.perf_counter()
      jax.block_until_ready(calls[name]())
      times[name].append(time.perf_counter() - start)
    if round_index == 0 and not warmup:  # no warm-up to judge the budget by: the first round does
      repeats = within_budget(repeats, max(t[0] for t in times.values()))
    round_index += 1
  return {name: Timing(statistics.median(t), min(t), tuple(t)) for name, t in times.items()}


# XLA options that roughly halve CPU compile times at the cost of slower code: for --smoke runs only, whose
# time is mostly compilation and whose numbers mean nothing.
SMOKE_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def compile_timed(fn: Callable, *args, compiler_options: dict | None = None):
  """``(compiled, seconds)``: lower and compile ``fn`` (jitted here unless already jitted) for ``args``.

  The seconds cover tracing, lowering and XLA compilation; a persistent compilation cache
  (``JAX_COMPILATION_CACHE_DIR``) would turn them into a cache read, so full runs disable it
  (``disable_persistent_cache``).
  """
  jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
  start = time.perf_counter()
  lowered = jitted.lower(*args)
  compiled = lowered.compile(compiler_options=compiler_options) if compiler_options else lowered.compile()
  return compiled, time.perf_counter() - start


def disable_persistent_cache() -> None:
  """Measure real compile times: no reading of compiled programs from disk in this process."""
  jax.config.update("jax_enable_compilation_cache", False)


@contextlib.contextmanager
def persistent_cache_disabled():
  """``disable_persistent_cache`` for the duration of a block only. Also for reading a compiled program's
  metadata (``op_name``): a cached program may carry that of an earlier trace of the same computation."""
  enabled = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", enabled)


# ---------------------------------------------------------------------------------------------- memory

@dataclasses.dataclass(frozen=True)
class MemoryStats:
  """Bytes of device memory XLA plans for one compiled program (``Compiled.memory_analysis()``).

  ``peak``: XLA's own peak where it reports one, else ``argument + output + temp - alias`` (buffers that
  are live for the whole call, plus the largest scratch XLA assigned, less outputs that reuse inputs).
  """
  argument: int
  output: int
  temp: int
  alias: int
  peak: int


def memory_stats(compiled) -> MemoryStats:
  analysis = compiled.memory_analysis()
  argument, output = analysis.argument_size_in_bytes, analysis.output_size_in_bytes
  temp, alias = analysis.temp_size_in_bytes, analysis.alias_size_in_bytes
  peak = int(getattr(analysis, "peak_memory_in_bytes", 0) or 0)
  peak = max(peak, argument + output + temp - alias)
  return MemoryStats(argument, output, temp, alias, peak)


def compiled_memory(fn: Callable, *args) -> MemoryStats:
  """Memory plan of ``jax.jit(fn).lower(*args).compile()``; nothing runs, so a program far larger than the
  machine's memory can still be analysed. ``args`` may be ``jax.ShapeDtypeStruct``s."""
  return memory_stats(jax.jit(fn).lower(*args).compile())


def available_memory_bytes() -> int:
  """Memory a program on the default device may use: the device's limit on accelerators, else the
  host's available memory (``MemAvailable``: free plus reclaimable page cache)."""
  device = jax.devices()[0]
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def mib(num_bytes: float) -> float:
  return num_bytes / 2**20


# ------------------------------------------------------------------------------------------ matmul peak

def matmul_peak(size: int = 2048, dtype=jnp.float32, warmup: int = 2, repeats: int = 10) -> float:
  """FLOP/s of a jitted ``[size, size] @ [size, size]`` matmul (``2 * size**3`` FLOPs) on the default device
  at the default precision: the practical peak that model FLOPs utilisation (MFU) is measured against. On
  CPU the issue's reference is float32 at 2048."""
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  a, b = (jax.random.normal(key, (size, size), dtype) for key in keys)
  timing = time_fn(jax.jit(jnp.matmul), a, b, warmup=warmup, repeats=repeats)
  return 2.0 * size**3 / timing.median


# ----------------------------------------------------------------------------------------------- FLOPs

def encoder_decoder_flops(config, batch_size: int, source_length: int, target_length: int,
                          train: bool = True) -> dict[str, float]:
  """Model FLOPs of one encoder-decoder step, split into ``parameters`` and ``attention`` (and ``total``).

  Convention (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, appendix B): only matmuls count, 2 FLOPs per
  multiply-add; a training step is 3x the forward pass (the backward pass computes the gradients of both the
  inputs and the weights, 2x forward). Hence "6 * parameters * tokens plus attention":

  - ``parameters``: ``6 * N * D`` with every weight matrix counted for the tokens it multiplies: encoder
    matrices for source tokens, decoder self-attention, cross-attention query/output and feed-forward for
    target tokens, cross-attention key/value for source tokens (once per decoder layer), and the (tied)
    output projection ``d_model x vocab`` for target tokens. Embedding lookups, biases, norms, the softmax,
    the loss and the optimizer update are not counted (they are not matmuls).
  - ``attention``: ``q k^T`` and ``weights v``, ``2 * 2 * q_length * kv_length * d_model`` forward per layer
    and example (``heads * head_dim = d_model``), times 3. Causal self attention is counted in full, as the
    dense kernel computes the whole matrix (PaLM halves nothing either).

  Dropout, padding and recomputation are ignored: this is *model* FLOPs, the numerator of MFU.
  """
  d, f, vocab = config.d_model, config.d_ff, config.output_vocab_size
  source, target = source_length, target_length
  encoder_parameters = config.num_encoder_layers * (4 * d * d + 2 * d * f) * source
  decoder_parameters = config.num_decoder_layers * ((4 * d * d + 2 * d * d + 2 * d * f) * target
                                                    + 2 * d * d * source)
  output_projection = d * vocab * target
  encoder_attention = config.num_encoder_layers * 2 * source * source * d
  decoder_attention = config.num_decoder_layers * 2 * (target * target + target * source) * d
  multiplier = 6.0 if train else 2.0  # 2 FLOPs per multiply-add, x3 for forward + backward
  parameters = multiplier * batch_size * (encoder_parameters + decoder_parameters + output_projection)
  attention = multiplier * batch_size * (encoder_attention + decoder_attention)
  return {"parameters": parameters, "attention": attention, "total": parameters + attention}


# ------------------------------------------------------------------------------------------- reporting

def ratio(ours: float, reference: float) -> float:
  """``ours / reference`` (NaN if the reference is missing or zero, so a gap is visible, never hidden)."""
  if reference is None or ours is None or reference == 0:
    return float("nan")
  return ours / reference


def fmt(value, digits: int = 2) -> str:
  """A table cell: numbers with ``digits`` decimals and thousands separators, '-' for missing values."""
  if value is None:
    return "-"
  if isinstance(value, str):
    return value
  if isinstance(value, (int, np.integer)):
    return f"{value:,}"
  if not math.isfinite(value):
    return "-"
  return f"{value:,.{digits}f}"


@dataclasses.dataclass
class Report:
  """One script's result: a table, its ratios (name -> ours / reference) and notes printed under it."""
  script: str  # module name in benchmarks/, e.g. "attention"
  title: str
  header: list[str]
  rows: list[list] = dataclasses.field(default_factory=list)
  ratios: dict[str, float] = dataclasses.field(default_factory=dict)
  notes: list[str] = dataclasses.field(default_factory=list)

  def table(self) -> str:
    lines = ["| " + " | ".join(self.header) + " |", "|" + "|".join("---" for _ in self.header) + "|"]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in self.rows]
    return "\n".join(lines)

  def text(self) -> str:
    notes = "\n".join(f"- {note}" for note in self.notes)
    return f"{self.table()}\n\n{notes}\n" if notes else f"{self.table()}\n"


def cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def usable_cores() -> int:
  """CPU cores this process may run on (``taskset`` narrows them; XLA's and PyTorch's thread pools follow)."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def machine_description() -> str:
  """Device, host CPU, cores, memory and the load average when measuring (others' work skews timings)."""
  devices = jax.devices()
  memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  device = (f"{len(devices)} x {devices[0].device_kind}" if devices[0].platform != "cpu"
            else "CPU only")
  cores = usable_cores()
  cores_text = (f"{os.cpu_count()} cores" if cores == os.cpu_count()
                else f"{cores} of its {os.cpu_count()} cores (taskset)")
  return (f"{device}; host {cpu_name()}, {cores_text}, {memory_gib:.0f} GiB; "
          f"1-minute load average at start {load:.1f}")


def versions() -> str:
  import flax
  import optax
  return f"JAX {jax.__version__} (backend {jax.default_backend()}), flax {flax.__version__}, optax {optax.__version__}"


def command(script: str, argv: Sequence[str] | None) -> str:
  arguments = list(argv) if argv is not None else sys.argv[1:]
  return " ".join(["python", "-m", f"benchmarks.{script}", *map(shlex.quote, arguments)])


def section_name(script: str) -> str:
  """The RESULTS.md section a script's run writes: ``script`` on CPU, ``script.<backend>`` on an accelerator
  and ``script.<N>core`` on CPU narrowed to N cores by ``taskset``, so such a run sits beside the default
  one instead of replacing it."""
  backend = jax.default_backend()
  if backend != "cpu":
    return f"{script}.{backend}"
  cores = usable_cores()
  return script if cores == os.cpu_count() else f"{script}.{cores}core"


def section_title(report: Report) -> str:
  suffix = section_name(report.script)[len(report.script):]
  if not suffix:
    return report.title
  if jax.default_backend() != "cpu":
    return f"{report.title} on {jax.default_backend().upper()}"
  return f"{report.title} on {usable_cores()} of {os.cpu_count()} CPU cores"


def section(report: Report, argv: Sequence[str] | None, machine: str, today: str | None = None) -> str:
  today = today or datetime.date.today().isoformat()
  name = section_name(report.script)
  title = section_title(report)
  return (f"<!-- benchmarks.{name} -->\n## {title}\n\n"
          f"- Command: `{command(report.script, argv)}`\n- Machine: {machine}\n- Versions: {versions()}\n"
          f"- Date: {today}\n\n{report.text()}<!-- /benchmarks.{name} -->\n")


def update_results(report: Report, argv: Sequence[str] | None, machine: str, path: str | None = None) -> None:
  """Replace (or add) the run's section of RESULTS.md (``section_name``), keeping the others; sections follow
  ``SCRIPTS``, each script's accelerator sections after its CPU one."""
  path = path or RESULTS_PATH
  sections = {}
  if os.path.exists(path):
    with open(path) as f:
      text = f.read()
    pattern = re.compile(r"<!-- benchmarks\.([\w.]+) -->\n.*?<!-- /benchmarks\.\1 -->\n", re.DOTALL)
    sections = {match.group(1): match.group(0) for match in pattern.finditer(text)}
  sections[section_name(report.script)] = section(report, argv, machine)
  rank = {script: index for index, script in enumerate(SCRIPTS)}
  order = sorted(sections, key=lambda name: (rank.get(name.split(".")[0], len(SCRIPTS)), name))
  with open(path, "w") as f:
    f.write(RESULTS_HEADER + "".join("\n" + sections[name] for name in order))


def finish(report: Report, args: argparse.Namespace, argv: Sequence[str] | None, machine: str) -> Report:
  """Print the report; without ``--smoke`` also write it to RESULTS.md."""
  print(f"\n## {report.title}\n\n{machine}\n{versions()}\n\n{report.text()}", flush=True)
  if not args.smoke:
    update_results(report, argv, machine)
    print(f"updated {RESULTS_PATH}", flush=True)
  return report
