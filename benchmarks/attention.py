"""Question 1: is our dense attention as fast as the stock ones?

    python -m benchmarks.attention            # full size, writes benchmarks/RESULTS.md
    python -m benchmarks.attention --smoke    # seconds, prints only

``transformer.ops.dot_product_attention`` with ``kernels="auto"`` (what models use: the XLA:CPU pieces on
CPU, cuDNN's fused attention on a GPU; also timed with ``kernels="reference"``, the plain formula) against
``jax.nn.dot_product_attention`` (XLA; also cuDNN on GPU) and ``flax.linen.dot_product_attention``, forward and forward+backward (gradients of q, k, v), float32 and
bfloat16, self attention without a mask at lengths 128..4096 with the base model's 8 heads of 64. Each
batch holds ``--tokens`` tokens (batch = tokens / length, at least 1), so short lengths are not all
dispatch overhead. Target: ours at most 1.1x the fastest reference at every size.
"""
from __future__ import annotations

import functools
import itertools
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp

from benchmarks import common, measure
from experiments.record_store import host_description
from transformer import ops

TARGET = 1.1
DTYPES = ("float32", "bfloat16", "float16")  # the floating-point types attention runs in


def add_arguments(parser):
  parser.add_argument("--lengths", type=common.positive_int, nargs="+", default=None, help="sequence lengths")
  parser.add_argument("--tokens", type=common.positive_int, default=None,
                      help="tokens per batch (batch = tokens / length)")
  parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=DTYPES)
  parser.add_argument("--budget_s", type=common.positive_float, default=60.0, help="time budget per measurement")


# Ours with logits and softmax in the inputs' dtype, as flax's stock attention (bfloat16 rows only; in
# float32 it is the same program as ours). Timed beside the default to measure what float32 logits cost.
LOW_PRECISION_LOGITS = "ours, float32_logits=False"
# Ours with the plain formula (no backend-tuned kernels): what the kernels buy on this machine.
REFERENCE_KERNELS = "ours, kernels=reference"


def implementations() -> dict:
  """name -> ``f(q, k, v) -> out``, all on ``[batch, length, heads, head_dim]``; ours first."""
  auto = ops.select_kernels("auto")
  found = {
      "ours": functools.partial(ops.dot_product_attention, kernels=auto),
      LOW_PRECISION_LOGITS: functools.partial(ops.dot_product_attention, float32_logits=False, kernels=auto),
      REFERENCE_KERNELS: functools.partial(ops.dot_product_attention, kernels=ops.select_kernels("reference")),
      "jax.nn (xla)": functools.partial(jax.nn.dot_product_attention, implementation="xla"),
      "flax": nn.dot_product_attention,  # stock defaults: softmax in the input dtype
  }
  if jax.default_backend() == "gpu":
    found["jax.nn (cudnn)"] = functools.partial(jax.nn.dot_product_attention, implementation="cudnn")
  return found


def forward_backward(attention):
  """Gradients of ``sum(out * cotangent)`` w.r.t. q, k and v: one forward and one full backward pass."""
  def loss(q, k, v, cotangent):
    return jnp.sum(attention(q, k, v).astype(jnp.float32) * cotangent)
  return jax.grad(loss, argnums=(0, 1, 2))


def attention_inputs(dtype: str, pass_name: str, batch: int, length: int, heads: int, head_dim: int) -> tuple:
  """Random q, k, v ``[batch, length, heads, head_dim]`` in ``dtype``, seeded by ``length``; for forward+backward
  also the float32 cotangent of the output."""
  keys = jax.random.split(jax.random.PRNGKey(length), 4)
  shape = (batch, length, heads, head_dim)
  q, k, v = (jax.random.normal(key, shape, jnp.float32).astype(dtype) for key in keys[:3])
  cotangent = jax.random.normal(keys[3], shape, jnp.float32)
  return (q, k, v) if pass_name == "forward" else (q, k, v, cotangent)


def time_size(args, candidates: dict, dtype: str, pass_name: str, inputs: tuple,
              report: common.Report) -> tuple[dict[str, float], dict]:
  """Compile each of ``candidates`` for ``inputs`` and time them in turns: ``(median ms, compiled program)`` per
  name. One that does not compile is a note in ``report``; the float32-logits variant runs in low precision only."""
  size = f"{dtype} {pass_name} L={inputs[0].shape[1]}"
  compiled = {}
  for name, attention in candidates.items():
    if name == LOW_PRECISION_LOGITS and jnp.finfo(dtype).bits == 32:
      continue
    fn = jax.jit(attention if pass_name == "forward" else forward_backward(attention))
    try:
      compiled[name] = fn.lower(*inputs).compile()
    except Exception as error:  # e.g. cuDNN refusing float32: report, keep measuring the others
      report.notes.append(f"{name} {size}: not run ({type(error).__name__}).")
  calls = {name: lambda program=program: program(*inputs) for name, program in compiled.items()}
  timings = measure.time_interleaved(calls, warmup=args.warmup, repeats=args.repeats, budget_s=args.budget_s)
  return {name: 1e3 * timing.median for name, timing in timings.items()}, compiled


def add_row(report: common.Report, names: list[str], size: tuple, milliseconds: dict,
            low_precision_ratios: dict) -> None:
  """The row of one size ``(dtype, pass, length, batch)``: each implementation's ms, ours' and the low-precision
  variant's ratio to the fastest reference (the latter also into ``low_precision_ratios``)."""
  dtype, pass_name, length, _ = size
  references = [ms for name, ms in milliseconds.items() if not name.startswith("ours")]
  fastest = min(references) if references else None
  value = measure.ratio(milliseconds.get("ours"), fastest)
  low_precision = measure.ratio(milliseconds.get(LOW_PRECISION_LOGITS), fastest)
  report.ratios[f"{dtype} {pass_name} L={length}"] = value
  if LOW_PRECISION_LOGITS in milliseconds:
    low_precision_ratios[f"{dtype} {pass_name} L={length}"] = low_precision
  report.rows.append(list(size) + [milliseconds.get(name) for name in names]
                     + [value, low_precision if LOW_PRECISION_LOGITS in milliseconds else None])


def method_notes(args, heads: int, head_dim: int, tokens: int) -> list[str]:
  """What was timed and how, and what each implementation computes in."""
  return [
      f"{heads} heads of {head_dim}, self attention without a mask, {tokens} tokens per batch; median of up to "
      f"{args.repeats} calls after {args.warmup} warm-up, the implementations taking turns (round robin); "
      "forward+backward = gradients of q, k and v.",
      "flax runs with its stock defaults (softmax in the input dtype); ours and jax.nn take the softmax in "
      f"float32; {LOW_PRECISION_LOGITS} (low-precision rows only) takes logits and softmax in the input "
      f"dtype, like flax. ours uses kernels=\"auto\" ({ops.select_kernels('auto').name} here); "
      f"{REFERENCE_KERNELS} is the plain formula, not counted as a reference.",
  ]


def target_note(ratios: dict, low_precision_ratios: dict) -> str:
  """The verdict on ``TARGET``: ours' worst ratio, and the worst taking in low precision the faster of the
  default and the low-precision variant (where the default misses only because of its float32 logits)."""
  measured = [value for value in ratios.values() if value == value]
  worst = max(measured) if measured else float("nan")
  best_of_both = [min(value, low_precision_ratios.get(key, value)) for key, value in ratios.items()
                  if value == value]
  worst_either = max(best_of_both) if best_of_both else float("nan")
  return (f"Target: ours at most {TARGET}x the fastest reference at every size; worst ratio {common.fmt(worst)} "
          f"({'met' if worst <= TARGET else 'not met'}) with the default float32 logits; "
          f"{common.fmt(worst_either)} ({'met' if worst_either <= TARGET else 'not met'}) taking, in low "
          f"precision, the faster of the default and {LOW_PRECISION_LOGITS}.")


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  machine = host_description(load_average=True)
  heads, head_dim = (2, 8) if args.smoke else (8, 64)
  lengths = args.lengths or ([32] if args.smoke else [128, 256, 512, 1024, 2048, 4096])
  tokens = args.tokens or (64 if args.smoke else 4096)
  dtypes = args.dtypes[:1] if args.smoke and args.dtypes == ["float32", "bfloat16"] else args.dtypes
  candidates = implementations()
  names = list(candidates)
  report = common.Report(
      "attention", "Attention: ours vs jax.nn.dot_product_attention and flax (benchmarks/attention.py)",
      ["dtype", "pass", "length", "batch"] + [f"{name} ms" for name in names]
      + ["ours / fastest reference", f"{LOW_PRECISION_LOGITS} / fastest reference"])
  low_precision_ratios = {}
  largest_temporaries = {}  # dtype -> {name: MiB of temporaries XLA plans}, forward+backward, longest length
  not_run = []  # sizes left out once --time_budget_s is spent

  for dtype, pass_name, length in itertools.product(dtypes, ("forward", "forward+backward"), lengths):
    if common.out_of_time(args):
      not_run.append(f"{dtype} {pass_name} L={length}")
      continue
    batch = max(1, tokens // length)
    inputs = attention_inputs(dtype, pass_name, batch, length, heads, head_dim)
    milliseconds, compiled = time_size(args, candidates, dtype, pass_name, inputs, report)
    if pass_name == "forward+backward" and length == max(lengths):
      for name, program in compiled.items():
        largest_temporaries.setdefault(dtype, {})[name] = measure.memory_stats(program).temp / 2**20
    add_row(report, names, (dtype, pass_name, length, batch), milliseconds, low_precision_ratios)

  if not_run:
    report.notes.append(f"Not run, --time_budget_s={args.time_budget_s:g} spent: {', '.join(not_run)}.")
  report.notes += [
      f"Temporaries XLA plans for forward+backward at {max(lengths)} tokens ({dtype}, compiled "
      "memory_analysis): " + ", ".join(f"{name} {mib:,.1f} MiB" for name, mib in temporaries.items()) + "."
      for dtype, temporaries in largest_temporaries.items()]
  report.notes += [*method_notes(args, heads, head_dim, tokens), target_note(report.ratios, low_precision_ratios)]
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
