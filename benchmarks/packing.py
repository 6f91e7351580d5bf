"""Packing vs length buckets: the share of positions holding real tokens, and real tokens per second of training.

    python -m benchmarks.packing --data_dir=../shared/data/multi30k   # Multi30k's transformer_small: minutes
    python -m benchmarks.packing --smoke                               # generated pairs, a tiny model (tests)

The training pairs of ``experiments/multi30k.py:transformer_small`` (prepared and tokenised as training does,
into a temporary TFDS folder) batched two ways by ``TokenBatcher``: in length buckets (the experiment's
setting) and packed (``config.task.pack``, ``transformer/data/packing.py``), both with its ``max_tokens`` and
``max_length``. For each, over one epoch: the share of source and target positions holding real tokens
(``1 - padding_fraction``), the batch shapes, and the time of the epoch's train steps: the step compiled for each
shape and timed on a batch of it (median of ``--repeats`` after ``--warmup``), times that shape's batches in the
epoch, summed; real tokens per second is the epoch's real tokens over that sum. Compilation is reported apart
(every bucket shape is a program of its own). Both are timed in this process, taking turns.

Target: packed rows hold >= 95% real tokens.
"""
from __future__ import annotations

import collections
import sys
import tempfile


from benchmarks import common, measure
from benchmarks.input_pipeline import generated_pairs
from benchmarks.time_to_bleu import find_data_dir
from benchmarks.train_step import compile_step, experiment_config
from experiments.record_store import host_description
from transformer.data import batching
from transformer.errors import UserError
from transformer.train.config import build_task

TARGET_SHARE = 0.95
SMOKE_TASK = dict(max_tokens=256, max_length=32)


def add_arguments(parser):
  parser.add_argument("--data_dir", default="", help="raw Multi30k files (as benchmarks/time_to_bleu.py)")
  parser.add_argument("--pack_lengths", type=common.positive_int, nargs="+", default=None,
                      help="packed rows of these max_length values, each a row of the table (default: the "
                           "experiment's max_length, and 64 and 32 below it)")


def training_pairs(args, config) -> batching.TokenizedExamples:
  """Multi30k's tokenised training pairs (generated ones of its mean lengths with ``--smoke``)."""
  if args.smoke:
    return generated_pairs(300, 13.0, 15.0, 64)
  config.task.source_dir = find_data_dir(args.data_dir)
  with tempfile.TemporaryDirectory(prefix="packing-tfds-") as tfds_dir:  # the pairs are read into memory
    config.task.data_dir = tfds_dir
    return build_task(config).data.train


def epoch_shapes(batcher) -> collections.Counter:
  """``(rows, source length, target length)`` -> batches of that shape in epoch 0."""
  shapes = collections.Counter()
  for plan in batcher.epoch_batches(0):
    batch = batcher.make_batch(plan)
    shapes[(*batch["source"].shape, batch["target"].shape[1])] += 1
  return shapes


def time_epoch(args, config, model, batcher) -> dict:
  """The epoch's step seconds (each shape's step time x its batches), compile seconds, and shape count."""
  shapes = epoch_shapes(batcher)
  first_batch = {}
  for plan in batcher.epoch_batches(0):
    batch = batcher.make_batch(plan)
    first_batch.setdefault((*batch["source"].shape, batch["target"].shape[1]), batch)
  step_seconds = compile_seconds = 0.0
  for shape, count in shapes.items():
    step = compile_step(config, model, first_batch[shape], smoke=args.smoke)
    compile_seconds += step.compile_seconds
    step_seconds += count * step.time(args.warmup, args.repeats).median
  return dict(step_seconds=step_seconds, compile_seconds=compile_seconds, shapes=len(shapes),
              batches=sum(shapes.values()))


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  if not args.smoke:
    measure.disable_persistent_cache()
  machine = host_description(load_average=True)
  config, model_config = experiment_config("transformer_small", args.smoke)  # its 8,000-piece vocabulary
  if args.smoke:
    for name, value in SMOKE_TASK.items():
      config.task[name] = value
  try:
    examples = training_pairs(args, config)
  except UserError as error:
    sys.exit(f"error: {error}")
  task = config.task
  model = build_task(config).build_model(model_config)
  report = common.Report(
      "packing", "Packing vs length buckets: real tokens per position and per second (benchmarks/packing.py)",
      ["batching", "batch shapes", "batches per epoch", "real-token share %", "epoch step s", "real tokens/s",
       "compile s (all shapes)", "tokens/s / buckets"])
  pack_lengths = args.pack_lengths or ([task.max_length, 16] if args.smoke else [task.max_length, 64, 32])
  variants = {"length buckets": (task.max_length, False),
              **{f"packed, rows of {length}": (length, True) for length in pack_lengths}}
  measured = {}
  for name, (max_length, pack) in variants.items():
    batcher = batching.TokenBatcher(examples, max_tokens=task.max_tokens, max_length=max_length, seed=0,
                                    batch_size_multiple=task.batch_size_multiple, pack=pack)
    real_tokens = int(examples.source_lengths[batcher.bucket_ids >= 0].sum()
                      + examples.target_lengths[batcher.bucket_ids >= 0].sum())
    timing = time_epoch(args, config, model, batcher)
    measured[name] = dict(share=1.0 - batcher.padding_fraction(), rate=real_tokens / timing["step_seconds"],
                          dropped=batcher.num_dropped, **timing)
    print(f"{name}: {timing['shapes']} shapes, {100 * measured[name]['share']:.1f}% real tokens, "
          f"{measured[name]['rate']:,.0f} real tokens/s", flush=True)
  for name, result in measured.items():
    speedup = measure.ratio(result["rate"], measured["length buckets"]["rate"])
    report.rows.append([name, result["shapes"], result["batches"], 100 * result["share"], result["step_seconds"],
                        result["rate"], result["compile_seconds"], speedup])
    if name != "length buckets":
      report.ratios[f"{name} / buckets tokens/s"] = speedup
  dropped = ", ".join(f"{result['dropped']} {name}" for name, result in measured.items())
  shares = {name: result["share"] for name, result in measured.items() if name != "length buckets"}
  report.notes += [
      f"{'Generated pairs (smoke)' if args.smoke else 'Multi30k en-de training pairs'}: {len(examples):,}; "
      f"multi30k.py:transformer_small's max_tokens {task.max_tokens} and max_length {task.max_length} (packed "
      f"rows: the max_length named); dropped as too long: {dropped}. Step times: median of {args.repeats} after "
      f"{args.warmup} warm-up per shape. Attention, its dropout included, spans the whole row: a longer row costs "
      f"more per token, which the rows of other lengths show.",
      f"Target (packed rows hold >= {TARGET_SHARE:.0%} real tokens): "
      + ", ".join(f"{name} {100 * share:.1f}% ({'met' if share >= TARGET_SHARE else 'not met'})"
                  for name, share in shares.items()) + ".",
  ]
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
