"""What the benchmarks measure with: timing, compile timing, compiled memory, matmul peaks and MFU, model FLOPs.

- Times are medians of ``repeats`` calls after ``warmup`` calls, each ended by ``jax.block_until_ready``;
  compilation is never inside a timed call (``compile_timed`` times it on its own).
- Competing implementations are timed in turns (``time_interleaved``) so that load from other processes falls
  on all of them alike, and compared as ``ratio(ours, reference)``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from experiments.record_store import read_cpuinfo, usable_cores
from transformer.train.writers import device_peak


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
                     budget_s: float | None = None, back_to_back: int = 1) -> dict[str, Timing]:
  """Time competing implementations side by side: name -> ``Timing`` of ``calls[name]()``.

  After ``warmup`` untimed calls of each, the timed calls go round robin, one of each per round, with the
  starting one rotated every round. Load from other processes, clock changes and cache state then fall on
  every implementation alike, rather than on whichever was timed first or last, which is what the ratios
  between them need. ``budget_s`` caps each implementation's timed calls (at least one), judged by the
  slowest warm-up call (with no warm-up, by the slowest call of the first round).

  ``back_to_back`` > 1: each timed sample is that many calls dispatched without waiting, then one wait for the
  last, reported per call; what a training loop that never waits for a step gets, host dispatch overlapping
  the device's work.
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
      for _ in range(back_to_back - 1):
        calls[name]()
      jax.block_until_ready(calls[name]())
      times[name].append((time.perf_counter() - start) / back_to_back)
    if round_index == 0 and not warmup:  # no warm-up to judge the budget by: the first round does
      repeats = within_budget(repeats, max(t[0] for t in times.values()))
    round_index += 1
  return {name: Timing(statistics.median(t), min(t), tuple(t)) for name, t in times.items()}


def ratio(ours: float, reference: float) -> float:
  """``ours / reference`` (NaN if the reference is missing or zero, so a gap is visible, never hidden)."""
  if reference is None or ours is None or reference == 0:
    return float("nan")
  return ours / reference


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
  """``(FLOP/s or None, where it comes from)`` of the default device in ``dtype``: the training log's table
  (``transformer.train.writers.DEVICE_PEAKS``) by device kind, the CPU's from ``cpu_theoretical_peak``, else unknown."""
  device = jax.devices()[0]
  if device.platform == "cpu":
    peak = cpu_theoretical_peak(dtype)
    return peak, ("cores x lanes x 2 FMA units x the clock /proc/cpuinfo reports" if peak else "unknown")
  peak, name = device_peak(device.device_kind, dtype)
  if name:
    return peak, f"{name} data sheet, dense {dtype}"
  return None, f"unknown ({device.device_kind} is not in transformer/train/writers.py DEVICE_PEAKS)"


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


def is_out_of_memory(error: BaseException) -> bool:
  """Whether ``error`` is XLA running out of device memory, compiling or running: a ``jax.errors.JaxRuntimeError``
  (``XlaRuntimeError`` before) whose message says RESOURCE_EXHAUSTED or out of memory. Any other error is a
  real one."""
  text = str(error).lower()
  return isinstance(error, jax.errors.JaxRuntimeError) and any(
      marker in text for marker in ("resource_exhausted", "resource exhausted", "out of memory"))
