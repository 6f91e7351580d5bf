"""Question 11: what does the training loop cost on top of its compiled step?

    python -m benchmarks.loop_overhead           # a tiny and a small model, writes RESULTS.md
    python -m benchmarks.loop_overhead --smoke   # fewer steps, prints only
    python -m benchmarks.loop_overhead --steps_per_call 1 8   # also the loop at 8 steps per compiled call

A model small enough that its step is dominated by overhead (the synthetic copy task at d_model 32, batch 16)
and one closer to real work (d_model 256, batch 64) are trained for ``--steps`` steps

(a) by the training loop itself (``transformer.train.run``: data, logging every 50 steps, checkpoint checks,
    progress), its time per step read from ``metrics.jsonl`` (``train/steps_per_second`` of every logging
    window but the first, which holds the compilation), and
(b) by a bare loop that calls the same compiled step on batches already on the device and waits once at the
    end.

With ``--steps_per_call`` k > 1 the loop also runs with ``config.steps_per_call=k`` (one compiled call
``lax.scan``s k steps over k stacked batches; logging every multiple of k nearest above 50), a row per k,
each against the same bare loop of one step per call.

The ratio (a) / (b) is the loop's cost; the parts measured on their own, per step, explain it: the input
pipeline (the task's host batching, then ``device_put``), adding the metrics to the device-side window, and
what fetching every step's metrics to the host (a wait for the device each step, as loops commonly do) would
cost. The rest of (a) - (b) is the loop's Python bookkeeping, logging and checkpoint checks.
"""
from __future__ import annotations

import contextlib
import io
import statistics
import sys
import tempfile
import time

import jax

from benchmarks import common, measure
from experiments.record_store import host_description

SIZES = {  # name -> config overrides of experiments/synthetic.py:copy
    "tiny (d 32, batch 16)": {"model.d_model": 32, "model.num_heads": 4, "model.d_ff": 64,
                              "model.num_encoder_layers": 1, "model.num_decoder_layers": 1, "batch_size": 16},
    "small (d 256, batch 64)": {"model.d_model": 256, "model.num_heads": 4, "model.d_ff": 1024,
                                "model.num_encoder_layers": 2, "model.num_decoder_layers": 2, "batch_size": 64},
}


def add_arguments(parser):
  parser.add_argument("--steps", type=common.positive_int, default=600, help="training steps per run")
  parser.add_argument("--sizes", nargs="+", default=None, choices=list(SIZES), help="default: all")
  parser.add_argument("--steps_per_call", type=common.positive_int, nargs="+", default=[1],
                      help="the loop's config.steps_per_call: a row per value, each against the same bare loop")


def _multiple(value: int, of: int) -> int:
  """The least multiple of ``of`` that is at least ``value``."""
  return -(-value // of) * of


def experiment_config(overrides: dict, steps: int, steps_per_call: int = 1):
  """The synthetic copy experiment with ``overrides``, training ``steps`` steps, one evaluation at the end;
  ``steps_per_call`` steps per compiled call (logging every multiple of it nearest above 50; ``steps`` rounded
  up to a multiple of it)."""
  from experiments.synthetic import get_config
  from transformer.train.config import set_field
  config = get_config("copy")
  # Every call of k steps: a last call of fewer would compile the one-step program inside the timed windows.
  settings = {**overrides, "num_train_steps": _multiple(steps, steps_per_call),
              "log_every": _multiple(50, steps_per_call),
              "eval_every": _multiple(steps, steps_per_call), "checkpoint_every": _multiple(steps, steps_per_call),
              "task.num_eval_examples": 16, "eval_batch_size": 16, "quiet": True, "tensorboard": False,
              "best_metric": ""}
  if steps_per_call > 1:  # a checkout from before config.steps_per_call has no such field
    settings["steps_per_call"] = steps_per_call
  for path, value in settings.items():
    set_field(config, path, value)
  return config


def loop_seconds_per_step(config) -> float:
  """(a): the training loop's seconds per step, the median over its logging windows after the first. The run's
  own lines (its examples, evaluation, summary) are kept out of the report's output."""
  from transformer.train import run
  from transformer.train.workdir import RunDirectory
  with tempfile.TemporaryDirectory() as workdir:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
      run(config, workdir)
    rates = [rate for _, rate in RunDirectory(workdir).metrics().values("train/steps_per_second")]
  return statistics.median(1 / rate for rate in rates[1:])


class Pieces:
  """The run's task, strategy and compiled train step, as the loop builds them."""

  def __init__(self, config):
    from transformer.train.config import RunConfig, build_task
    from transformer.train.state import run_optimizer
    from transformer.train.mesh import make_strategy
    from transformer.train.state import seed_keys
    from transformer.train.state import create_train_state
    from transformer.train.step import make_train_step
    run_config = RunConfig.from_config(config)
    self.task = build_task(run_config)
    model = self.task.build_model(self.task.model_config())
    optimizer = run_optimizer(run_config)
    self.strategy = make_strategy("jit")
    self.iterator = self.task.train_iterator(run_config.batch_size, run_config.seed)
    first = next(self.iterator)
    self.state = self.strategy.create_state(
        lambda key: create_train_state(model, optimizer, self.task.init_inputs(first), key), seed_keys(run_config))
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


def time_loop_and_parts(config, steps: int, repeats: int, loop_configs: dict | None = None) -> dict[str, float]:
  """Seconds per step of (a), (b) and the parts; (a) and (b) the fastest of ``repeats`` runs in turns.
  ``loop_configs``: name -> config of further loops (other steps_per_call) run in the same turns, each
  reported as ``"loop " + name``."""
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
    from transformer.train.loop import MetricsWindow
  except ImportError:  # a checkout from before the device-side window
    pass
  else:
    window = MetricsWindow(pieces.strategy.fetch)
    times["metrics window"] = pieces.timed_steps(
        steps, after_step=lambda i, m: window.add(m, i + 1, 0)) - times["bare"]
  # The two in turns, the fastest of each (load on a shared host only slows a run down).
  loops = {"loop": config, **{f"loop {name}": other for name, other in (loop_configs or {}).items()}}
  bare, loop = [times["bare"]], {name: [] for name in loops}
  for _ in range(repeats):
    for name, loop_config in loops.items():
      loop[name].append(loop_seconds_per_step(loop_config))
    bare.append(pieces.timed_steps(steps))
  times["bare"] = min(bare)
  times.update({name: min(seconds) for name, seconds in loop.items()})
  return times


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  machine = host_description(load_average=True)
  steps = 150 if args.smoke else args.steps
  sizes = args.sizes or (list(SIZES)[:1] if args.smoke else list(SIZES))
  report = common.Report(
      "loop_overhead", "The training loop's cost over its compiled step (benchmarks/loop_overhead.py)",
      ["model", "steps per call", "bare step ms", "loop ms", "loop / bare", "(loop - bare) / bare",
       "host batching ms", "device_put ms", "metrics window ms", "fetch every step ms", "rest ms"])
  first, *others = args.steps_per_call
  for size in sizes:
    if common.out_of_time(args):
      report.notes.append(f"Left out (--time_budget_s spent): {size}.")
      continue
    times = time_loop_and_parts(experiment_config(SIZES[size], steps, first), steps, args.repeats,
                                {k: experiment_config(SIZES[size], steps, k) for k in others})
    bare = times["bare"]
    window = times.get("metrics window", float("nan"))
    for k in args.steps_per_call:
      loop = times["loop" if k == first else f"loop {k}"]
      rest = loop - bare - times["host batching"] - times["device_put"] - (0.0 if window != window else window)
      report.ratios[f"{size}: loop / bare" + (f", {k} steps per call" if k > 1 else "")] = measure.ratio(loop, bare)
      report.rows.append([size, k, 1e3 * bare, 1e3 * loop, loop / bare, (loop - bare) / bare,
                          1e3 * times["host batching"], 1e3 * times["device_put"], 1e3 * window,
                          1e3 * times["fetch every step"], 1e3 * rest])
  report.notes += [
      f"`experiments/synthetic.py:copy` at the sizes named, {steps} steps, logging every 50 (every multiple of "
      "k nearest above 50 at k steps per call), one evaluation and "
      "one checkpoint at the end (not in the loop's time: windows after the first only), float32; loops and bare "
      f"loop run in turns, the fastest of {args.repeats} each; "
      f"{jax.devices()[0].platform}. Parts are per step, measured on their own in the same process; "
      "'fetch every step' is what a loop that fetched each step's metrics to the host would add (this loop "
      "does not: it reads them every log_every steps); 'rest' is loop - bare - the parts this loop has. Every "
      "row's bare loop is one step per call; the parts are measured at one step per call.",
      "Targets (issue 49): loop / bare at most 1.3 for the tiny model; (loop - bare) at most 5% of a base step.",
  ]
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
