"""Question 5: can each experiment's input pipeline feed its train step?

    python -m benchmarks.input_pipeline            # writes benchmarks/RESULTS.md
    python -m benchmarks.input_pipeline --smoke    # seconds, prints only

For each experiment, the batches/s (and examples/s) its training input pipeline produces against the
batches/s its train step consumes, both measured here; the pipeline should be at least 10x faster.

- synthetic (``experiments/synthetic.py``): ``SyntheticBatches``, which generates each batch with numpy.
- multi30k and iwslt15_en_vi (``experiments/*.py:transformer_small``): ``TokenBatcher`` over tokenized pairs,
  walked by ``BatchIterator`` alone and inside the ``PrefetchIterator`` the task uses. The pairs are
  generated (random ids, log-normal lengths of roughly each corpus's size and subword lengths, see
  ``CORPORA``), since tokenizing the real corpora needs their download and SentencePiece; what the batcher
  costs depends on the counts and lengths, not on the ids. Each timing is one full epoch from a fresh
  batcher, so the epoch's shuffle and bucketing plan is included. The train step is timed on a batch of
  the epoch's most frequent bucket shape (every bucket holds about ``max_tokens`` tokens).
"""
from __future__ import annotations

import collections
import sys
import time

import numpy as np

from benchmarks import common, measure
from benchmarks.train_step import SMOKE_MODEL, compile_step, experiment_config
from experiments import iwslt15_en_vi, multi30k, synthetic
from experiments.record_store import host_description
from transformer.data import batching, prefetch
from transformer.train.config import build_task

TARGET = 10.0
# name -> (experiment config module, pairs, mean source tokens, mean target tokens): the generator's settings,
# of the order of each training set (Multi30k: 29,000 caption pairs; IWSLT'15 en-vi: 133,317 TED sentence
# pairs) under a subword vocabulary; not measured from the data.
CORPORA = {
    "multi30k": (multi30k, 29_000, 16.0, 18.0),
    "iwslt15_en_vi": (iwslt15_en_vi, 133_317, 26.0, 32.0),
}


def add_arguments(parser):
  parser.add_argument("--synthetic_batches", type=common.positive_int, default=500, help="synthetic batches per timing")


def generated_pairs(num_examples: int, mean_source: float, mean_target: float, vocab_size: int,
                    seed: int = 0) -> batching.TokenizedExamples:
  """Random token pairs with log-normal lengths (sigma 0.5) of the given means, each ending with EOS (2)."""
  rng = np.random.default_rng(seed)

  def lengths(mean):  # E[exp(N(mu, s^2))] = exp(mu + s^2 / 2)
    return np.clip(np.round(rng.lognormal(np.log(mean) - 0.125, 0.5, num_examples)), 1, None).astype(np.int64)

  def side(side_lengths):
    tokens = rng.integers(3, vocab_size, int(side_lengths.sum()), dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(side_lengths)])
    tokens[offsets[1:] - 1] = 2
    return tokens, offsets

  return batching.TokenizedExamples(*side(lengths(mean_source)), *side(lengths(mean_target)))


def time_epoch(make_iterator, repeats: int) -> tuple[float, int, int]:
  """``(median seconds, batches, real examples)`` of one epoch from ``make_iterator()`` (built untimed)."""
  times, count, examples = [], 0, 0
  for _ in range(repeats):
    iterator = make_iterator()
    count = examples = 0
    start = time.perf_counter()
    for batch in iterator:
      count += 1
      examples += int(np.sum(batch["source"][:, 0] != batching.PAD_ID))  # filler rows are all padding
    times.append(time.perf_counter() - start)
    if hasattr(iterator, "close"):
      iterator.close()
  return float(np.median(times)), count, examples


def step_rate(config, model_config, batch, args) -> float:
  """Train steps per second of ``config``'s model on ``batch``."""
  step = compile_step(config, build_task(config).build_model(model_config), batch, smoke=args.smoke)
  return 1.0 / step.time(args.warmup, args.repeats).median


def add_row(report: common.Report, experiment: str, pipeline: str, shape: str, batches_per_s: float,
            examples_per_batch: float, steps_per_s: float) -> None:
  """A pipeline's row, and its ratio of batches/s to the train step's steps/s."""
  value = measure.ratio(batches_per_s, steps_per_s)
  report.ratios[f"{experiment} {pipeline}"] = value
  report.rows.append([experiment, pipeline, shape, batches_per_s, batches_per_s * examples_per_batch,
                      steps_per_s, steps_per_s * examples_per_batch, value])


def measure_synthetic(args, report: common.Report, batch_count: int) -> None:
  """Synthetic: fixed-shape batches, one per call; a row per task kind (``copy`` only at ``--smoke`` size), all
  against the train step of the first kind's model."""
  kinds = ["copy"] if args.smoke else list(synthetic.VARIANTS)
  config = synthetic.get_config(kinds[0])
  if args.smoke:
    config.batch_size = 8
    for name, value in SMOKE_MODEL.items():
      config.model[name] = value
  task = build_task(config)
  first = next(iter(task.train_iterator(config.batch_size, seed=0)))
  steps_per_s = step_rate(config, task.model_config(), first, args)
  shape = f"{first['source'].shape[0]} x ({first['source'].shape[1]}, {first['target'].shape[1]})"
  for kind in kinds:
    config.task.kind = kind

    def make_iterator(config=config):
      iterator = build_task(config).train_iterator(config.batch_size, seed=0)
      return (next(iterator) for _ in range(batch_count))

    seconds, count, _ = time_epoch(make_iterator, args.repeats)
    add_row(report, f"synthetic {kind}", "SyntheticBatches", shape, count / seconds, config.batch_size, steps_per_s)


def most_frequent_bucket(batcher: batching.TokenBatcher, plan) -> tuple[int, list[int]]:
  """``(bucket id, one batch's example indices)`` of the bucket that most of the epoch's ``plan`` batches fill.
  Training drops over-long pairs, so every batch belongs to a bucket: its first example's."""
  bucket_id, _ = collections.Counter(int(batcher.bucket_ids[indices[0]]) for indices in plan).most_common(1)[0]
  return bucket_id, next(indices for indices in plan if batcher.bucket_ids[indices[0]] == bucket_id)


def measure_translation(args, report: common.Report, name: str) -> None:
  """Translation: token-bucketed batches over pairs generated like corpus ``name``'s (``CORPORA``), walked by
  ``BatchIterator`` alone and inside a ``PrefetchIterator``, against the train step on the most frequent bucket."""
  experiment, num_examples, mean_source, mean_target = CORPORA[name]
  config, model_config = experiment_config("transformer_small", smoke=args.smoke, experiment=experiment,
                                           vocab_size=experiment.get_config("transformer_small").task.vocab_size)
  task_config = config.task
  if args.smoke:
    num_examples, task_config.max_tokens, task_config.max_length = 300, 256, 32
  examples = generated_pairs(num_examples, mean_source, mean_target, model_config.vocab_size)

  def make_batcher():
    return batching.TokenBatcher(examples, max_tokens=task_config.max_tokens, max_length=task_config.max_length,
                                 train=True, seed=0, batch_size_multiple=task_config.batch_size_multiple)

  batcher = make_batcher()
  bucket_id, representative = most_frequent_bucket(batcher, batcher.epoch_batches(0))
  steps_per_s = step_rate(config, model_config, batcher.make_batch(representative), args)
  bucket = batcher.buckets[bucket_id]
  shape = f"{bucket.batch_size} x {bucket.length}"
  for pipeline, make_iterator in (
      ("TokenBatcher + BatchIterator", lambda: make_batcher().iterator(num_epochs=1)),
      ("TokenBatcher + PrefetchIterator", lambda: prefetch.PrefetchIterator(make_batcher().iterator(num_epochs=1)))):
    seconds, count, real = time_epoch(make_iterator, args.repeats)
    add_row(report, f"{name} (generated {len(examples):,} pairs)", pipeline, shape, count / seconds, real / count,
            steps_per_s)


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  machine = host_description(load_average=True)
  report = common.Report(
      "input_pipeline", "Input pipelines vs train-step consumption (benchmarks/input_pipeline.py)",
      ["experiment", "pipeline", "train batch shape", "pipeline batches/s", "pipeline examples/s",
       "train steps/s", "train examples/s", "pipeline / train step"])
  batch_count = 5 if args.smoke else args.synthetic_batches
  measure_synthetic(args, report, batch_count)
  for name in ["multi30k"] if args.smoke else list(CORPORA):
    measure_translation(args, report, name)

  worst = min(report.ratios.values())
  report.notes += [
      "Train step: the experiment's model and optimizer (transformer_small for translation)"
      f"{' at smoke size' if args.smoke else ''}, median of {args.repeats} steps after {args.warmup} warm-up; "
      f"pipelines: median of {args.repeats} epochs (synthetic: {batch_count} batches) on the host.",
      "Examples/s count real examples (translation: kept pairs / batches per epoch; filler rows excluded); the "
      "ratio compares batches/s, the unit both sides share.",
      f"Target: every pipeline >= {TARGET:.0f}x its train step; smallest ratio {common.fmt(worst)} "
      f"({'met' if worst >= TARGET else 'not met'}).",
  ]
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
