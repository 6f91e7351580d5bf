"""Rematerialisation: the train step's planned memory and time under each ModelConfig.remat policy.

    python -m benchmarks.remat                     # transformer_base; bfloat16 at batch 256 on an accelerator
    python -m benchmarks.remat --smoke             # seconds, prints only

For each policy of ``transformer.nn.config.REMAT_POLICIES`` ("none" keeps every activation for the backward
pass, "dots" the matmul outputs without batch dimensions, "full" only each layer's input): the train step as
``benchmarks/train_step.py`` builds it (the task's loss, Adam, the state donated), compiled at ``--batch``;
the peak memory XLA plans for it (``measure.memory_stats``), and its time per step twice: each call waited for
(as ``train_step.py`` times), and ``--back_to_back`` calls dispatched without waiting (as the training loop
runs: it never waits for a step), policies taking turns. Then at ``--fit_batch`` the steps are compiled only,
not run: their planned peaks against ``--memory_limit_gib`` (default: the memory this device has free).

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
  """policy -> ``train_step.CompiledStep`` of ``args.config``'s model at ``batch_size``."""
  steps = {}
  for policy in policies:
    if common.out_of_time(args):
      break
    config, model_config = experiment_config(args.config, args.smoke, dtype=args.dtype, remat=policy)
    model = build_task(config).build_model(model_config)
    batch = random_batch(batch_size, args.length, args.length, model_config.vocab_size)
    steps[policy] = compile_step(config, model, batch, smoke=args.smoke)
    print(f"batch {batch_size} remat={policy}: compiled in {steps[policy].compile_seconds:.1f} s, planned peak "
          f"{measure.mib(measure.memory_stats(steps[policy].compiled).peak):,.0f} MiB", flush=True)
  return steps


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

  steps = compile_policies(args, batch_size, REMAT_POLICIES)
  waited = measure.time_interleaved(steps, warmup=args.warmup, repeats=args.repeats)
  back_to_back = measure.time_interleaved(steps, warmup=args.warmup, repeats=args.repeats,
                                          back_to_back=args.back_to_back)
  report = common.Report(
      "remat", "Rematerialisation: planned memory and step time per policy (benchmarks/remat.py)",
      ["policy", "batch", "planned peak MiB", "peak / none", "step ms (each waited for)",
       f"step ms ({args.back_to_back} back to back)", "time / none (back to back)", "compile s"])
  peaks = {policy: measure.memory_stats(step.compiled).peak for policy, step in steps.items()}
  for policy, step in steps.items():
    report.rows.append([policy, batch_size, measure.mib(peaks[policy]), measure.ratio(peaks[policy], peaks["none"]),
                        1e3 * waited[policy].median, 1e3 * back_to_back[policy].median,
                        measure.ratio(back_to_back[policy].median, back_to_back["none"].median),
                        step.compile_seconds])
    report.ratios[f"{policy} memory"] = measure.ratio(peaks[policy], peaks["none"])
  del steps

  fit_steps = compile_policies(args, fit_batch, ("none", "full"))
  fits = {policy: measure.memory_stats(step.compiled).peak for policy, step in fit_steps.items()}
  del fit_steps
  if len(fits) < 2:
    report.notes.append(f"Batch {fit_batch}: {', '.join(sorted({'none', 'full'} - set(fits)))} not compiled: "
                        f"--time_budget_s={args.time_budget_s:g} spent.")
  for policy, peak in fits.items():
    report.rows.append([policy, fit_batch, measure.mib(peak), measure.ratio(peak, fits.get("none")), "not run",
                        "not run", None, None])
  verdict = {policy: peak <= limit for policy, peak in fits.items()}
  met = verdict.get("full") and verdict.get("none") is False
  report.notes += [
      f"multi30k.py:{args.config}'s model, {args.dtype} compute (parameters and Adam float32), dropout as "
      f"configured; {batch_size} x {args.length} source + {args.length} target tokens. Planned peak = XLA's "
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
