"""Question 8: do seeds trained as one vmapped program cost less than training them one after another?

    python -m benchmarks.replicas            # the Multi30k ablations' two models, writes RESULTS.md
    python -m benchmarks.replicas --smoke    # tiny models, prints only

The ablations (experiments/ablations) train each cell's seeds as one ``jax.vmap``ped program
(``config.num_seeds``: ``Strategy`` with ``num_replicas``). For both models of their Multi30k base
(``experiments/ablations/common.py``'s ``multi30k_base``: ``transformer_small`` and the GRU encoder-decoder
``gru_bahdanau`` at its full width, hidden 512, where rnn_attention's Multi30k cells run at half width;
vocabulary 8,000, dropout as configured) this compiles the train step of one replica and
of ``--replicas`` replicas for the same batch of ``--batch`` x ``--length`` source and target tokens (a
Multi30k bucket's shape: 128 x 32 is one of the 4,096-token buckets), and times them in turns. The ratio
``t(N replicas) / (N x t(1 replica))`` is below 1 where one vmapped program saves time (one dispatch, larger
matmuls) and above 1 where it is slower than running the seeds one after another, which would make the
ablations' grids slower than separate runs.
"""
from __future__ import annotations

import sys

from benchmarks import common, measure
from benchmarks.train_step import SMOKE_MODEL, compile_step, random_batch
from experiments.ablations.common import NUM_SEEDS, multi30k_base
from experiments.record_store import host_description
from transformer.train.config import build_task

MODELS = ("transformer", "rnn")  # multi30k_base's model names
VOCAB_SIZE = 8000
SMOKE_RNN = {"embedding_dim": 8, "hidden_dim": 16}


def add_arguments(parser):
  parser.add_argument("--models", nargs="+", default=None, choices=MODELS,
                      help="default: both; with --smoke the Transformer only (compilation is most of its time)")
  parser.add_argument("--replicas", type=common.positive_int, default=NUM_SEEDS,
                      help="replicas in the vmapped step (the ablations' seeds per cell)")
  parser.add_argument("--batch", type=common.positive_int, default=128, help="sentences per batch")
  parser.add_argument("--length", type=common.positive_int, default=32, help="source and target tokens")
  parser.add_argument("--budget_s", type=common.positive_float, default=120.0, help="time budget per measurement")


def base_config(model_name: str, smoke: bool):
  """``(config, model_config)``: the Multi30k ablation base of ``model_name`` at ``VOCAB_SIZE``; ``smoke``
  shrinks the model to a few thousand parameters (same code)."""
  config = multi30k_base(model_name)
  if smoke:
    for name, value in (SMOKE_MODEL if model_name == "transformer" else SMOKE_RNN).items():
      config.model[name] = value
  model_config = build_task(config).make_model_config(
      vocab_size=64 if smoke else VOCAB_SIZE, target_vocab_size=None, share_embeddings=True, pad_id=0,
      bos_id=1, eos_id=2)
  return config, model_config


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  if not args.smoke:
    measure.disable_persistent_cache()
  machine = host_description(load_average=True)
  batch_size, length = (4, 8) if args.smoke else (args.batch, args.length)
  replicas = args.replicas

  report = common.Report(
      "replicas", "Seeds in one vmapped program vs one at a time (benchmarks/replicas.py)",
      ["model", "parameters per replica", "1 replica ms", f"{replicas} replicas ms",
       f"{replicas} replicas / ({replicas} x 1 replica)", "1 replica compile s", f"{replicas} replicas compile s"])
  left_out = []
  for model_name in args.models or (MODELS[:1] if args.smoke else MODELS):
    if common.out_of_time(args):
      left_out.append(model_name)
      continue
    config, model_config = base_config(model_name, args.smoke)
    model = build_task(config).build_model(model_config)
    batch = random_batch(batch_size, length, length, model_config.vocab_size)
    steps = {count: compile_step(config, model, batch, smoke=args.smoke, num_replicas=count)
             for count in (1, replicas)}
    timings = measure.time_interleaved(steps, warmup=args.warmup,
                                       repeats=args.repeats, budget_s=args.budget_s)
    one, many = timings[1].median, timings[replicas].median
    value = measure.ratio(many, replicas * one)
    report.ratios[f"{model_name}: {replicas} replicas / ({replicas} x 1)"] = value
    report.rows.append([config.model_name if model_name == "transformer" else f"rnn ({config.model.cell})",
                        steps[1].num_params, 1e3 * one, 1e3 * many, value, steps[1].compile_seconds,
                        steps[replicas].compile_seconds])
    del steps

  report.notes += [
      f"The Multi30k ablation base (`experiments/ablations/common.py`, `multi30k_base`){' at smoke size' if args.smoke else ''}, "
      f"vocabulary {64 if args.smoke else VOCAB_SIZE}, batch {batch_size} x {length} source and {length} target "
      f"tokens (no padding), float32, dropout as configured; the two steps timed in turns, median of "
      f"{args.repeats} after {args.warmup} warm-up.",
      "Below 1: the vmapped program is faster than its replicas one after another; above 1: slower.",
  ]
  if left_out:
    report.notes.append(f"Left out (--time_budget_s spent): {', '.join(left_out)}.")
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
