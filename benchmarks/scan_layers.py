"""Layers under scan: compile time and step time of the train step, scanned (``config.model.scan_layers``) vs
unrolled, as the number of layers grows.

    python -m benchmarks.scan_layers                    # 2, 6 and 12 encoder + decoder layers
    python -m benchmarks.scan_layers --smoke            # seconds, prints only

For each count in ``--layers`` (each of the encoder and the decoder has that many layers): the train step as
``benchmarks/train_step.py`` builds it (the task's loss, Adam, the state donated) for a small multi30k
Transformer (``--d_model``, 4 heads, d_ff 4 x d_model, vocabulary 1,000, dropout on), compiled with the
persistent compilation cache off (the seconds cover tracing, lowering and XLA), both forms in the same process,
then run with the forms taking turns (the median of ``--repeats``).

Target: compile time that grows with the layer count unrolled and stays about flat scanned, at a step time
within a few percent.
"""
from __future__ import annotations

import sys

from benchmarks import common, measure
from benchmarks.train_step import compile_step, experiment_config, random_batch
from experiments.record_store import host_description
from transformer.train.config import build_task


def add_arguments(parser):
  parser.add_argument("--layers", type=common.positive_int, nargs="+", default=[2, 6, 12],
                      help="encoder (and decoder) layer counts to measure")
  parser.add_argument("--d_model", type=common.positive_int, default=64, help="the model width")
  parser.add_argument("--batch", type=common.positive_int, default=8, help="examples per step")
  parser.add_argument("--length", type=common.positive_int, default=16, help="source and target tokens per example")


def compile_form(args, layers: int, scan_layers: bool):
  """The ``train_step.CompiledStep`` of the benchmark model with ``layers`` + ``layers`` layers."""
  config, model_config = experiment_config(
      "transformer_small", vocab_size=1000, d_model=args.d_model, num_heads=4, d_ff=4 * args.d_model,
      num_encoder_layers=layers, num_decoder_layers=layers, scan_layers=scan_layers)
  model = build_task(config).build_model(model_config)
  batch = random_batch(args.batch, args.length, args.length, model_config.vocab_size)
  step = compile_step(config, model, batch, smoke=args.smoke)
  print(f"{layers} layers, {'scanned' if scan_layers else 'unrolled'}: compiled in {step.compile_seconds:.1f} s",
        flush=True)
  return step


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  if args.smoke:
    args.layers, args.d_model, args.batch, args.length = [1, 2], 16, 2, 8
  else:
    measure.disable_persistent_cache()
  machine = host_description(load_average=True)
  report = common.Report(
      "scan_layers", "Layers under scan: compile and step time, scanned vs unrolled (benchmarks/scan_layers.py)",
      ["layers (encoder + decoder)", "compile s unrolled", "compile s scanned", "compile scanned / unrolled",
       "step ms unrolled", "step ms scanned", "step scanned / unrolled"])
  for layers in args.layers:
    if common.out_of_time(args):
      report.notes.append(f"Stopped before {layers} layers: --time_budget_s={args.time_budget_s:g} spent.")
      break
    steps = {"unrolled": compile_form(args, layers, False), "scanned": compile_form(args, layers, True)}
    times = measure.time_interleaved(steps, warmup=args.warmup, repeats=args.repeats)
    compile_s = {form: step.compile_seconds for form, step in steps.items()}
    step_ms = {form: 1e3 * timing.median for form, timing in times.items()}
    report.rows.append([f"{layers} + {layers}", compile_s["unrolled"], compile_s["scanned"],
                        measure.ratio(compile_s["scanned"], compile_s["unrolled"]), step_ms["unrolled"],
                        step_ms["scanned"], measure.ratio(step_ms["scanned"], step_ms["unrolled"])])
    report.ratios[f"{layers} layers compile"] = measure.ratio(compile_s["scanned"], compile_s["unrolled"])
    report.ratios[f"{layers} layers step"] = measure.ratio(step_ms["scanned"], step_ms["unrolled"])
    del steps
  report.notes += [
      f"multi30k.py:transformer_small's recipe at d_model {args.d_model}, 4 heads, d_ff {4 * args.d_model}, "
      f"vocabulary 1,000, float32; {args.batch} x {args.length} source + {args.length} target tokens. Compile s: "
      "trace, lower and compile of the whole train step (persistent cache off). Step ms: median of "
      f"{args.repeats} calls after {args.warmup} warm-up, the two forms taking turns.",
      "A loaded host (the machine line's load average) stretches both columns alike; the ratios are measured in "
      "one process."]
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
