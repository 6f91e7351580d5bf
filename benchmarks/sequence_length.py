"""Question 6b: how does train-step time grow with sequence length, and where does chunked attention win?

    python -m benchmarks.sequence_length            # writes benchmarks/RESULTS.md
    python -m benchmarks.sequence_length --smoke    # seconds, prints only

The translation train step (``benchmarks.train_step.compile_step``) at source = target length ``L`` with a
fixed budget of ``--tokens`` tokens per side (batch = tokens / L), once with ``attention_implementation``
"dense" and once "chunked" (blocks of ``--chunk``). Dropout is off in both, since attention dropout needs
the dense weights. At a fixed token count every part of the step costs the same at every ``L`` except
attention, whose ``L x L`` scores make it grow with ``L``: the dense times are fitted by
``t(L) = a + b * L`` and ``b * L / t`` (the quadratic term's share) is set beside attention's share of the
model FLOPs. Each program runs only if XLA's planned peak memory fits in 80% of the available memory.
The train step's compile time (question 6a) is measured in ``benchmarks.train_step``.
"""
from __future__ import annotations

import sys

import numpy as np

from benchmarks import common
from benchmarks.chunked_attention import MEMORY_FRACTION
from benchmarks.train_step import compile_step, experiment_config, random_batch
from transformer.tasks import build_task


def add_arguments(parser):
  parser.add_argument("--config", default="transformer_small", choices=["transformer_small", "transformer_base"])
  parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048, 4096])
  parser.add_argument("--tokens", type=int, default=4096, help="tokens per side per batch")
  parser.add_argument("--chunk", type=int, default=512, help="attention block size of the chunked runs")
  parser.add_argument("--budget_s", type=float, default=120.0, help="time budget per measurement")


def fit_linear(lengths, seconds) -> tuple[float, float]:
  """Least-squares ``(a, b)`` of ``seconds = a + b * length`` (NaN with fewer than two points)."""
  if len(lengths) < 2:
    return float("nan"), float("nan")
  design = np.stack([np.ones(len(lengths)), np.asarray(lengths, float)], axis=1)
  (a, b), *_ = np.linalg.lstsq(design, np.asarray(seconds, float), rcond=None)
  return float(a), float(b)


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  if not args.smoke:
    common.disable_persistent_cache()
  machine = common.machine_description()
  lengths = [16] if args.smoke else args.lengths  # one compile pair: smoke time is mostly compilation
  tokens = 32 if args.smoke else args.tokens
  chunk = 8 if args.smoke else args.chunk
  limit = MEMORY_FRACTION * common.available_memory_bytes()

  results = []
  for length in lengths:
    batch_size = max(1, tokens // length)
    row = {"length": length, "batch": batch_size}
    for implementation in ("dense", "chunked"):
      config, model_config = experiment_config(args.config, smoke=args.smoke, no_dropout=True,
                                               attention_implementation=implementation, attention_chunk_size=chunk)
      model_config = model_config.replace(max_length=max(model_config.max_length, length))
      if implementation == "dense":
        row["attention share"] = (lambda f: f["attention"] / f["total"])(
            common.encoder_decoder_flops(model_config, batch_size, length, length))
      batch = random_batch(batch_size, length, length, model_config.vocab_size)
      step = compile_step(config, build_task(config).build_model(model_config), batch, smoke=args.smoke)
      row[f"{implementation} peak"] = common.memory_stats(step.compiled).peak
      row[f"{implementation} compile"] = step.compile_seconds
      if row[f"{implementation} peak"] <= limit:
        row[implementation] = step.time(args.warmup, args.repeats, args.budget_s).median
      del step
    results.append(row)

  measured = [row for row in results if "dense" in row]
  a, b = fit_linear([row["length"] for row in measured], [row["dense"] for row in measured])
  report = common.Report(
      "sequence_length", "Train-step time vs sequence length, dense vs chunked (benchmarks/sequence_length.py)",
      ["length", "batch", "dense ms", "chunked ms", "chunked / dense time", "dense peak MiB", "chunked peak MiB",
       "dense compile s", "L-term share of dense time %", "attention share of FLOPs %"])
  wins = []
  for row in results:
    value = common.ratio(row.get("chunked"), row.get("dense"))
    if value == value:
      report.ratios[f"L={row['length']} chunked / dense time"] = value
    if (value == value and value < 1.0) or ("chunked" in row and "dense" not in row):
      wins.append(row["length"])
    fitted = a + b * row["length"]
    report.rows.append([
        row["length"], row["batch"],
        1e3 * row["dense"] if "dense" in row else "does not fit",
        1e3 * row["chunked"] if "chunked" in row else "does not fit",
        value, common.mib(row["dense peak"]), common.mib(row["chunked peak"]), row["dense compile"],
        100 * b * row["length"] / fitted if fitted else None, 100 * row["attention share"]])

  report.notes += [
      f"{args.config}{' (smoke size)' if args.smoke else ''}, {tokens} source + {tokens} target tokens per batch, "
      f"float32, no dropout, chunk {chunk}; median of up to {args.repeats} steps after {args.warmup} warm-up.",
      f"Dense fit t(L) = {1e3 * a:,.2f} ms + {1e3 * b:,.4f} ms x L: at a fixed token count, the L-proportional "
      f"term is attention's L x L work per sequence (quadratic in L per sequence).",
      f"Chunked is faster or the only one that fits at L = {wins if wins else 'none of the lengths measured'}.",
  ]
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
