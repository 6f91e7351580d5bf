"""What a save costs the step: a train step that saves a checkpoint against one that does not.

    python -m benchmarks.checkpoint_save            # transformer_small on a CPU, transformer_base on an accelerator
    python -m benchmarks.checkpoint_save --smoke    # seconds, prints only

The train step of ``benchmarks/train_step.py`` (the task's loss, Adam, the state donated) and the run's
``Checkpointer`` (``transformer/train/checkpoint.py``) in a temporary folder: the wall time of a step alone, and
of a step followed by ``Checkpointer.save`` (its integrity fingerprints, orbax's copy to the host, and, when
synchronous, the write), asynchronously (as training saves) and synchronously; each measured ``--repeats``
times, the median, the step's result waited for. The asynchronous save's write overlaps the next steps; it is
waited for before the next save is timed, and that wait is reported too. Beside them, the integrity check
alone: the device fingerprints a save records now against the host SHA-256 digests of every leaf it recorded
before (``checksums.state_checksums``), on the same state.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time

import jax

from benchmarks import common, measure
from benchmarks.train_step import compile_step, experiment_config, random_batch
from experiments.record_store import host_description
from transformer.train.config import build_task
from transformer.train.checkpoint import Checkpointer
from transformer.train.checkpoint import state_checksums, state_fingerprints


def add_arguments(parser):
  parser.add_argument("--config", default=None, help="the multi30k.py variant (default: transformer_small on a "
                                                     "CPU, transformer_base on an accelerator)")
  parser.add_argument("--batch", type=common.positive_int, default=None, help="default: 16 on a CPU, 256 else")


def _median_seconds(call, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def time_saves(step, asynchronous: bool, repeats: int) -> tuple[float, float]:
  """``(step + save seconds, seconds waiting for the write afterwards)``, medians over ``repeats`` saves."""
  with tempfile.TemporaryDirectory(prefix="checkpoint-save-") as folder:
    checkpointer = Checkpointer(folder, keep=2, asynchronous=asynchronous)
    saves, waits, number = [], [], [0]

    def step_and_save():
      number[0] += 1
      jax.block_until_ready(step())
      checkpointer.save(number[0], step.state, extra={"position": number[0]})

    step_and_save()  # the first save creates the folders and traces the fingerprints
    checkpointer.wait()
    for _ in range(repeats):
      start = time.perf_counter()
      step_and_save()
      saves.append(time.perf_counter() - start)
      start = time.perf_counter()
      checkpointer.wait()
      waits.append(time.perf_counter() - start)
    checkpointer.close()
  return statistics.median(saves), statistics.median(waits)


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  accelerator = jax.default_backend() != "cpu"
  variant = args.config or ("transformer_base" if accelerator else "transformer_small")
  batch_size = 2 if args.smoke else args.batch or (256 if accelerator else 16)
  machine = host_description(load_average=True)
  config, model_config = experiment_config(variant, args.smoke, dtype="bfloat16" if accelerator else "float32")
  model = build_task(config).build_model(model_config)
  length = 8 if args.smoke else 64
  step = compile_step(config, model, random_batch(batch_size, length, length, model_config.vocab_size),
                      smoke=args.smoke)
  bare = measure.time_fn(step, warmup=args.warmup, repeats=args.repeats).median
  rows = {"no save": (bare, None)}
  for name, asynchronous in (("save, asynchronous", True), ("save, synchronous", False)):
    rows[name] = time_saves(step, asynchronous, args.repeats)
  fingerprints = _median_seconds(lambda: state_fingerprints(step.state), args.repeats)
  digests = _median_seconds(lambda: state_checksums(step.state), args.repeats)
  report = common.Report(
      "checkpoint_save", "Checkpoint saves against the step (benchmarks/checkpoint_save.py)",
      ["step", "ms", "ms / no save", "ms waiting for the write afterwards"])
  for name, (seconds, wait) in rows.items():
    report.rows.append([name, 1e3 * seconds, measure.ratio(seconds, bare), None if wait is None else 1e3 * wait])
    if name != "no save":
      report.ratios[f"{name} / no save"] = measure.ratio(seconds, bare)
  report.ratios["fingerprints / SHA-256 digests"] = measure.ratio(fingerprints, digests)
  report.notes += [
      f"multi30k.py:{variant}, {step.num_params:,} parameters, batch {batch_size} x {length} + {length} tokens, "
      f"{model_config.dtype}; median of {args.repeats} (steps after {args.warmup} warm-up; saves after one "
      f"untimed save). The state (parameters and Adam's two moments) is what each save writes.",
      f"Integrity check of that state alone: device fingerprints {1e3 * fingerprints:.1f} ms (what a save "
      f"records), host SHA-256 of every leaf {1e3 * digests:.1f} ms (what it recorded before) "
      f"({measure.ratio(fingerprints, digests):.2f}x).",
  ]
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
