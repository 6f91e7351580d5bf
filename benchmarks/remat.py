"""Rematerialisation and the optimizer: the train step's planned memory and time under each ModelConfig.remat
policy, and with Adafactor (``config.optimizer.name``) in place of Adam.

    python -m benchmarks.remat                     # transformer_base; bfloat16 at batch 256 on an accelerator
    python -m benchmarks.remat --smoke             # seconds, prints only

For each policy of ``transformer.nn.config.REMAT_POLICIES`` ("none" keeps every activation for the backward
pass, "dots" the matmul outputs without batch dimensions, "full" only each layer's input): the train step as
``benchmarks/train_step.py`` builds it (the task's loss, Adam, the state donated), compiled at ``--batch``;
the peak memory XLA plans for it (``measure.memory_stats``), and its time per step twice: each call waited for
(as ``train_step.py`` times), and ``--back_to_back`` calls dispatched without waiting (as the training loop
runs: it never waits for a step), policies taking turns. The same without remat with Adafactor: its optimizer
state beside Adam's (bytes of the state's optimizer part) and the step's planned peak. Then at ``--fit_batch``
the steps are compiled only, not run: their planned peaks against ``--memory_limit_gib`` (default: the memory
this device has free).

Target: at ``--fit_batch``, "full" fits under the limit where "none" does not. XLA:CPU's memory plan does not
shrink with rematerialisation (its buffer assignment keeps the same peak), so on a CPU the peaks only say so.
"""
from __future__ import annotations

import sys

import jax

from benchmarks import common, measure
from benchmarks.train_step import compile_step, experiment_config, random_batch
from experiments.record_store import host_description
from transformer.nn.config import REMAT_POLICIES
from transformer.train.config import build_task


def add_arguments(parser):
  parser.add_argument("--config", default="transformer_base", help="the multi30k.py variant whose model is used")
  parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                      help="compute dtype (default: bfloat16 on an accelerator, float32 on a CPU)")
  parser.add_argument("--batch", type=common.positive_int, default=None,
                      help="examples per step (default: 256 on an accelerator, 8 on a CPU)")
  parser.add_argument("--length", type=common.positive_int, default=64, help="source and target tokens per example")
  parser.add_argument("--back_to_back", type=common.positive_int, default=10,
                      help="calls dispatched without waiting per timed sample")
  parser.add_argument("--fit_batch", type=common.positive_int, default=None,
                      help="the batch compiled (not run) against the memory limit (default: 16 x --batch)")
  parser.add_argument("--memory_limit_gib", type=common.positive_float, default=None,
                      help="the limit a step must fit in (default: this device's free memory)")


def compile_policies(args, batch_size: int, policies) -> dict:
  """policy -> ``train_step.CompiledStep`` of ``args.config``'s model at ``batch_size``, with Adam."""
  steps = {}
  for policy in policies:
    if common.out_of_time(args):
      break
    steps[policy] = compile_one(args, batch_size, policy, "adamw")
  return steps


def compile_one(args, batch_size: int, policy: str, optimizer: str):
  """The ``train_step.CompiledStep`` of ``args.config``'s model at ``batch_size`` with remat ``policy`` and
  ``optimizer`` (``config.optimizer.name``)."""
  config, model_config = experiment_config(args.config, args.smoke, dtype=args.dtype, remat=policy)
  config.optimizer.name = optimizer
  model = build_task(config).build_model(model_config)
  batch = random_batch(batch_size, args.length, args.length, model_config.vocab_size)
  step = compile_step(config, model, batch, smoke=args.smoke)
  print(f"batch {batch_size} remat={policy} {optimizer}: compiled in {step.compile_seconds:.1f} s, planned peak "
        f"{measure.mib(measure.memory_stats(step.compiled).peak):,.0f} MiB, optimizer state "
        f"{measure.mib(optimizer_state_bytes(step)):,.1f} MiB", flush=True)
  return step


def optimizer_state_bytes(step) -> int:
  """Bytes of the optimizer's state in ``step``'s train state (Adam: two moments the size of the parameters)."""
  return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(step.state.opt_state))


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  accelerator = jax.default_backend() != "cpu"
  args.dtype = args.dtype or ("bfloat16" if accelerator else "float32")
  batch_size = 2 if args.smoke else args.batch or (256 if accelerator else 8)
  args.length = 8 if args.smoke else args.length
  fit_batch = args.fit_batch or 16 * batch_size
  if not args.smoke:
    measure.disable_persistent_cache()
  machine = host_description(load_average=True)
  limit = args.memory_limit_gib * 2**30 if args.memory_limit_gib else measure.available_memory_bytes()

  steps = {(policy, "adamw"): step for policy, step in compile_policies(args, batch_size, REMAT_POLICIES).items()}
  if not common.out_of_time(args):  # Adafactor's factored moments beside Adam's two, without remat
    steps["none", "adafactor"] = compile_one(args, batch_size, "none", "adafactor")
  waited = measure.time_interleaved(steps, warmup=args.warmup, repeats=args.repeats)
  back_to_back = measure.time_interleaved(steps, warmup=args.warmup, repeats=args.repeats,
                                          back_to_back=args.back_to_back)
  report = common.Report(
      "remat", "Rematerialisation: planned memory and step time per policy (benchmarks/remat.py)",
      ["policy", "optimizer", "batch", "optimizer state MiB", "planned peak MiB", "peak / none", "step ms (each "
       "waited for)", f"step ms ({args.back_to_back} back to back)", "time / none (back to back)", "compile s"])
  peaks = {key: measure.memory_stats(step.compiled).peak for key, step in steps.items()}
  states = {key: optimizer_state_bytes(step) for key, step in steps.items()}
  reference = ("none", "adamw")
  for (policy, optimizer), step in steps.items():
    key = policy, optimizer
    report.rows.append([policy, optimizer, batch_size, measure.mib(states[key]), measure.mib(peaks[key]),
                        measure.ratio(peaks[key], peaks[reference]), 1e3 * waited[key].median,
                        1e3 * back_to_back[key].median,
                        measure.ratio(back_to_back[key].median, back_to_back[reference].median), step.compile_seconds])
    report.ratios[f"{policy} memory" if optimizer == "adamw" else f"{optimizer} memory"] = measure.ratio(
        peaks[key], peaks[reference])
  if ("none", "adafactor") in states:
    report.ratios["adafactor optimizer state"] = measure.ratio(states["none", "adafactor"], states[reference])
  del steps

  fit_steps = compile_policies(args, fit_batch, ("none", "full"))
  fits = {policy: measure.memory_stats(step.compiled).peak for policy, step in fit_steps.items()}
  del fit_steps
  if len(fits) < 2:
    report.notes.append(f"Batch {fit_batch}: {', '.join(sorted({'none', 'full'} - set(fits)))} not compiled: "
                        f"--time_budget_s={args.time_budget_s:g} spent.")
  for policy, peak in fits.items():
    report.rows.append([policy, "adamw", fit_batch, None, measure.mib(peak), measure.ratio(peak, fits.get("none")),
                        "not run", "not run", None, None])
  verdict = {policy: peak <= limit for policy, peak in fits.items()}
  met = verdict.get("full") and verdict.get("none") is False
  report.notes += [
      f"multi30k.py:{args.config}'s model, {args.dtype} compute (parameters and optimizer state float32), dropout "
      f"as configured; {batch_size} x {args.length} source + {args.length} target tokens. Optimizer state = the "
      f"bytes of the train state's optimizer part (adamw: two moments per parameter; adafactor, optax's: a row and "
      f"a column of second moments per matrix, no first moment). Planned peak = XLA's "
      f"memory analysis of the compiled step (arguments + outputs + temporaries - aliased). Times: median of "
      f"{args.repeats} samples after {args.warmup} warm-up, the policies taking turns.",
      f"Target (at batch {fit_batch}, 'full' fits under {measure.mib(limit) / 1024:.1f} GiB where 'none' does "
      f"not): " + (", ".join(f"{policy} {'fits' if fit else 'does not fit'}" for policy, fit in verdict.items())
                   + f" ({'met' if met else 'not met'})." if len(fits) == 2 else "not run (not both compiled)."),
  ]
  if not accelerator:
    report.notes.append("On a CPU XLA's memory plan does not shrink with rematerialisation: measure on an "
                        "accelerator.")
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
