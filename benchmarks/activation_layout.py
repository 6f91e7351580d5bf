"""Activation sharding constraints: what they change in the compiled train step on 8 devices, per layout.

    python -m benchmarks.activation_layout           # multi30k.py:transformer_small on 8 virtual CPU devices
    python -m benchmarks.activation_layout --smoke   # a tiny model, FSDP + tensor parallel only: seconds, prints only

The model names the axes of its large activations (``transformer.nn.with_activation_axes``: the residual stream,
attention's heads, the feed-forward hidden, the logits); a mesh run traces its steps under the rule table
(``MeshStrategy.activation_layout``: ``ACTIVATION_RULES`` in ``transformer/train/config.py``), so each becomes a
sharding constraint. ``Unconstrained`` traces the same step outside that context (as
``tests/train/test_tensor_parallel.py``, which uses it, compares them), where the constraints are no-ops and XLA's sharding propagation
chooses every activation's layout from the parameters' and the batch's alone.

For each layout of ``LAYOUTS`` (the ``(data, model)`` mesh and ``config.fsdp``), the train step as
``benchmarks/train_step.py`` builds it (the task's loss, Adam, the state donated), on ``--batch`` x ``--length``
source and target tokens, is compiled, not run, with and without the constraints. Per device (an SPMD program is
one device's): XLA's temporary bytes and argument bytes (``Compiled.memory_analysis()``) and the collectives of
the compiled HLO (an asynchronous ``-start`` / ``-done`` pair counts once). Ratio: temp bytes with / without.
The script asks XLA for 8 CPU devices (``XLA_FLAGS``) before JAX starts; imported (the tests), it uses the 8
that ``tests/conftest.py`` asks for.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys

if __name__ == "__main__":  # before anything imports JAX: XLA reads the flag once, when its CPU backend starts
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402

from benchmarks import common, measure  # noqa: E402
from benchmarks.train_step import experiment_config, random_batch  # noqa: E402
from experiments.record_store import host_description  # noqa: E402
from transformer.train.config import RunConfig, build_task  # noqa: E402
from transformer.train.mesh import MeshStrategy  # noqa: E402
from transformer.train.state import create_train_state, make_optimizer  # noqa: E402
from transformer.train.step import make_train_step  # noqa: E402

DEVICES = 8
# name -> (data, model, fsdp): the mesh's data and model axes (data x model = DEVICES) and config.fsdp.
LAYOUTS = {"FSDP + tensor parallel": (2, 4, True), "tensor parallel": (2, 4, False), "FSDP": (8, 1, True)}
COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "reduce-scatter", "collective-permute")


class Unconstrained(MeshStrategy):
  """A mesh whose steps are traced without the rules in context: the activations' constraints are no-ops, as
  before the model named its activations' axes."""

  def activation_layout(self):
    return contextlib.nullcontext()


def add_arguments(parser):
  parser.add_argument("--config", default="transformer_small", help="the multi30k.py variant whose model is used")
  parser.add_argument("--batch", type=common.positive_int, default=32,
                      help="examples per step, split over the data axis (a multiple of 8)")
  parser.add_argument("--length", type=common.positive_int, default=64, help="source and target tokens per example")


def collective_counts(hlo_text: str) -> dict[str, int]:
  """``{collective: how many}`` of ``COLLECTIVES`` in a compiled program's HLO text (``-start`` counts, ``-done``
  does not)."""
  found = re.findall(rf"\b({'|'.join(COLLECTIVES)})(?:-start)?\(", hlo_text)
  return {name: found.count(name) for name in COLLECTIVES}


def compile_layout(args, data: int, model: int, fsdp: bool, constrained: bool):
  """``(compiled, seconds)``: the train step of ``args.config``'s model as ``transformer.train.run`` builds it (the
  task's loss, Adam, the state donated) on a ``data`` x ``model`` mesh of the first ``DEVICES`` devices, the
  parameters laid out by the run's rule table (``fsdp``), the activations constrained or not; compiled for the
  state's shapes (never created) and a ``[--batch, --length]`` batch of source and of target ids."""
  config, model_config = experiment_config(args.config, args.smoke, **({"num_heads": 4} if args.smoke else {}))
  config.parallelism, config.fsdp, config.tensor_parallelism = "mesh", fsdp, model
  run = RunConfig.from_config(config)
  task = build_task(run)
  network = task.build_model(model_config)
  optimizer = make_optimizer(run.optimizer, run.num_train_steps)
  strategy = (MeshStrategy if constrained else Unconstrained)(
      jax.devices()[:DEVICES], run.tensor_parallelism, run.logical_axis_rules)
  assert dict(strategy.mesh.shape) == {"hosts": 1, "data": data, "model": model}, strategy.mesh.shape
  batch = strategy.put_batch(random_batch(args.batch, args.length, args.length, model_config.vocab_size))
  state = strategy.abstract_canonical(jax.eval_shape(
      lambda key: create_train_state(network, optimizer, task.init_inputs(batch), key), jax.random.PRNGKey(0)))
  step = strategy.compile_train_step(make_train_step(task, network, optimizer))
  return measure.compile_timed(step, state, batch,
                               compiler_options=measure.SMOKE_COMPILER_OPTIONS if args.smoke else None)


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  if jax.device_count() < DEVICES:
    sys.exit(f"error: benchmarks.activation_layout needs {DEVICES} devices, JAX sees {jax.device_count()} "
             f"{jax.default_backend()} device(s): run it as `python -m benchmarks.activation_layout` (it asks XLA for "
             f"{DEVICES} CPU devices), with JAX_PLATFORMS=cpu on an accelerator with fewer.")
  args.batch, args.length = (8, 8) if args.smoke else (args.batch, args.length)
  if args.batch % DEVICES:
    sys.exit(f"error: --batch={args.batch} must be a multiple of {DEVICES} (the data axis of the FSDP layout).")
  if not args.smoke:
    measure.disable_persistent_cache()
  machine = host_description(load_average=True)
  report = common.Report(
      "activation_layout", "Activation sharding constraints: train-step memory and collectives per device, with and "
      "without (benchmarks/activation_layout.py)",
      ["layout", "mesh (data x model)", "activation constraints", "temp MB per device", "temp / without",
       "argument MB per device", *COLLECTIVES, "compile s"])
  left_out, unchanged, mentions = [], [], []
  layouts = dict(list(LAYOUTS.items())[:1]) if args.smoke else LAYOUTS  # smoke: FSDP + tensor parallel only
  for name, (data, model, fsdp) in layouts.items():
    if common.out_of_time(args):
      left_out.append(name)
      continue
    measured = {}  # constrained -> (memory, collective counts, mentions of "all-to-all", compile seconds)
    for constrained in (False, True):
      compiled, seconds = compile_layout(args, data, model, fsdp, constrained)
      text = compiled.as_text()
      measured[constrained] = measure.memory_stats(compiled), collective_counts(text), text.count("all-to-all"), seconds
      print(f"{name}, {'with' if constrained else 'without'} constraints: temp "
            f"{measured[constrained][0].temp / 1e6:,.1f} MB, {measured[constrained][1]}, compiled in {seconds:.1f} s",
            flush=True)
    for constrained, (memory, counts, _, seconds) in measured.items():
      report.rows.append([name, f"{data} x {model}", "with" if constrained else "without", memory.temp / 1e6,
                          measure.ratio(memory.temp, measured[False][0].temp), memory.argument / 1e6,
                          *counts.values(), seconds])
    report.ratios[f"{name} temp"] = measure.ratio(measured[True][0].temp, measured[False][0].temp)
    if measured[True][:2] == measured[False][:2]:
      unchanged.append(name)
    mentions.append(f"{name} {measured[False][2]} / {measured[True][2]}")
  report.notes += [
      f"multi30k.py:{args.config}'s model{' (smoke size, 4 heads)' if args.smoke else ''}, float32, dropout as "
      f"configured; {args.batch} x {args.length} source + {args.length} target tokens per step over {DEVICES} "
      f"{jax.default_backend().upper()} devices. Compiled, not run. MB = 10^6 bytes, one device's: temp = XLA's "
      "scratch buffers, argument = its shards of the train state and the batch. Collectives: the compiled HLO's "
      "instructions of each kind (a -start/-done pair once).",
      "Without constraints: the same step traced outside MeshStrategy.activation_layout (Unconstrained), as "
      "tests/train/test_tensor_parallel.py compares it; the parameters' layout is the same in both.",
      "An all-to-all here is one instruction with a tuple of results, so its name also stands at each use of a "
      "result: the word 'all-to-all' occurs, without / with constraints, " + ", ".join(mentions) + " times in the "
      "HLO text (a count of occurrences, not of instructions, as the figure first quoted for FSDP + tensor parallel "
      "counted them).",
  ]
  if unchanged:
    report.notes.append(f"{', '.join(unchanged)}: the same temp bytes and collectives with and without constraints "
                        "(XLA's sharding propagation finds that layout by itself).")
  if left_out:
    report.notes.append(f"Not compiled (--time_budget_s={args.time_budget_s:g} spent): {', '.join(left_out)}.")
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
