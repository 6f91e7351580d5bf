"""Question 4: how much does the key/value cache speed up greedy and beam search?

    python -m benchmarks.decoding            # writes benchmarks/RESULTS.md
    python -m benchmarks.decoding --smoke    # seconds, prints only

Cached: ``greedy_decode`` / ``beam_decode`` (``transformer.tasks.decoding``), one new
position per step through the decoder's key/value cache, the cross-attention keys and values projected
once. Baseline without a cache: the same ``greedy_search`` / ``beam_search`` over a step function that keeps
the tokens generated so far and re-runs the full teacher-forced decoder (``EncoderDecoder.decode``) on the
prefix at every step, projecting only the newest position to the vocabulary. Shapes must be static under
``jit``, so the prefix is rounded up to one of ``--buckets`` lengths (``lax.switch`` picks the shortest that
holds it): the baseline does at most ``max_length / buckets`` extra positions per step, not the whole
buffer. Both encode the source once.

Every sequence runs to ``max_length`` (no EOS can be produced), so both paths do the same number of steps;
tokens/s counts output tokens (``batch * max_length``, beams not counted). Target: cache >= 5x at 256 tokens.
"""
from __future__ import annotations

import functools
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, measure
from benchmarks.train_step import experiment_config
from experiments.record_store import host_description
from transformer.decode import beam_search, greedy_search
from transformer.decode.start import NO_EOS  # every sequence runs to max_length
from transformer.nn import EncoderDecoder
from transformer.tasks.decoding import beam_decode, greedy_decode, model_class

TARGET = 5.0
TARGET_LENGTH = 256


def add_arguments(parser):
  parser.add_argument("--config", default="transformer_small", choices=["transformer_small", "transformer_base"])
  parser.add_argument("--batch_sizes", type=common.positive_int, nargs="+", default=[1, 64])
  parser.add_argument("--lengths", type=common.positive_int, nargs="+", default=[64, 256], help="output tokens")
  parser.add_argument("--source_length", type=common.positive_int, default=32)
  parser.add_argument("--beam_size", type=common.positive_int, default=4)
  parser.add_argument("--buckets", type=common.positive_int, default=8, help="prefix lengths of the no-cache baseline")
  parser.add_argument("--searches", nargs="+", default=["greedy", "beam"], choices=["greedy", "beam"])
  parser.add_argument("--budget_s", type=common.positive_float, default=120.0, help="time budget per measurement")


def prefix_lengths(max_length: int, buckets: int) -> list[int]:
  """Increasing prefix lengths ending at ``max_length``, about ``max_length / buckets`` apart."""
  return sorted({math.ceil(max_length * (i + 1) / buckets) for i in range(buckets)})


def recompute_step_fn(model, params, max_length: int, buckets: int):
  """A step function without a key/value cache: its "cache" is the decoder input so far.

  ``cache["tokens"]`` ``[batch, max_length]`` holds BOS and the tokens generated so far (the right-shifted
  target); each step writes the previous token at ``cache["index"]`` and runs the teacher-forced decoder
  over the shortest bucketed prefix that holds it, projecting only that position to the vocabulary
  (``logits_index``: a fair baseline does not pay for logits it throws away), ``[batch, 1, vocab]``.
  The encoder output and source are in the cache too: leaves with a leading batch axis are what the searches
  copy per beam (after the first step, taken once per example) and re-gather from the parent beams.
  """
  lengths = prefix_lengths(max_length, buckets)

  def decode_prefix(length):
    def run(tokens, index, encoded, source):  # the decoder over the prefix, the vocabulary projection at index
      return model.apply({"params": params}, encoded, source, tokens[:, :length], logits_index=index,
                         method=EncoderDecoder.decode)  # [batch, 1, vocab]
    return run

  def step_fn(previous_tokens, cache):
    index = cache["index"]
    tokens = jax.lax.dynamic_update_slice(cache["tokens"], previous_tokens.astype(jnp.int32), (0, index))
    bucket = jnp.searchsorted(jnp.asarray(lengths), index + 1)  # first prefix length > index
    logits = jax.lax.switch(bucket, [decode_prefix(length) for length in lengths], tokens, index,
                            cache["encoded"], cache["source"])
    return logits, {**cache, "tokens": tokens, "index": index + 1}

  return step_fn


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 5))
def recompute_decode(model_config, params, source, max_length: int, beam_size: int, buckets: int):
  """Greedy (``beam_size`` 1) or beam search without a cache; returns ``[batch, max_length]`` tokens."""
  model = model_class(model_config)(model_config)
  batch_size = source.shape[0]
  encoded = model.apply({"params": params}, source, method=EncoderDecoder.encode)
  step_fn = recompute_step_fn(model, params, max_length, buckets)
  # One row per example: the searches repeat the batch-leading leaves per beam themselves.
  cache = {"tokens": jnp.zeros((batch_size, max_length), jnp.int32), "index": jnp.array(0, jnp.int32),
           "encoded": encoded, "source": source}
  if beam_size == 1:
    return greedy_search(step_fn, cache, batch_size, max_length, model_config.bos_id, model_config.eos_id,
                         model_config.pad_id)[0]
  sequences, _ = beam_search(step_fn, cache, batch_size, beam_size, max_length, model_config.bos_id,
                             model_config.eos_id, model_config.pad_id)
  return sequences


def cached_decode(model_config, params, source, max_length: int, beam_size: int):
  if beam_size == 1:
    return greedy_decode(model_config, params, source, max_length)[0]
  return beam_decode(model_config, params, source, max_length, beam_size)[0]


def time_both(args, model_config, params, source, max_length: int, beam: int, buckets: int):
  """Compile the cached and the no-cache search (``beam`` 1: greedy) for ``source`` and time them:
  ``(median seconds, output tokens, compile seconds of both)``, the first two keyed "cached" and "no-cache"."""
  # Compile outside the timed calls; the static arguments are bound by lower().
  options = measure.SMOKE_COMPILER_OPTIONS if args.smoke else None
  cached, cached_compile_s = measure.compile_timed(
      jax.jit(cached_decode, static_argnums=(0, 3, 4)), model_config, params, source, max_length, beam,
      compiler_options=options)
  recomputed, recomputed_compile_s = measure.compile_timed(
      recompute_decode, model_config, params, source, max_length, beam, buckets, compiler_options=options)
  seconds = {}
  outputs = {}
  for name, fn in (("cached", cached), ("no-cache", recomputed)):
    outputs[name] = np.asarray(fn(params, source))  # also the first warm-up call
    seconds[name] = measure.time_fn(fn, params, source, warmup=max(args.warmup - 1, 0),
                                    repeats=args.repeats, budget_s=args.budget_s).median
  return seconds, outputs, cached_compile_s + recomputed_compile_s


def add_row(report: common.Report, search: str, batch_size: int, max_length: int, seconds: dict, outputs: dict,
            compile_s: float) -> None:
  """The table row and speed-up ratio of one ``time_both``."""
  tokens = batch_size * max_length
  speedup = measure.ratio(seconds["no-cache"], seconds["cached"])  # = cached / no-cache tokens/s
  same = 100 * np.mean(np.all(outputs["cached"] == outputs["no-cache"], axis=-1))
  report.ratios[f"{search} batch={batch_size} tokens={max_length} speed-up"] = speedup
  report.rows.append([search, batch_size, max_length, 1e3 * seconds["cached"], 1e3 * seconds["no-cache"],
                      tokens / seconds["cached"], tokens / seconds["no-cache"], speedup, same, compile_s])


def run_notes(args, report: common.Report, lengths: list[int], source_length: int, buckets: int) -> list[str]:
  """The settings and the target's verdict, from the speed-ups in ``report.ratios``."""
  at_target = [value for key, value in report.ratios.items() if key.endswith(f"tokens={TARGET_LENGTH} speed-up")]
  verdict = (f"smallest speed-up at {TARGET_LENGTH} tokens {common.fmt(min(at_target))} "
             f"({'met' if min(at_target) >= TARGET else 'not met'})" if at_target
             else f"no row at {TARGET_LENGTH} tokens in this run")
  return [
      f"{args.config}{' (smoke size)' if args.smoke else ''} model, random parameters, source of "
      f"{source_length} random tokens; no-cache prefix lengths {prefix_lengths(max(lengths), buckets)} "
      f"(for {max(lengths)} tokens). Median of up to {args.repeats} calls after {args.warmup} warm-up.",
      "same output %: sequences identical between the two paths (they differ only by float rounding).",
      f"Target: cache speed-up >= {TARGET}x at {TARGET_LENGTH} output tokens; {verdict}.",
  ]


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  machine = host_description(load_average=True)
  batch_sizes = [2] if args.smoke else args.batch_sizes
  lengths = [8] if args.smoke else args.lengths
  source_length = 6 if args.smoke else args.source_length
  beam_size = 2 if args.smoke else args.beam_size
  buckets = 2 if args.smoke else args.buckets
  _, model_config = experiment_config(args.config, smoke=args.smoke)
  model_config = model_config.replace(deterministic=True, eos_id=NO_EOS,
                                      max_length=max(model_config.max_length, max(lengths)))
  model = EncoderDecoder(model_config)

  report = common.Report(
      "decoding", "Decoding: key/value cache vs recomputing the prefix (benchmarks/decoding.py)",
      ["search", "batch", "output tokens", "cached ms", "no-cache ms", "cached tokens/s", "no-cache tokens/s",
       "cache speed-up", "same output %", "compile s (cached + no-cache)"])
  params = None
  searches = [(name, 1 if name == "greedy" else beam_size) for name in args.searches]
  # Every row compiles two programs (on a GPU tens of seconds each, the no-cache one holding a decoder per
  # prefix bucket): the rows the budget leaves out are named, not silently dropped.
  rows = [(search, beam, batch_size, max_length) for search, beam in searches for batch_size in batch_sizes
          for max_length in lengths]
  for row_index, (search, beam, batch_size, max_length) in enumerate(rows):
    if common.out_of_time(args):
      report.notes.append("not run (--time_budget_s spent): " + ", ".join(
          f"{name}{'' if name == 'greedy' else f' {beam}'} batch {size} x {length} tokens"
          for name, beam, size, length in rows[row_index:]) + ".")
      break
    rng = np.random.default_rng(batch_size)
    source = jnp.asarray(rng.integers(3, model_config.vocab_size, (batch_size, source_length)), jnp.int32)
    if params is None:
      params = model.init(jax.random.PRNGKey(0), source, source)["params"]
    seconds, outputs, compile_s = time_both(args, model_config, params, source, max_length, beam, buckets)
    add_row(report, search if search == "greedy" else f"beam {beam}", batch_size, max_length, seconds, outputs,
            compile_s)
  report.notes += run_notes(args, report, lengths, source_length, buckets)
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
