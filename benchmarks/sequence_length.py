"""Question 6b: how does train-step time grow with sequence length, and where does chunked attention win?

    python -m benchmarks.sequence_length            # writes benchmarks/RESULTS.md
    python -m benchmarks.sequence_length --smoke    # seconds, prints only

The translation train step (``benchmarks.train_step.compile_step``) at source = target length ``L`` with a
fixed budget of ``--tokens`` tokens per side (batch = tokens / L), once with ``attention_implementation``
"dense" and once "chunked" (blocks of ``--chunk``). Dropout is off in both, since attention dropout needs
the dense weights. At a fixed token count every part of the step costs the same at every ``L`` except
attention, whose ``L x L`` scores make it grow with ``L`` (quadratic per sequence, linear in ``L`` at a fixed
token count). So the dense time above the shortest length's, ``(t(L) - t(L_min)) / t(L)``, is the share of
the step that attention's growth costs, set beside attention's share of the model FLOPs; the model FLOP/s
per length shows where the dense kernel stops keeping pace with its FLOPs (its ``L x L`` weights leave the
caches). No straight line is fitted: one did not hold at 4,096 tokens. Each program runs only if XLA's
planned peak memory fits in 80% of the available memory.
The train step's compile time (question 6a) is measured in ``benchmarks.train_step``.
"""
from __future__ import annotations

import sys

import numpy as np

from benchmarks import common, measure
from benchmarks.chunked_attention import MEMORY_FRACTION
from benchmarks.train_step import compile_step, experiment_config, random_batch
from experiments.record_store import host_description
from transformer.nn.config import transformer_flops
from transformer.train.config import build_task


def add_arguments(parser):
  parser.add_argument("--config", default="transformer_small", choices=["transformer_small", "transformer_base"])
  parser.add_argument("--lengths", type=common.positive_int, nargs="+", default=[64, 128, 256, 512, 1024, 2048, 4096])
  parser.add_argument("--tokens", type=common.positive_int, default=4096, help="tokens per side per batch")
  parser.add_argument("--chunk", type=common.positive_int, default=512, help="attention block size of the chunked runs")
  parser.add_argument("--budget_s", type=common.positive_float, default=120.0, help="time budget per measurement")


def growth_share(lengths, seconds) -> list[float]:
  """``(t(L) - t(L_min)) / t(L)`` per length: the share of each time above the shortest length's time.

  At a fixed token count only attention's cost grows with ``L``, so this is the share of the step spent on
  attention's growth since ``L_min`` (a lower bound on attention's share: ``t(L_min)`` holds some too).
  Empty when no length was measured (the dense step fitted in memory at none of them).
  """
  if not lengths:
    return []
  shortest = seconds[int(np.argmin(lengths))]
  return [(time - shortest) / time for time in seconds]


def measure_length(args, length: int, tokens: int, chunk: int, limit: float) -> dict:
  """The dense and the chunked train step at source = target length ``length``, ``tokens // length`` examples:
  ``length``, ``batch``, the model ``flops``, each implementation's planned ``peak`` and ``compile`` seconds, and
  its median step seconds (under its own name) when the peak fits in ``limit`` bytes."""
  batch_size = max(1, tokens // length)
  row = {"length": length, "batch": batch_size}
  for implementation in ("dense", "chunked"):
    config, model_config = experiment_config(args.config, smoke=args.smoke, no_dropout=True,
                                             attention_implementation=implementation, attention_chunk_size=chunk)
    model_config = model_config.replace(max_length=max(model_config.max_length, length))
    if implementation == "dense":
      row["flops"] = transformer_flops(model_config, batch_size, length, length)
    batch = random_batch(batch_size, length, length, model_config.vocab_size)
    step = compile_step(config, build_task(config).build_model(model_config), batch, smoke=args.smoke)
    row[f"{implementation} peak"] = measure.memory_stats(step.compiled).peak
    row[f"{implementation} compile"] = step.compile_seconds
    if row[f"{implementation} peak"] <= limit:
      row[implementation] = step.time(args.warmup, args.repeats, args.budget_s).median
    del step
  return row


def build_report(args, results: list[dict], tokens: int, chunk: int) -> common.Report:
  """The table, ratios and notes of the ``measure_length`` rows ``results``."""
  measured = [row for row in results if "dense" in row]
  shares = dict(zip([row["length"] for row in measured],
                    growth_share([row["length"] for row in measured], [row["dense"] for row in measured])))
  report = common.Report(
      "sequence_length", "Train-step time vs sequence length, dense vs chunked (benchmarks/sequence_length.py)",
      ["length", "batch", "dense ms", "chunked ms", "chunked / dense time", "dense peak MiB", "chunked peak MiB",
       "dense compile s", "dense time above shortest L %", "attention share of FLOPs %",
       "dense model GFLOP/s"])
  wins = []
  for row in results:
    value = measure.ratio(row.get("chunked"), row.get("dense"))
    if value == value:
      report.ratios[f"L={row['length']} chunked / dense time"] = value
    if (value == value and value < 1.0) or ("chunked" in row and "dense" not in row):
      wins.append(row["length"])
    flops = row["flops"]
    report.rows.append([
        row["length"], row["batch"],
        1e3 * row["dense"] if "dense" in row else "does not fit",
        1e3 * row["chunked"] if "chunked" in row else "does not fit",
        value, measure.mib(row["dense peak"]), measure.mib(row["chunked peak"]), row["dense compile"],
        100 * shares[row["length"]] if row["length"] in shares else None,
        100 * flops["attention"] / flops["total"],
        flops["total"] / row["dense"] / 1e9 if "dense" in row else None])

  report.notes += [
      f"{args.config}{' (smoke size)' if args.smoke else ''}, {tokens} source + {tokens} target tokens per batch, "
      f"float32, no dropout, chunk {chunk}; median of up to {args.repeats} steps after {args.warmup} warm-up.",
      "At a fixed token count only attention's L x L work per sequence grows with L: 'dense time above "
      "shortest L' is (t(L) - t(L_min)) / t(L), the share of the step that growth costs; 'dense model GFLOP/s' "
      "is the model FLOPs (transformer.nn.transformer_flops) over the dense time.",
      f"Chunked is faster or the only one that fits at L = {wins if wins else 'none of the lengths measured'}.",
  ]
  return report


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  if not args.smoke:
    measure.disable_persistent_cache()
  machine = host_description(load_average=True)
  lengths = [16] if args.smoke else args.lengths  # one compile pair: smoke time is mostly compilation
  tokens = 32 if args.smoke else args.tokens
  chunk = 8 if args.smoke else args.chunk
  limit = MEMORY_FRACTION * measure.available_memory_bytes()
  results = [measure_length(args, length, tokens, chunk, limit) for length in lengths]
  return common.finish(build_report(args, results, tokens, chunk), args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
