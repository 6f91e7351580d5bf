"""Question 2: what does chunked attention save in memory, and what does it cost in time?

    python -m benchmarks.chunked_attention            # 1k..32k tokens, writes benchmarks/RESULTS.md
    python -m benchmarks.chunked_attention --smoke    # seconds, prints only

``transformer.ops.chunked_dot_product_attention`` (blocks of ``--chunk``) against the dense
``transformer.ops.dot_product_attention``: the peak memory XLA plans for the compiled program
(``jax.jit(f).lower(...).compile().memory_analysis()``, no execution needed) and the time of forward and
forward+backward self attention (gradients of q, k, v), batch 1, the base model's 8 heads of 64. A program
runs only if its planned peak fits in 80% of this machine's available memory; the others are reported as
not fitting. Target: 32k-token forward+backward fits with chunking where the dense one does not.
"""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp

from benchmarks import common, measure
from benchmarks.attention import forward_backward
from experiments.record_store import host_description
from transformer import ops

MEMORY_FRACTION = 0.8  # headroom for the runtime, other buffers and the measuring process itself


def add_arguments(parser):
  parser.add_argument("--lengths", type=common.positive_int, nargs="+", default=None)
  parser.add_argument("--chunk", type=common.positive_int, default=None, help="query and key block size")
  parser.add_argument("--batch", type=common.positive_int, default=1)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
  parser.add_argument("--passes", nargs="+", default=["forward", "forward+backward"],
                      choices=["forward", "forward+backward"])
  parser.add_argument("--budget_s", type=common.positive_float, default=120.0, help="time budget per measurement")


def measure_size(args, implementations: dict, shape: tuple, pass_name: str,
                 limit: float) -> tuple[dict[str, int], dict[str, float]]:
  """``(planned peak bytes, median ms)`` of each of ``implementations`` (name -> ``f(q, k, v)``) for
  ``pass_name`` self attention on q, k, v of ``shape`` ``[batch, length, heads, head_dim]``; a program whose
  peak exceeds ``limit`` bytes is compiled but not run, so it has no time."""
  abstract = [jax.ShapeDtypeStruct(shape, jnp.dtype(args.dtype))] * 3
  if pass_name != "forward":
    abstract.append(jax.ShapeDtypeStruct(shape, jnp.float32))  # the cotangent
  peaks, milliseconds = {}, {}
  for name, attention in implementations.items():
    fn = attention if pass_name == "forward" else forward_backward(attention)
    compiled, _ = measure.compile_timed(fn, *abstract)
    peaks[name] = measure.memory_stats(compiled).peak
    if peaks[name] > limit:
      continue
    keys = jax.random.split(jax.random.PRNGKey(shape[1]), len(abstract))
    inputs = [jax.random.normal(key, a.shape, jnp.float32).astype(a.dtype) for key, a in zip(keys, abstract)]
    timing = measure.time_fn(compiled, *inputs, warmup=args.warmup, repeats=args.repeats, budget_s=args.budget_s)
    milliseconds[name] = 1e3 * timing.median
    del inputs
  return peaks, milliseconds


def add_row(report: common.Report, pass_name: str, length: int, peaks: dict, milliseconds: dict) -> None:
  """The table row and ratios of one ``measure_size``: memory always, time where both ran."""
  memory_ratio = measure.ratio(peaks["chunked"], peaks["dense"])
  time_ratio = measure.ratio(milliseconds.get("chunked"), milliseconds.get("dense"))
  report.ratios[f"{pass_name} L={length} memory"] = memory_ratio
  if time_ratio == time_ratio:
    report.ratios[f"{pass_name} L={length} time"] = time_ratio

  def time_cell(name):
    return milliseconds[name] if name in milliseconds else "does not fit"

  report.rows.append([pass_name, length, measure.mib(peaks["dense"]), measure.mib(peaks["chunked"]),
                      memory_ratio, time_cell("dense"), time_cell("chunked"), time_ratio])


def run_notes(args, heads: int, head_dim: int, chunk: int, available: int, fits: dict, longest: int) -> list[str]:
  """The settings and the target's verdict; ``fits``: ``(pass, length, implementation)`` -> whether it ran."""
  target_pass = "forward+backward" if "forward+backward" in args.passes else args.passes[0]
  chunked_fits = fits.get((target_pass, longest, "chunked"))
  dense_fits = fits.get((target_pass, longest, "dense"))
  met = chunked_fits and not dense_fits
  return [
      f"Batch {args.batch}, {heads} heads of {head_dim}, {args.dtype}, blocks of {chunk}; self attention without "
      f"a mask. Peak = XLA's planned peak of the compiled program (arguments + outputs + temporaries - "
      f"aliased); runs only if it is at most {MEMORY_FRACTION:.0%} of the {measure.mib(available) / 1024:.1f} GiB "
      f"available here. Times: median of up to {args.repeats} calls after {args.warmup} warm-up "
      f"(fewer when a call is long; budget {args.budget_s:.0f} s).",
      f"Target ({target_pass} at {longest} tokens fits with chunking where dense does not): chunked "
      f"{'fits' if chunked_fits else 'does not fit'}, dense {'fits' if dense_fits else 'does not fit'} "
      f"({'met' if met else 'not met'}).",
  ]


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  machine = host_description(load_average=True)
  heads, head_dim = (2, 8) if args.smoke else (8, 64)
  lengths = args.lengths or ([64] if args.smoke else [1024, 2048, 4096, 8192, 16384, 32768])
  chunk = args.chunk or (16 if args.smoke else 512)
  available = measure.available_memory_bytes()
  limit = MEMORY_FRACTION * available

  def chunked(q, k, v):
    return ops.chunked_dot_product_attention(q, k, v, query_chunk_size=chunk, key_chunk_size=chunk)

  implementations = {"dense": ops.dot_product_attention, "chunked": chunked}
  report = common.Report(
      "chunked_attention", "Chunked vs dense attention: peak memory and time (benchmarks/chunked_attention.py)",
      ["pass", "length", "dense peak MiB", "chunked peak MiB", "chunked / dense memory", "dense ms",
       "chunked ms", "chunked / dense time"])
  fits = {}
  for pass_name in args.passes:
    for length in lengths:
      peaks, milliseconds = measure_size(args, implementations, (args.batch, length, heads, head_dim), pass_name,
                                         limit)
      add_row(report, pass_name, length, peaks, milliseconds)
      fits.update({(pass_name, length, name): peak <= limit for name, peak in peaks.items()})
  report.notes += run_notes(args, heads, head_dim, chunk, available, fits, max(lengths))
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
