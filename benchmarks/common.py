"""What every benchmark shares: flags, timing, compiled-memory analysis, matmul peak, FLOP counts, reports.

Conventions of the scripts in this folder:

- ``python -m benchmarks.<name>`` measures at full size, prints its table and writes its own section (command,
  machine, JAX version, date, table) of ``RESULTS.md`` in ``--output_dir`` (default: a new folder
  ``runs/benchmarks-<time>/``, printed at the end); the committed ``benchmarks/RESULTS.md`` is written only
  with ``--update_committed``. ``--smoke`` shrinks every size to something that runs in seconds (what the
  tests run) and writes nothing unless ``--output_dir`` is given.
- ``--time_budget_s``: a script checks ``out_of_time(args)`` between measurements and stops adding rows once
  the budget is spent (a note says what was left out), so a run with a deadline still writes its table.
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
import re
import shlex
import statistics
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# The library of every results page: its output flags, machine stamp and the repository root.
from experiments.report import (REPO, add_output_arguments, choose_results_folder, host_description,
                                markdown_table, read_cpuinfo, usable_cores, versions)

BENCHMARKS_DIR = os.path.dirname(os.path.abspath(__file__))
RESULTS_PATH = os.path.join(BENCHMARKS_DIR, "RESULTS.md")  # the committed page (written with --update_committed)
# Sections of RESULTS.md, in the order of the questions (benchmarks/README.md); the suite's summary first.
SCRIPTS = ("suite", "attention", "chunked_attention", "train_step", "step_profile", "decoding", "input_pipeline",
           "sequence_length", "replicas", "time_to_bleu", "loop_overhead")
RESULTS_HEADER = ("# Benchmark results\n\nWritten by the scripts in `benchmarks/` (one section each, replaced "
                  "when the script runs again into the same page: `--output_dir`, or `--update_committed` for "
                  "benchmarks/RESULTS.md); do not edit by hand.\n")


# ----------------------------------------------------------------------------------------------- flags

def parse_args(description: str, argv: Sequence[str] | None,
               add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
  """The flags every script has (``--smoke``, ``--repeats``, ``--warmup``) plus its own."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--smoke", action="store_true",
                      help="tiny sizes and one repeat, for tests; writes RESULTS.md only if --output_dir is given")
  parser.add_argument("--repeats", type=int, default=None, help="timed calls per measurement (median)")
  parser.add_argument("--warmup", type=int, default=None, help="untimed calls before timing")
  add_output_arguments(parser, "a new folder runs/benchmarks-<time>/ in the repository", force=False)
  parser.add_argument("--time_budget_s", type=float, default=None,
                      help="stop adding measurements once this many seconds have passed (the table so far is "
                           "written, with a note); default: no limit")
  if add_arguments is not None:
    add_arguments(parser)
  args = parser.parse_args(list(argv) if argv is not None else None)
  args.started = time.monotonic()
  if args.smoke and args.update_committed:
    parser.error("--smoke numbers mean nothing: it never writes the committed benchmarks/RESULTS.md "
                 "(leave out --update_committed)")
  from transformer.errors import UserError
  try:  # decided before measuring: a wrong combination stops now, not after minutes of it
    args.results_path = results_path(args)
  except UserError as error:
    parser.error(str(error))
  if args.repeats is None:
    args.repeats = 1 if args.smoke else 5
  if args.warmup is None:
    args.warmup = 1
  if args.repeats < 1 or args.warmup < 0:
    parser.error(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}.")
  return args


def default_output_dir() -> str:
  """A new folder per run under the git-ignored ``runs/`` of the repository."""
  return os.path.join(REPO, "runs", "benchmarks-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))


def results_path(args: argparse.Namespace) -> str | None:
  """The RESULTS.md a run writes: the committed one with ``--update_committed``, else ``--output_dir``'s (its
  default a new folder); ``None`` for a ``--smoke`` run without ``--output_dir`` (it writes nothing).

  Raises:
    UserError: both flags, or an ``--output_dir`` that is the committed folder.
  """
  if args.smoke and not args.output_dir:
    return None
  folder = choose_results_folder(args.output_dir, args.update_committed, False, BENCHMARKS_DIR,
                                 default_output_dir())
  return os.path.join(folder, "RESULTS.md")


def out_of_time(args: argparse.Namespace) -> bool:
  """Whether the run's ``--time_budget_s`` is spent (never, without one)."""
  budget = getattr(args, "time_budget_s", None)
  return budget is not None and time.monotonic() - args.started > budget


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
  at the default precision, from the median call. On CPU the issue's reference is float32 at 2048."""
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  a, b = (jax.random.normal(key, (size, size), dtype) for key in keys)
  timing = time_fn(jax.jit(jnp.matmul), a, b, warmup=warmup, repeats=repeats)
  return 2.0 * size**3 / timing.median


def best_matmul_flops(sizes: Sequence[int], dtype, warmup: int = 1, repeats: int = 5) -> tuple[float, int]:
  """``(FLOP/s, size)``: the fastest call of ``repeats`` at each of ``sizes`` square matmuls, the best size.
  The best of several sizes and calls, not a median: a measured peak that is too low makes MFU look too high,
  the error this guards against."""
  best, best_size = 0.0, sizes[0]
  matmul = jax.jit(jnp.matmul)
  for size in sizes:
    keys = jax.random.split(jax.random.PRNGKey(size), 2)
    a, b = (jax.random.normal(key, (size, size), dtype) for key in keys)
    flops = 2.0 * size**3 / time_fn(matmul, a, b, warmup=warmup, repeats=repeats).minimum
    if flops > best:
      best, best_size = flops, size
  return best, best_size


def peak_matmul_sizes(smoke: bool = False) -> tuple[int, ...]:
  """Square matmul sides the measured peak takes the best of: large enough to be compute bound here."""
  if smoke:
    return (64, 128)
  return (1024, 2048) if jax.default_backend() == "cpu" else (4096, 8192, 16384)


# Dense (no sparsity) tensor-core peaks in FLOP/s by device kind, first match wins (NVIDIA data sheets).
# float32 matmuls at JAX's default precision may use TF32 tensor cores on these GPUs: the TF32 peak is the
# upper bound for them.
GPU_PEAKS = (
    ("H100 PCIe", {"bfloat16": 756e12, "float32": 378e12}),
    ("H100 NVL", {"bfloat16": 835e12, "float32": 418e12}),
    ("H100", {"bfloat16": 989e12, "float32": 494e12}),  # SXM
    ("H200", {"bfloat16": 989e12, "float32": 494e12}),
    ("A100", {"bfloat16": 312e12, "float32": 156e12}),
)


def cpu_theoretical_peak(dtype: str, cpuinfo: dict[str, str] | None = None, cores: int | None = None) -> float | None:
  """An upper bound of this CPU's matmul FLOP/s: cores x vector lanes x 2 (a fused multiply-add) x 2 FMA units x
  clock, from /proc/cpuinfo's flags and clock; ``None`` (unknown) where they are not readable.

  Lanes: 16 float32 with AVX-512, 8 with AVX2, 4 otherwise; bfloat16 doubles them only with ``avx512_bf16``
  (XLA:CPU otherwise computes in float32). Two FMA units and every logical core counted, to be an upper bound,
  which is what a sanity check of MFU needs (above it, the measurement is wrong); but a CPU may run above the
  clock it reports (turbo, or a virtual machine's nominal clock), so ``Peaks`` drops a theoretical peak that
  the measured matmul beats.
  """
  info = read_cpuinfo() if cpuinfo is None else cpuinfo
  flags = set(info.get("flags", "").split())
  if not flags or "max MHz" not in info:
    return None
  lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
  if dtype == "bfloat16" and "avx512_bf16" in flags:
    lanes *= 2
  fma = 2 if "fma" in flags or "avx512f" in flags else 1
  return (cores or usable_cores()) * lanes * 2 * fma * float(info["max MHz"]) * 1e6


def theoretical_peak(dtype: str) -> tuple[float | None, str]:
  """``(FLOP/s or None, where it comes from)`` of the default device in ``dtype``: the GPU table
  (``GPU_PEAKS``) by device kind, the CPU's from ``cpu_theoretical_peak``, else unknown."""
  device = jax.devices()[0]
  if device.platform == "cpu":
    peak = cpu_theoretical_peak(dtype)
    return peak, ("cores x lanes x 2 FMA units x the clock /proc/cpuinfo reports" if peak else "unknown")
  for name, peaks in GPU_PEAKS:
    if name.lower() in device.device_kind.lower():
      return peaks.get(dtype), f"{name} data sheet, dense {dtype}"
  return None, f"unknown ({device.device_kind} is not in benchmarks/common.py GPU_PEAKS)"


@dataclasses.dataclass
class Peaks:
  """The matmul peaks a run's MFU is measured against: measured (best of several sizes and calls, ``before``
  and ``after`` the timed steps: a device that throttled or was shared in between shows as a gap) and
  theoretical (data sheet or CPU formula; ``None``: unknown)."""
  dtype: str
  sizes: tuple[int, ...]
  before: float
  after: float | None = None
  theoretical: float | None = None
  theoretical_source: str = "unknown"

  @property
  def measured(self) -> float:
    return max(self.before, self.after or 0.0)

  @property
  def theoretical_below_measured(self) -> bool:
    """A theoretical peak under the measured one is wrong, not the matmul: e.g. a CPU that runs above the
    clock /proc/cpuinfo reports (turbo; a virtual machine shows the nominal clock). It is then not used."""
    return bool(self.theoretical) and self.theoretical < self.measured

  def measure_after(self, warmup: int = 1, repeats: int = 5) -> None:
    self.after, _ = best_matmul_flops(self.sizes, jnp.dtype(self.dtype), warmup, repeats)

  def mfu(self, flops_per_second: float) -> tuple[float, float | None]:
    """``(MFU against the measured peak, MFU against the theoretical one or None)``."""
    usable = self.theoretical and not self.theoretical_below_measured
    theoretical = flops_per_second / self.theoretical if usable else None
    return flops_per_second / self.measured, theoretical

  def describe(self) -> str:
    after = f", after {self.after / 1e12:,.3f}" if self.after is not None else ""
    theoretical = (f"{self.theoretical / 1e12:,.3f} TFLOP/s ({self.theoretical_source})" if self.theoretical
                   else self.theoretical_source)
    if self.theoretical_below_measured:
      theoretical += (", below the measured peak, so wrong for this machine (e.g. a clock above the one "
                      "reported) and not used")
    return (f"{self.dtype} matmul peak measured as the fastest call at sides {', '.join(map(str, self.sizes))}: "
            f"before the timed steps {self.before / 1e12:,.3f} TFLOP/s{after}, MFU uses the higher; "
            f"theoretical {theoretical}")


def measure_peaks(dtype: str, smoke: bool = False, warmup: int = 1, repeats: int = 5,
                  sizes: Sequence[int] | None = None) -> Peaks:
  """``Peaks`` with the measured peak before the timed steps (call ``measure_after`` after them); ``sizes``
  default ``peak_matmul_sizes``."""
  sizes = tuple(sizes or peak_matmul_sizes(smoke))
  before, _ = best_matmul_flops(sizes, jnp.dtype(dtype), warmup, repeats)
  theoretical, source = theoretical_peak(dtype)
  return Peaks(dtype, sizes, before, None, theoretical, source)


def mfu_error(name: str, measured_mfu: float, theoretical_mfu: float | None) -> str | None:
  """A note when an MFU is above 100% against either peak: then the FLOP count, the timing or the peak is
  wrong, and the number is a measurement error, not a result; ``None`` when both are plausible."""
  above = [f"{value:.0%} of the {which} peak" for which, value in (("measured", measured_mfu),
                                                                    ("theoretical", theoretical_mfu))
           if value is not None and value > 1.0]
  if not above:
    return None
  return (f"{name}: MFU {' and '.join(above)} is a measurement error (above 100%), not a result: the FLOP "
          "count, the timing or the peak is wrong.")


def mfu_cell(measured_mfu: float, theoretical_mfu: float | None):
  """A table cell for an MFU in percent: the number, or a marked error above 100% against either peak."""
  if mfu_error("", measured_mfu, theoretical_mfu):
    return f"error ({100 * measured_mfu:.0f})"
  return 100 * measured_mfu


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
    return markdown_table(self.header, [[fmt(cell) for cell in row] for row in self.rows])

  def text(self) -> str:
    notes = "\n".join(f"- {note}" for note in self.notes)
    return f"{self.table()}\n\n{notes}\n" if notes else f"{self.table()}\n"


def machine_description() -> str:
  """The machine line of a section: ``report.host_description`` with the load average at the start."""
  return host_description(load_average=True)


# Flags that say where a run's page goes, not what it measured: left out of the command a section records.
_WHERE_FLAGS = ("--output_dir", "--update_committed")


def command(script: str, argv: Sequence[str] | None) -> str:
  arguments, skip_value = [], False
  for argument in (list(argv) if argv is not None else sys.argv[1:]):
    if skip_value:
      skip_value = False
      continue
    name = argument.partition("=")[0]
    if name in _WHERE_FLAGS:
      skip_value = name == "--output_dir" and "=" not in argument
      continue
    arguments.append(argument)
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


SECTION_PATTERN = re.compile(r"<!-- benchmarks\.([\w.]+) -->\n.*?<!-- /benchmarks\.\1 -->\n", re.DOTALL)


def read_sections(path: str) -> dict[str, str]:
  """``{section name: its text}`` of a RESULTS.md page (empty when the file does not exist)."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return {match.group(1): match.group(0) for match in SECTION_PATTERN.finditer(f.read())}


def write_sections(new_sections: Mapping[str, str], path: str | None = None) -> None:
  """Replace (or add) ``new_sections`` in the page at ``path``, keeping the others; sections follow
  ``SCRIPTS``, each script's accelerator sections after its CPU one."""
  path = path or RESULTS_PATH
  sections = {**read_sections(path), **new_sections}
  rank = {script: index for index, script in enumerate(SCRIPTS)}
  order = sorted(sections, key=lambda name: (rank.get(name.split(".")[0], len(SCRIPTS)), name))
  with open(path, "w") as f:
    f.write(RESULTS_HEADER + "".join("\n" + sections[name] for name in order))


def update_results(report: Report, argv: Sequence[str] | None, machine: str, path: str | None = None) -> None:
  """Replace (or add) the run's section of RESULTS.md (``section_name``), keeping the others."""
  write_sections({section_name(report.script): section(report, argv, machine)}, path)


def finish(report: Report, args: argparse.Namespace, argv: Sequence[str] | None, machine: str) -> Report:
  """Print the report and write its section of ``results_path(args)`` (nothing for a bare ``--smoke``)."""
  print(f"\n## {report.title}\n\n{machine}\n{versions()}\n\n{report.text()}", flush=True)
  path = args.results_path
  if path is not None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    update_results(report, argv, machine, path)
    print(f"wrote its section of {path}", flush=True)
  return report
