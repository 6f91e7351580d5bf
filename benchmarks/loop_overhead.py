"""Question 11: what does the training loop cost on top of its compiled step?

    python -m benchmarks.loop_overhead           # a tiny and a small model, writes RESULTS.md
    python -m benchmarks.loop_overhead --smoke   # fewer steps, prints only

A model small enough that its step is dominated by overhead (the synthetic copy task at d_model 32, batch 16)
and one closer to real work (d_model 256, batch 64) are trained for ``--steps`` steps

(a) by the training loop itself (``transformer.train.run``: data, logging every 50 steps, checkpoint checks,
    progress), its time per step read from ``metrics.jsonl`` (``train/steps_per_second`` of every logging
    window but the first, which holds the compilation), and
(b) by a bare loop that calls the same compiled step on batches already on the device and waits once at the
    end.

The ratio (a) / (b) is the loop's cost; the parts measured on their own, per step, explain it: the input
pipeline (the task's host batching, then ``device_put``), adding the metrics to the device-side window, and
what fetching every step's metrics to the host (a wait for the device each step, as loops commonly do) would
cost. The rest of (a) - (b) is the loop's Python bookkeeping, logging and checkpoint checks.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time

import jax

from benchmarks import common

SIZES = {  # name -> config overrides of experiments/synthetic.py:copy
    "tiny (d 32, batch 16)": {"model.d_model": 32, "model.num_heads": 4, "model.d_ff": 64,
                              "model.num_encoder_layers": 1, "model.num_decoder_layers": 1, "batch_size": 16},
    "small (d 256, batch 64)": {"model.d_model": 256, "model.num_heads": 4, "model.d_ff": 1024,
                                "model.num_encoder_layers": 2, "model.num_decoder_layers": 2, "batch_size": 64},
}


def add_arguments(parser):
  parser.add_argument("--steps", type=common.positive_int, default=600, help="training steps per run")
  parser.add_argument("--sizes", nargs="+", default=None, choices=list(SIZES), help="default: all")


def experiment_config(overrides: dict, steps: int):
  """The synthetic copy experiment with ``overrides``, training ``steps`` steps, one evaluation at the end."""
  from experiments.synthetic import get_config
  from transformer.train.config import set_field
  config = get_config("copy")
  settings = {**overrides, "num_train_steps": steps, "log_every": 50, "eval_every": steps,
              "checkpoint_every": steps, "task.num_eval_examples": 16, "eval_batch_size": 16, "quiet": True,
              "tensorboard": False, "best_metric": ""}
  for path, value in settings.items():
    set_field(config, path, value)
  return config


def loop_seconds_per_step(config) -> float:
  """(a): the training loop's seconds per step, the median over its logging windows after the first."""
  from transformer.train import run
  from transformer.train.writers import read_metrics
  with tempfile.TemporaryDirectory() as workdir:
    run(config, workdir)
    rates = [r["train/steps_per_second"] for r in read_metrics(workdir) if "train/steps_per_second" in r]
  return statistics.median(1 / rate for rate in rates[1:])


class Pieces:
  """The run's task, strategy and compiled train step, as the loop builds them."""

  def __init__(self, config):
    from transformer.tasks import build_task
    from transformer.train.config import run_optimizer
    from transformer.train.parallel import make_strategy
    from transformer.train.restore import seed_keys
    from transformer.train.state import create_train_state
    from transformer.train.step import make_train_step
    self.task = build_task(config)
    model = self.task.build_model(self.task.model_config())
    optimizer = run_optimizer(config)
    self.strategy = make_strategy("jit")
    self.iterator = self.task.train_iterator(config.batch_size, config.seed)
    first = next(self.iterator)
    self.state = self.strategy.create_state(
        lambda key: create_train_state(model, optimizer, self.task.init_inputs(first), key), seed_keys(config))
    self.step = self.strategy.compile_train_step(make_train_step(self.task, model, optimizer))

  def timed_steps(self, steps: int, before_step=None, after_step=None) -> float:
    """Seconds per step of ``steps`` calls on one placed batch, waiting once at the end (after one warm-up)."""
    batch = self.strategy.put_batch(next(self.iterator))
    self.state, metrics = self.step(self.state, batch)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for index in range(steps):
      placed = before_step() if before_step else batch
      self.state, metrics = self.step(self.state, placed)
      if after_step:
        after_step(index, metrics)
    jax.block_until_ready((self.state, metrics))
    return (time.perf_counter() - start) / steps


def measure(config, steps: int, repeats: int) -> dict[str, float]:
  """Seconds per step of (a), (b) and the parts; (a) and (b) the fastest of ``repeats`` runs in turns."""
  pieces = Pieces(config)
  times = {"bare": pieces.timed_steps(steps)}
  host = [next(pieces.iterator) for _ in range(steps)]
  start = time.perf_counter()
  for _ in range(steps):
    next(pieces.iterator)
  times["host batching"] = (time.perf_counter() - start) / steps
  start = time.perf_counter()
  jax.block_until_ready([pieces.strategy.put_batch(batch) for batch in host])
  times["device_put"] = (time.perf_counter() - start) / steps
  times["fetch every step"] = pieces.timed_steps(steps, after_step=lambda i, m: pieces.strategy.fetch(m)) \
      - times["bare"]
  try:
    from transformer.train.window import MetricsWindow
  except ImportError:  # a checkout from before the device-side window
    pass
  else:
    window = MetricsWindow(pieces.strategy.fetch)
    times["metrics window"] = pieces.timed_steps(
        steps, after_step=lambda i, m: window.add(m, i + 1, 0)) - times["bare"]
  # The two in turns, the fastest of each (load on a shared host only slows a run down).
  bare, loop = [times["bare"]], []
  for _ in range(repeats):
    loop.append(loop_seconds_per_step(config))
    bare.append(pieces.timed_steps(steps))
  times["bare"], times["loop"] = min(bare), min(loop)
  return times


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  machine = common.machine_description()
  steps = 150 if args.smoke else args.steps
  sizes = args.sizes or (list(SIZES)[:1] if args.smoke else list(SIZES))
  report = common.Report(
      "loop_overhead", "The training loop's cost over its compiled step (benchmarks/loop_overhead.py)",
      ["model", "bare step ms", "loop ms", "loop / bare", "(loop - bare) / bare", "host batching ms",
       "device_put ms", "metrics window ms", "fetch every step ms", "rest ms"])
  for size in sizes:
    if common.out_of_time(args):
      report.notes.append(f"Left out (--time_budget_s spent): {size}.")
      continue
    times = measure(experiment_config(SIZES[size], steps), steps, args.repeats)
    bare, loop = times["bare"], times["loop"]
    window = times.get("metrics window", float("nan"))
    rest = loop - bare - times["host batching"] - times["device_put"] - (0.0 if window != window else window)
    report.ratios[f"{size}: loop / bare"] = common.ratio(loop, bare)
    report.rows.append([size, 1e3 * bare, 1e3 * loop, loop / bare, (loop - bare) / bare,
                        1e3 * times["host batching"], 1e3 * times["device_put"], 1e3 * window,
                        1e3 * times["fetch every step"], 1e3 * rest])
  report.notes += [
      f"`experiments/synthetic.py:copy` at the sizes named, {steps} steps, logging every 50, one evaluation and "
      "one checkpoint at the end (not in the loop's time: windows after the first only), float32; loop and bare "
      f"loop run in turns, the fastest of {args.repeats} each; "
      f"{jax.devices()[0].platform}. Parts are per step, measured on their own in the same process; "
      "'fetch every step' is what a loop that fetched each step's metrics to the host would add (this loop "
      "does not: it reads them every log_every steps); 'rest' is loop - bare - the parts this loop has.",
      "Targets (issue 49): loop / bare at most 1.3 for the tiny model; (loop - bare) at most 5% of a base step.",
  ]
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
