"""Data per host: can one host's thread build its rows of each global batch, and the epoch's plan, as fast as 8 GPUs
at 26 ms per step consume them, at 1, 2, 4 and 8 processes (and 64, for the plan of packed streams)?

    python -m benchmarks.host_data                  # 1M generated pairs of WMT'14-like lengths: about 4 minutes
    python -m benchmarks.host_data --smoke          # 20k pairs (tests)

Weak scaling, as a run on more hosts grows its global batch: each of ``n`` simulated processes feeds 8 GPUs of
``--tokens_per_gpu`` (8,192) tokens per step, so the global batch is ``TokenBatcher(max_tokens=n x 8 x 8,192,
max_length=256, batch_size_multiple=n x 8)`` over generated pairs with log-normal lengths of WMT'14 en-de's means
(``--num_pairs``; 27 source and 28 target pieces). For each ``n`` and each batching (length buckets; packed rows),
over the first ``--batches`` batches of an epoch, the mean time one process takes to build its batch three ways:

- *whole, loop*: the whole global batch padded row by row in Python, then its rows taken (before issue 69);
- *whole, gather*: the whole global batch padded by one gather (``TokenBatcher.make_batch``), then its rows taken;
- *own rows*: only this process's rows built (``make_batch(plan, i, n)``, what ``hosts.HostShard`` asks of a
  ``BatchIterator`` now).

Its tokens per second are the host's share (8 x 8,192 per step) over that time; what 8 GPUs consume is
8 x 8,192 / 26 ms. The epoch's plan (``epoch_batches``: shuffled length buckets, or first-fit packing) is made once
per epoch on every host, the same for any ``n``, on a thread of its own while the epoch before is walked; its cost
per step is its time over the epoch's steps, and it keeps up while that is below 26 ms.

*Packed streams* (``pack_streams = n``, one stream per process): the epoch dealt into ``n`` streams, each packed
alone into its own rows, so that a process plans only its own stream (``TokenBatcher.plan_rows_of``): its plan
falls as 1/n. Timed for the last process (its stream's plan and its rows), also at 64 simulated processes; no
process builds the whole batch there. An epoch ends where the first stream could run out and the streams' rows
past it are dropped: the share of the kept examples an epoch trains on says what that costs.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from benchmarks import common
from benchmarks.input_pipeline import generated_pairs
from experiments.record_store import host_description
from transformer.data import batching, hosts

GPUS_PER_HOST = 8
STEP_SECONDS = 0.026  # a transformer-big-sized step on an H100-class GPU (issue 69's estimate)
MAX_LENGTH = 256
WMT_MEAN_LENGTHS = (27.0, 28.0)  # SentencePiece pieces per side of WMT'14 en-de, EOS included (32k vocabulary)
PROCESS_COUNTS = (1, 2, 4, 8)
# batching -> (TokenBatcher options, process counts); packed streams: pack_streams = the process count
BATCHINGS = {"length buckets": ({}, PROCESS_COUNTS), "packed rows": ({"pack": True}, PROCESS_COUNTS),
             "packed streams (S = processes)": ({"pack": True, "streams": True}, PROCESS_COUNTS + (64,))}


def add_arguments(parser):
  parser.add_argument("--num_pairs", type=common.positive_int, default=None,
                      help="generated training pairs (default 1,000,000; --smoke 20,000)")
  parser.add_argument("--tokens_per_gpu", type=common.positive_int, default=8192,
                      help="tokens (each side, padding included) per GPU per step")
  parser.add_argument("--batches", type=common.positive_int, default=None,
                      help="batches timed per row (default 12; --smoke 2)")
  parser.add_argument("--plan_workers", type=common.positive_int, default=2,
                      help="worker processes of the packed plan's last measurement")


def whole_batch_by_rows_loop(batcher: batching.TokenBatcher, plan) -> dict[str, np.ndarray]:
  """The global batch as ``make_batch`` built it before issue 69: a Python loop over rows (and segments)."""
  if batcher.pack:
    rows = batcher.buckets[0].batch_size
    lengths = dict(zip(("source", "target"), batcher.row_lengths))
    batch = {name: np.zeros([rows, lengths[name.split("_")[0]]], np.int32)
             for name in ("source", "target", "source_segments", "target_segments")}
    for row, members in enumerate(plan):
      starts = {"source": 0, "target": 0}
      for segment, index in enumerate(members, start=1):
        for side, tokens in zip(("source", "target"), batcher.examples[index]):
          batch[side][row, starts[side]:starts[side] + len(tokens)] = tokens
          batch[f"{side}_segments"][row, starts[side]:starts[side] + len(tokens)] = segment
          starts[side] += len(tokens)
    return batch
  bucket = batcher.buckets[batcher.bucket_ids[plan[0]]]
  batch = {side: np.zeros([bucket.batch_size, bucket.length], np.int32) for side in ("source", "target")}
  for row, index in enumerate(plan):
    source, target = batcher.examples[index]
    batch["source"][row, :len(source)] = source
    batch["target"][row, :len(target)] = target
  return batch


def kept_share(batcher: batching.TokenBatcher, plan) -> float:
  """The fraction of the kept examples dealt to the plan's streams (all, without streams) that its epoch holds."""
  kept = int(np.sum(batcher.bucket_ids >= 0))
  streams = batcher.streams
  dealt = kept if streams is None else sum(len(range(s, kept, streams.count)) for s in range(streams.first,
                                                                                               streams.stop))
  return sum(sum(map(len, batch)) if batcher.pack else len(batch) for batch in plan) / dealt


def seconds_per_batch(builds: dict, plans, repeats: int, warmup: int) -> dict[str, float]:
  """name -> the median over ``repeats`` of the mean seconds ``builds[name]`` takes per plan of ``plans``; the
  builds take turns within each repeat, so that other work on the host weighs on them alike."""
  for build in builds.values():
    for plan in plans[:warmup]:
      build(plan)
  times = {name: [] for name in builds}
  for _ in range(repeats):
    for name, build in builds.items():
      start = time.perf_counter()
      for plan in plans:
        build(plan)
      times[name].append((time.perf_counter() - start) / len(plans))
  return {name: float(np.median(values)) for name, values in times.items()}


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  machine = host_description(load_average=True)
  num_pairs = args.num_pairs or (20_000 if args.smoke else 1_000_000)
  timed_batches = args.batches or (2 if args.smoke else 12)
  examples = generated_pairs(num_pairs, *WMT_MEAN_LENGTHS, vocab_size=32_000)
  host_tokens = GPUS_PER_HOST * args.tokens_per_gpu  # each side, per step
  needed_rate = host_tokens / STEP_SECONDS
  report = common.Report(
      "host_data", "Data per host: its rows of each global batch and the epoch plan at 1-8 processes "
      "(benchmarks/host_data.py)",
      ["batching", "processes", "global batch tokens", "whole, loop ms", "whole, gather ms",
       "own rows ms", "own rows tokens/s per host", "x what 8 GPUs need", "plan s / epoch", "steps / epoch",
       "plan ms / step", "% of kept examples per epoch"])
  plan_seconds, steps_at_one, streamed_rows = {}, {}, {}
  left_out, no_batch = [], []
  for name, (options, process_counts) in BATCHINGS.items():
    options = dict(options)
    streamed = options.pop("streams", False)
    for process_count in process_counts:
      if common.out_of_time(args):
        left_out.append(f"{name} at {process_count}")
        continue
      batcher = batching.TokenBatcher(examples, max_tokens=process_count * host_tokens, max_length=MAX_LENGTH,
                                      seed=0, batch_size_multiple=process_count * GPUS_PER_HOST,
                                      pack_streams=process_count if streamed else 1, **options)
      host = process_count - 1  # the last process: its rows are the global batch's last, filler rows included
      batcher.plan_rows_of(host, process_count)  # streams: this process's only; else the whole plan, as before
      start = time.perf_counter()
      epoch = batcher.epoch_batches(0)
      planned = time.perf_counter() - start
      if not epoch:  # packed streams of too few pairs: no stream fills one batch's rows
        no_batch.append(f"{name} at {process_count}")
        continue
      if not streamed:
        plan_seconds.setdefault(name, planned)  # the same work for every count: the first measurement is kept
        steps_at_one.setdefault(name, len(epoch))
      builds = {"own": lambda plan: batcher.make_batch(plan, host, process_count)}
      if not streamed:  # a process of packed streams never has the whole batch's plan
        builds["loop"] = lambda plan: hosts.host_rows(whole_batch_by_rows_loop(batcher, plan), host, process_count)
        builds["gather"] = lambda plan: hosts.host_rows(batcher.make_batch(plan), host, process_count)
      timed = seconds_per_batch(builds, epoch[:timed_batches], args.repeats, args.warmup)
      own, share = timed["own"], 100 * kept_share(batcher, epoch)
      whole = [1e3 * timed[way] if way in timed else "-" for way in ("loop", "gather")]
      rate = host_tokens / own
      report.rows.append([name, process_count, process_count * host_tokens, *whole, 1e3 * own, rate,
                          rate / needed_rate, planned, len(epoch), 1e3 * planned / len(epoch), share])
      if streamed:
        streamed_rows[process_count] = report.rows[-1]
      else:
        report.ratios[f"{name}, {process_count} processes: own rows / whole loop speed-up"] = timed["loop"] / own
      print(f"{name}, {process_count} process(es): own rows {1e3 * own:.2f} ms, whole batch (loop, gather) "
            f"{' / '.join(f'{ms:.2f}' if ms != '-' else ms for ms in whole)} ms; plan {planned:.2f} s for "
            f"{len(epoch)} steps, {share:.1f}% of kept examples", flush=True)
  tokens = int(examples.source_lengths.sum() + examples.target_lengths.sum())
  if "packed rows" in plan_seconds and not common.out_of_time(args):
    workers = args.plan_workers
    batcher = batching.TokenBatcher(examples, max_tokens=host_tokens, max_length=MAX_LENGTH, seed=0,
                                    batch_size_multiple=GPUS_PER_HOST, pack=True, plan_workers=workers)
    batcher.plan_ahead(1)  # epochs 1 to workers: the processes start (not timed)
    for epoch in range(1, workers + 1):
      batcher.epoch_batches(epoch)
    start = time.perf_counter()
    batcher.plan_ahead(workers + 1)  # the next ones, one per worker process, at once
    for epoch in range(workers + 1, 2 * workers + 1):
      batcher.epoch_batches(epoch)
    per_epoch = (time.perf_counter() - start) / workers
    batcher.close()
    report.ratios[f"packed plan: one thread / {workers} worker processes, seconds per epoch"] = (
        plan_seconds["packed rows"] / per_epoch)
    report.notes.append(
        f"Packed plans by {workers} worker processes (config.task.plan_workers={workers}, epochs planned at once): "
        f"{per_epoch:.2f} s per epoch (started processes, arrays sent and plans returned included) against "
        f"{plan_seconds['packed rows']:.2f} s on one thread, on this {os.cpu_count()}-core host.")
  report.notes += [
      f"{num_pairs:,} generated pairs, {tokens:,} tokens (both sides), log-normal lengths of means "
      f"{WMT_MEAN_LENGTHS[0]:g} / {WMT_MEAN_LENGTHS[1]:g} (WMT'14 en-de's, 32k SentencePiece), max_length "
      f"{MAX_LENGTH}; {args.tokens_per_gpu:,} tokens per GPU per step (each side, padding included), "
      f"{GPUS_PER_HOST} GPUs per process: a host builds {host_tokens:,} tokens a step, and 8 GPUs at "
      f"{1e3 * STEP_SECONDS:g} ms a step need {needed_rate:,.0f} tokens/s from it.",
      f"Times: the mean over an epoch's first {timed_batches} batches (the median of {args.repeats} such means after "
      f"{args.warmup} batch(es) of warm-up, the three ways taking turns; packed streams: own rows only), one thread, "
      "for the last process (a bucket's filler rows are its); the global batch grows with the processes (weak "
      "scaling), so the plan's cost per step does too: the plan is the same work on every host whatever their "
      "number, except packed streams', 1/n of it.",
      "The plan of epoch e + 1 is made on a background thread while epoch e is walked (TokenBatcher.plan_ahead): "
      "it keeps up while its ms per step stay under the step's; beyond, the next epoch's first step waits.",
  ]
  for name, seconds in plan_seconds.items():
    steps_64 = steps_at_one[name] / 64
    report.notes.append(f"{name}: at 64 processes an epoch of this corpus would be about {steps_64:,.1f} steps "
                        f"(1 process's over 64), its plan {1e3 * seconds / steps_64:,.0f} ms per step (estimate: the "
                        "plan's time does not depend on the process count).")
  if 64 in streamed_rows:
    row = streamed_rows[64]
    report.notes.append(
        f"packed streams at 64 processes (pack_streams=64), measured: the last process plans its one stream in "
        f"{row[8]:.2f} s for an epoch of {row[9]} steps, {row[10]:,.0f} ms per step (the single-stream plan's estimate "
        f"above: every host plans the whole epoch); the epoch trains on {row[11]:.1f}% of the kept examples (each "
        "stream's rows past where the first stream could run out are dropped).")
  report.notes.append(f"Host load: 1-minute load average {os.getloadavg()[0]:.1f} at the end on {os.cpu_count()} "
                      "cores (at the start: the machine line); above the core count, other jobs shared the cores "
                      "and every time here is longer than on an idle host.")
  if no_batch:
    report.notes.append(f"Left out (an epoch of no batch: too few pairs for every stream to fill its rows): "
                        f"{', '.join(no_batch)}.")
  if left_out:
    report.notes.append(f"Left out (--time_budget_s spent): {', '.join(left_out)}.")
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
