r"""Questions 3, 6a and 7: train-step throughput, MFU and compile time, ours vs flax's stock layers and PyTorch.

    python -m benchmarks.train_step            # small and base translation configs, writes RESULTS.md
    python -m benchmarks.train_step --smoke    # a tiny model, prints only
    # on a GPU (question 7): bfloat16, PyTorch eager and compiled beside ours, ours at larger batches for MFU
    python -m benchmarks.train_step --dtype=bfloat16 --batch 128 256 512 1024 --torch_compile
    # the anchors of issue 73 on an 80 GB GPU: base and big, references at 512, ours also at 1024 (device filled)
    python -m benchmarks.train_step --configs transformer_base transformer_big --dtype=bfloat16 --batch 512 1024 \
        --torch_compile --no_flax_stock --gpu_option_rows=none

One full training step (label-smoothed cross entropy, backward pass, Adam update; dropout as configured)
on a batch of ``--batch`` x 64 source and 64 target tokens (no padding; default 16, float32) for the
translation experiment's ``transformer_small`` (vocabulary 8k, as its data) and ``transformer_base``
(vocabulary 32k) models, and with ``--configs transformer_big`` the paper's Transformer (big): base's 6+6
layers at d_model 1024, 16 heads, d_ff 4096, dropout 0.3, vocabulary 32k (``DERIVED_CONFIGS``; 209M
parameters):

- ours: the translation task + ``make_train_step`` + ``make_optimizer``, compiled by the ``jit`` strategy,
  exactly as ``transformer.train.run`` builds it;
- ours, Eigen dots (CPU only): the same step compiled with the XLA option in ``CPU_OPTION_ROWS`` that
  moves the matmuls from YNNPACK (this jaxlib's default) to Eigen: how much is the matmul library
  (``--cpu_option_rows=all``: a row for each of the other options there too);
- ours, no command buffers (GPU only): the same step with XLA's CUDA graphs off (``GPU_OPTION_ROWS``);
- flax-stock: the same model built from ``flax.linen``'s stock ``MultiHeadDotProductAttention``,
  ``LayerNorm``, ``Dense`` and ``Embed.attend`` (``FlaxStockTransformer`` below), trained by the same task
  loss, optimizer and step, so only the model code differs;
- PyTorch ``nn.Transformer`` of the same shape with ``CrossEntropyLoss(label_smoothing)`` and Adam, on the
  same device (bfloat16 autocast when ``--dtype=bfloat16``; also ``torch.compile``d with
  ``--torch_compile``), when torch is importable (``pip install -e ".[benchmark]"``; never a dependency of
  the package).

Each implementation is timed in a process of its own (``--isolate``, the default; ours shares its process with
its option rows, PyTorch eager with compiled): with PyTorch imported beside it, flax-stock's CPU step was
slower by about 15% while ours did not change, so one process would bias the ratios. Within a process the
steps take turns (``measure.time_interleaved``); ``--no_isolate`` (the default at ``--smoke`` size) times all in
this process. The table's "timed in" column says which.

With several ``--batch`` sizes the references run at the first; ours runs at each, for the best MFU (a size
the device runs out of memory at ends its config's sizes with a note; ours must fit the first).
Throughput is source + target tokens per second; MFU is model FLOPs (``transformer.nn.transformer_flops``) per
second over the matmul peak in ``--dtype`` measured in the same run (XLA's: the fastest call of several sizes,
before and after the timed steps, the higher counts; PyTorch's own peak on the same device is reported beside
it), and over the device's theoretical peak (``measure.theoretical_peak``: the GPU's data sheet, or the CPU's
cores x lanes x FMA x clock; "-" where unknown). An MFU above 100% against either is a measurement error and
shows as one, never as a result. Compile time is tracing + lowering + XLA compilation of the
step, with the persistent compilation cache off.
Targets, CPU: ours >= 1.2x flax-stock and >= 1.5x PyTorch tokens/s, base MFU >= 60%, compile < 60 s.
Accelerator: ours >= 2x PyTorch eager tokens/s at the first batch, base MFU >= 45% at the best batch size.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

# PyTorch shares the GPU with JAX in this process: JAX allocates as it goes instead of taking 75% up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, measure
from experiments import multi30k
from experiments.record_store import REPO, host_description, usable_cores
from transformer import ops
from transformer.nn import ModelConfig
from transformer.nn.config import transformer_flops
from transformer.train.config import RunConfig, build_task
from transformer.train.state import make_optimizer
from transformer.train.mesh import make_strategy
from transformer.train.state import create_train_state
from transformer.train.step import make_train_step

# The --configs: each a translation experiment's variant at a benchmark vocabulary.
VOCAB_SIZES = {"transformer_small": 8000, "transformer_base": 32000, "transformer_big": 32000}
# Configs no experiment trains, as the experiment variant they start from and the model fields they change:
# the paper's "Transformer (big)" (Vaswani et al. 2017, table 3), base's 6+6 layers at d_model 1024, 16 heads,
# d_ff 4096, and its English-German P_drop 0.3 (attention dropout as base's). Only the model differs from base:
# base's optimizer and schedule do not change the step's time.
DERIVED_CONFIGS = {"transformer_big": ("transformer_base", dict(d_model=1024, num_heads=16, d_ff=4096,
                                                                dropout_rate=0.3))}
# ours / reference tokens/s, and base MFU, that the issue asks for: on CPU, and on an accelerator (GPU).
TARGETS = {"cpu": {"flax-stock": 1.2, "pytorch": 1.5}, "accelerator": {"pytorch": 2.0}}
MFU_TARGETS = {"cpu": 0.60, "accelerator": 0.45}
COMPILE_TARGET_S = 60.0
# XLA:CPU compiler options, each measured as an extra row of ours (same model and step, only the option
# differs), CPU only. This jaxlib hands dots to YNNPACK by default; an empty YNN fusion type sends them to
# Eigen (the row run by default), the others are the alternatives tried before keeping XLA's defaults
# (``--cpu_option_rows=all``; benchmarks/FINDINGS.md, "Why these kernels").
_FUSION = "LIBRARY_FUSION_TYPE_"
CPU_OPTION_ROWS = {
    "ours, Eigen dots": {"xla_cpu_experimental_ynn_fusion_type": ""},
    "ours, oneDNN dots": {"xla_cpu_experimental_ynn_fusion_type": "",
                          "xla_cpu_experimental_onednn_fusion_type": _FUSION + "DOT"},
    "ours, XNNPACK dots": {"xla_cpu_experimental_ynn_fusion_type": "",
                           "xla_cpu_experimental_xnn_fusion_type": _FUSION + "DOT"},
    "ours, YNNPACK dots and elementwise": {"xla_cpu_experimental_ynn_fusion_type": f"{_FUSION}DOT,{_FUSION}ELTWISE"},
    "ours, YNNPACK dots, elementwise and reductions": {
        "xla_cpu_experimental_ynn_fusion_type": f"{_FUSION}DOT,{_FUSION}ELTWISE,{_FUSION}REDUCE"},
    "ours, 512-bit vectors": {"xla_cpu_prefer_vector_width": 512},
    "ours, FAST_RUNTIME preset": {"xla_cpu_opt_preset": "CPU_OPT_PRESET_FAST_RUNTIME"},
}
# XLA:GPU launches a step's kernels as CUDA graphs ("command buffers") where it can; the row without them says
# what launching each kernel on its own costs (the profiler of step_profile.py needs them off).
GPU_OPTION_ROWS = {"ours, no command buffers": {"xla_gpu_enable_command_buffer": ""}}


def add_arguments(parser):
  parser.add_argument("--configs", nargs="+", default=["transformer_small", "transformer_base"],
                      choices=sorted(VOCAB_SIZES),
                      help="the models: multi30k.py's small and base, and the paper's big (DERIVED_CONFIGS)")
  parser.add_argument("--batch", type=common.positive_int, nargs="+", default=[16],
                      help="batch sizes: the references run at the first, ours at each")
  parser.add_argument("--length", type=common.positive_int, default=64, help="source and target tokens per example")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                      help="compute dtype of every implementation and of the matmul peak")
  parser.add_argument("--matmul_size", type=common.positive_int, default=None,
                      help="side of the peak matmul (default: the best of measure.peak_matmul_sizes)")
  parser.add_argument("--no_dropout", action="store_true", help="train without dropout (all three)")
  parser.add_argument("--no_torch", action="store_true", help="skip the PyTorch reference")
  parser.add_argument("--no_flax_stock", action="store_true", help="skip the flax-stock reference")
  parser.add_argument("--torch_compile", action="store_true", help="also time the torch.compile'd PyTorch step")
  parser.add_argument("--cpu_option_rows", default="eigen", choices=["none", "eigen", "all"],
                      help="extra rows of ours compiled with XLA:CPU options (CPU_OPTION_ROWS): none, the Eigen "
                           "dots row, or all of them")
  parser.add_argument("--gpu_option_rows", default="all", choices=["none", "all"],
                      help="extra rows of ours compiled with XLA:GPU options (GPU_OPTION_ROWS) on an accelerator")
  parser.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                      help="time each implementation (ours with its option rows, flax-stock, PyTorch) in a process "
                           "of its own, one after the other (the default, except at --smoke size)")
  parser.add_argument("--no_isolate", dest="isolate", action="store_false",
                      help="time all implementations in this process, taking turns")
  parser.add_argument("--only", default=None, choices=GROUPS,
                      help="measure this implementation only and write the measurements to --measurements_out (what "
                           "--isolate runs in each process)")
  parser.add_argument("--measurements_out", default=None, help="with --only: the JSON file to write")


# --------------------------------------------------------------------------------- the configs, the batch

SMOKE_MODEL = dict(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1)


def experiment_config(variant: str, smoke: bool = False, no_dropout: bool = False, experiment=multi30k,
                      vocab_size: int | None = None, **model_changes):
  """``(config, model_config)``: a translation experiment's config and its model at a benchmark vocabulary
  (default ``VOCAB_SIZES[variant]``); a ``DERIVED_CONFIGS`` name is its experiment variant with its model
  changes. ``smoke`` shrinks the model to a few thousand parameters (same code)."""
  experiment_variant, derived_changes = DERIVED_CONFIGS.get(variant, (variant, {}))
  config = experiment.get_config(experiment_variant)
  model_changes = {**derived_changes, **(SMOKE_MODEL if smoke else {}), **model_changes}
  if no_dropout:
    model_changes.update(dropout_rate=0.0, attention_dropout_rate=0.0, feed_forward_dropout_rate=0.0)
  for name, value in model_changes.items():
    config.model[name] = value
  task = build_task(config)  # the translation task loads its data lazily; the loss needs none
  vocab_size = 64 if smoke else (vocab_size or VOCAB_SIZES[variant])
  model_config = task.make_model_config(vocab_size=vocab_size, target_vocab_size=None, share_embeddings=True,
                                        pad_id=0, bos_id=1, eos_id=2)
  return config, model_config


def random_batch(batch_size: int, source_length: int, target_length: int, vocab_size: int, seed: int = 0):
  """``{"source", "target"}`` int32 of ids ``3..vocab`` (no padding, no special ids)."""
  rng = np.random.default_rng(seed)
  return {"source": rng.integers(3, vocab_size, (batch_size, source_length), dtype=np.int32),
          "target": rng.integers(3, vocab_size, (batch_size, target_length), dtype=np.int32)}


# ------------------------------------------------------------------------------ our step, timed as used

@dataclasses.dataclass
class CompiledStep:
  """A compiled train step with its state; ``time()`` runs it, threading the (donated) state through."""
  compiled: Any
  state: Any
  batch: Any
  compile_seconds: float
  num_params: int

  def __call__(self):
    self.state, metrics = self.compiled(self.state, self.batch)
    return metrics

  def time(self, warmup: int, repeats: int, budget_s: float | None = None) -> measure.Timing:
    return measure.time_fn(self, warmup=warmup, repeats=repeats, budget_s=budget_s)

  def xla_flops(self) -> float:
    """FLOPs XLA's cost analysis counts for the step (all ops, not only matmuls); NaN if not reported."""
    analysis = self.compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
      analysis = analysis[0] if analysis else {}
    return float((analysis or {}).get("flops", float("nan")))


def compile_step(config, model, batch, seed: int = 0, smoke: bool = False,
                 compiler_options: dict | None = None, num_replicas: int = 1) -> CompiledStep:
  """``model``'s train step as ``transformer.train.run`` builds it for ``config`` (its task's loss, optimizer,
  ``jit`` strategy with the state donated), compiled for ``batch`` (quickly but unoptimised if ``smoke``;
  with XLA ``compiler_options`` if given); ``num_replicas`` > 1: that many seeds in one ``vmap``ped step
  (``config.num_seeds``), all on ``batch``."""
  run_config = RunConfig.from_config(config)
  task = build_task(run_config)
  optimizer = make_optimizer(run_config.optimizer, run_config.num_train_steps)
  strategy = make_strategy("jit", num_replicas)
  batch = strategy.put_batch(batch)
  key = jax.random.PRNGKey(seed)
  state = strategy.create_state(
      lambda key: create_train_state(model, optimizer, task.init_inputs(batch), key),
      jax.random.split(key, num_replicas) if num_replicas > 1 else key)
  step = strategy.compile_train_step(make_train_step(task, model, optimizer))
  compiled, seconds = measure.compile_timed(
      step, state, batch,
      compiler_options={**(measure.SMOKE_COMPILER_OPTIONS if smoke else {}), **(compiler_options or {})})
  num_params = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(state.params))
  return CompiledStep(compiled, state, batch, seconds, num_params)


# --------------------------------------------------------------------- the same model from stock layers

class FlaxStockTransformer(nn.Module):
  """The ``EncoderDecoder`` of ``config`` built from ``flax.linen`` stock layers, as a flax user would.

  Same shapes, parameter count and compute dtype (``dtype`` of every layer; parameters float32) as ours: shared embedding (normal, std ``d_model**-0.5``) scaled by
  ``sqrt(d_model)``, sinusoidal positions, post- or pre-LN (``config.norm_position``) residual sublayers
  around ``MultiHeadDotProductAttention`` and a ReLU feed-forward, output logits by ``Embed.attend``.
  Only the interface the task's loss needs: ``config`` and ``__call__(source, target) -> logits``.
  """
  config: ModelConfig

  def _embed(self, embedding, tokens, deterministic):
    config = self.config
    x = embedding(tokens) * jnp.sqrt(jnp.asarray(config.d_model, config.compute_dtype))
    x = x + ops.sinusoidal_position_encoding(tokens.shape[1], config.d_model).astype(x.dtype)[None]
    return nn.Dropout(config.dropout_rate)(x, deterministic=deterministic)

  def _sublayer(self, x, sublayer, deterministic):
    config = self.config
    norm = nn.LayerNorm(epsilon=config.norm_epsilon, dtype=config.compute_dtype)
    dropout = nn.Dropout(config.dropout_rate)
    if config.norm_position == "pre":
      return x + dropout(sublayer(norm(x)), deterministic=deterministic)
    return norm(x + dropout(sublayer(x), deterministic=deterministic))

  def _attention(self):
    config = self.config
    return nn.MultiHeadDotProductAttention(
        num_heads=config.num_heads, qkv_features=config.d_model, out_features=config.d_model,
        dropout_rate=config.attention_dropout_rate, kernel_init=nn.initializers.xavier_uniform(),
        dtype=config.compute_dtype)

  def _feed_forward(self, x):
    init = nn.initializers.xavier_uniform()
    dtype = self.config.compute_dtype
    hidden = nn.relu(nn.Dense(self.config.d_ff, kernel_init=init, dtype=dtype)(x))
    return nn.Dense(self.config.d_model, kernel_init=init, dtype=dtype)(hidden)

  @nn.compact
  def __call__(self, source, target):
    config = self.config
    deterministic = config.deterministic
    embedding = nn.Embed(config.vocab_size, config.d_model,
                         embedding_init=nn.initializers.normal(config.d_model ** -0.5), dtype=config.compute_dtype)
    source_valid, target_valid = source != config.pad_id, target != config.pad_id
    encoder_mask = nn.make_attention_mask(source_valid, source_valid)
    self_mask = nn.combine_masks(nn.make_attention_mask(target_valid, target_valid), nn.make_causal_mask(target))
    cross_mask = nn.make_attention_mask(target_valid, source_valid)

    x = self._embed(embedding, source, deterministic)
    for _ in range(config.num_encoder_layers):
      attention = self._attention()
      x = self._sublayer(x, lambda h: attention(h, h, mask=encoder_mask, deterministic=deterministic),
                         deterministic)
      x = self._sublayer(x, self._feed_forward, deterministic)
    encoded = nn.LayerNorm(epsilon=config.norm_epsilon, dtype=config.compute_dtype)(x) if config.norm_position == "pre" else x

    y = self._embed(embedding, ops.shift_right(target, config.bos_id), deterministic)
    for _ in range(config.num_decoder_layers):
      self_attention, cross_attention = self._attention(), self._attention()
      y = self._sublayer(y, lambda h: self_attention(h, h, mask=self_mask, deterministic=deterministic),
                         deterministic)
      y = self._sublayer(y, lambda h: cross_attention(h, encoded, mask=cross_mask, deterministic=deterministic),
                         deterministic)
      y = self._sublayer(y, self._feed_forward, deterministic)
    if config.norm_position == "pre":
      y = nn.LayerNorm(epsilon=config.norm_epsilon, dtype=config.compute_dtype)(y)
    return embedding.attend(y).astype(jnp.float32)


# ------------------------------------------------------------------------------------- PyTorch reference

def torch_device() -> str:
  """The device PyTorch runs the reference on: the accelerator JAX uses if PyTorch sees one, else the CPU."""
  import torch  # benchmark-only extra

  return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


def torch_train_step(model_config: ModelConfig, label_smoothing: float, optimizer_config, batch,
                     device: str = "cpu", compile: bool = False):
  """``(step, parameter count)``: a PyTorch ``nn.Transformer`` train step of the same shape, as a callable
  that runs one step and returns the loss as a host float (so the step has finished when it returns).

  The model: shared ``nn.Embedding`` scaled by ``sqrt(d_model)`` plus sinusoidal positions, ``nn.Transformer``
  (``norm_first`` for pre-LN, ReLU, the config's dropout, batch first), logits by the embedding's transpose;
  ``CrossEntropyLoss(label_smoothing, ignore_index=pad)`` and Adam with the config's betas and epsilon.
  On ``device``; the forward pass and loss under bfloat16 autocast when the config's dtype is bfloat16
  (parameters and Adam stay float32, as ours); ``compile``: the forward pass and loss ``torch.compile``d.
  """
  import torch  # benchmark-only extra

  torch.manual_seed(0)
  if device == "cpu":
    torch.set_num_threads(usable_cores())
  d_model = model_config.d_model
  embedding = torch.nn.Embedding(model_config.vocab_size, d_model)
  torch.nn.init.normal_(embedding.weight, std=d_model ** -0.5)
  transformer = torch.nn.Transformer(
      d_model=d_model, nhead=model_config.num_heads, num_encoder_layers=model_config.num_encoder_layers,
      num_decoder_layers=model_config.num_decoder_layers, dim_feedforward=model_config.d_ff,
      dropout=model_config.dropout_rate, batch_first=True, norm_first=model_config.norm_position == "pre",
      layer_norm_eps=model_config.norm_epsilon)
  embedding.to(device)
  transformer.to(device)
  parameters = list(embedding.parameters()) + list(transformer.parameters())
  optimizer = torch.optim.Adam(parameters, lr=1e-4, betas=(optimizer_config.b1, optimizer_config.b2),
                               eps=optimizer_config.eps)
  loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing, ignore_index=model_config.pad_id)
  source = torch.from_numpy(np.asarray(batch["source"]).astype(np.int64)).to(device)
  target = torch.from_numpy(np.asarray(batch["target"]).astype(np.int64)).to(device)
  decoder_inputs = torch.cat([torch.full_like(target[:, :1], model_config.bos_id), target[:, :-1]], dim=1)
  length = max(source.shape[1], target.shape[1])
  positions = torch.from_numpy(np.array(ops.sinusoidal_position_encoding(length, d_model), np.float32)).to(device)
  causal = torch.nn.Transformer.generate_square_subsequent_mask(target.shape[1], device=device)
  scale = d_model ** 0.5
  autocast = model_config.dtype == "bfloat16"

  def forward_loss():
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast):
      src = embedding(source) * scale + positions[:source.shape[1]]
      tgt = embedding(decoder_inputs) * scale + positions[:target.shape[1]]
      hidden = transformer(src, tgt, tgt_mask=causal, tgt_is_causal=True)
      logits = hidden @ embedding.weight.T
      return loss_fn(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))

  forward_loss = torch.compile(forward_loss) if compile else forward_loss

  def step():
    optimizer.zero_grad(set_to_none=True)
    loss = forward_loss()
    loss.backward()
    optimizer.step()
    return loss.item()  # a host float: the step has finished

  transformer.train()
  return step, sum(p.numel() for p in parameters)


def torch_matmul_peak(size: int, dtype: str, device: str, warmup: int, repeats: int) -> float:
  """FLOP/s of PyTorch's ``[size, size] @ [size, size]`` in ``dtype`` on ``device`` (its BLAS or cuBLAS), from
  the median call."""
  import torch  # benchmark-only extra

  if device == "cpu":
    torch.set_num_threads(usable_cores())
  generator = torch.Generator().manual_seed(0)
  a, b = (torch.randn(size, size, generator=generator).to(device=device, dtype=getattr(torch, dtype))
          for _ in range(2))

  def matmul():
    product = a @ b
    if device != "cpu":
      torch.cuda.synchronize()
    return product

  timing = measure.time_fn(matmul, warmup=warmup, repeats=repeats)
  return 2.0 * size**3 / timing.median


def release_torch_memory() -> None:
  """Hand PyTorch's cached GPU memory back (the references are done) so ours can use it at larger batches."""
  torch = sys.modules.get("torch")
  if torch is not None and torch.cuda.is_available():
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------ measuring

# The implementations by process: with --isolate each group runs in a process of its own (ours with its
# XLA:CPU option rows, PyTorch eager with compiled), so that what one loads (PyTorch's thread pools and
# allocator, above all) cannot change another's time.
GROUPS = ("ours", "flax-stock", "pytorch")
ROW_ORDER = ("ours", "flax-stock", *CPU_OPTION_ROWS, *GPU_OPTION_ROWS, "pytorch", "pytorch compiled")


def chosen_groups(args) -> list[str]:
  """The groups this run measures: all but those ``--no_flax_stock`` / ``--no_torch`` leave out, or ``--only``."""
  skipped = {"flax-stock": args.no_flax_stock, "pytorch": args.no_torch}
  return [group for group in GROUPS if not skipped.get(group) and args.only in (None, group)]


@dataclasses.dataclass
class Measurements:
  """What timing gave, as JSON values (an ``--only`` process writes them for the one that started it).

  ``rows``: one dict per (``variant``, ``batch``, ``implementation``) with ``seconds`` (median step),
  ``params``, ``compile`` (seconds; None for PyTorch) and ``xla_flops`` (None for PyTorch). ``torch_peak``:
  PyTorch's own matmul FLOP/s on its device; ``torch_failures``: PyTorch steps left out after failing."""
  rows: list = dataclasses.field(default_factory=list)
  notes: list = dataclasses.field(default_factory=list)
  torch_note: str | None = None
  torch_peak: float | None = None
  torch_failures: list = dataclasses.field(default_factory=list)

  def merge(self, other: "Measurements") -> None:
    self.rows += other.rows
    self.notes += other.notes
    self.torch_note = self.torch_note or other.torch_note
    self.torch_peak = self.torch_peak or other.torch_peak
    self.torch_failures += other.torch_failures


def torch_references(args, config, model_config, batch, device: str, measurements: Measurements) -> dict:
  """name -> ``(step, parameter count)`` of the PyTorch steps to time (eager; compiled with
  ``--torch_compile``); a step that fails at its first call is left out, named in ``measurements``."""
  variants = {"pytorch": False, **({"pytorch compiled": True} if args.torch_compile else {})}
  steps = {}
  for name, compile in variants.items():
    try:  # one step now: torch.compile compiles at the first call, and may fail there (a note, not a crash)
      step, num_params = torch_train_step(model_config, config.label_smoothing, config.optimizer, batch, device,
                                          compile)
      step()
    except ImportError:
      raise
    except Exception as error:  # the JAX rows still get measured
      print(f"{name}: failed, left out ({type(error).__name__}: {str(error).splitlines()[0][:300]})", flush=True)
      measurements.torch_failures.append(f"{name}: {type(error).__name__}")
      continue
    steps[name] = step, num_params
  return steps


def time_torch_references(args, config, model_config, batch, measurements: Measurements) -> dict:
  """The PyTorch steps to time (``torch_references``), PyTorch's description and its own matmul peak in
  ``measurements``; {} with a note when torch is not importable."""
  try:
    device = torch_device()
    steps = torch_references(args, config, model_config, batch, device, measurements)
    import torch
  except ImportError:
    measurements.torch_note = ("PyTorch reference skipped: torch is not importable here (install the "
                               "benchmark-only extra: pip install -e \".[benchmark]\").")
    return {}
  threads = f"{torch.get_num_threads()} threads" if device == "cpu" else torch.cuda.get_device_name()
  measurements.torch_note = (f"PyTorch {torch.__version__} nn.Transformer on {device} ({threads})"
                             + (", bfloat16 autocast" if args.dtype == "bfloat16" else "")
                             + ("; compiled: torch.compile of the forward pass and loss" if args.torch_compile
                                else "") + ".")
  if measurements.torch_peak is None:  # the machine's other matmul: what PyTorch's library reaches on the device
    measurements.torch_peak = torch_matmul_peak(args.matmul_size_used, args.dtype, device, args.warmup,
                                                max(args.repeats, 3))
  return steps


def measure_cell(args, groups, option_rows, config, model_config, ours_model, batch,
                 measurements: Measurements) -> dict:
  """implementation -> ``{seconds, params, compile, xla_flops}`` of ``groups``' steps on ``batch``, timed in
  turns (``measure.time_interleaved``)."""
  models = {"ours": ours_model} if "ours" in groups else {}
  if "flax-stock" in groups:
    models["flax-stock"] = FlaxStockTransformer(model_config)
  steps = {}
  for implementation, model in models.items():
    steps[implementation] = compile_step(config, model, batch, smoke=args.smoke)
    print(f"batch {len(batch['source'])} {implementation}: compiled in {steps[implementation].compile_seconds:.1f} s",
          flush=True)
  for implementation, options in option_rows.items() if "ours" in groups else ():
    try:
      steps[implementation] = compile_step(config, ours_model, batch, smoke=args.smoke, compiler_options=options)
    except Exception as error:  # an option this jaxlib does not know: skip the row, say why
      measurements.notes.append(f"{implementation} skipped: XLA rejected {options} ({str(error).splitlines()[0]}).")
  torch_steps = time_torch_references(args, config, model_config, batch, measurements) if "pytorch" in groups else {}
  calls = {**steps, **{implementation: step for implementation, (step, _) in torch_steps.items()}}
  timings = measure.time_interleaved(calls, warmup=args.warmup, repeats=args.repeats)
  for implementation, timing in timings.items():  # progress: the table comes at the end
    print(f"batch {len(batch['source'])} {implementation}: {1e3 * timing.median:.2f} ms/step", flush=True)
  measured = {implementation: dict(seconds=timings[implementation].median, params=step.num_params,
                                   compile=step.compile_seconds, xla_flops=step.xla_flops())
              for implementation, step in steps.items()}
  for implementation, (_, torch_params) in torch_steps.items():
    measured[implementation] = dict(seconds=timings[implementation].median, params=torch_params, compile=None,
                                    xla_flops=None)
  del steps, calls, torch_steps
  release_torch_memory()
  return measured


def measure_in_process(args, groups, option_rows) -> Measurements:
  """Every (variant, batch size) of the run for ``groups``, in this process: the references (flax-stock,
  PyTorch, ours' option rows) at the first batch size, ours at each."""
  measurements = Measurements()
  batch_sizes, length = ([2], 8) if args.smoke else (args.batch, args.length)
  for variant in args.configs[:1] if args.smoke else args.configs:
    config, model_config = experiment_config(variant, args.smoke, args.no_dropout, dtype=args.dtype)
    ours_model = build_task(config).build_model(model_config)
    for batch_index, batch_size in enumerate(batch_sizes if "ours" in groups else batch_sizes[:1]):
      if batch_index and common.out_of_time(args):
        measurements.notes.append(f"{variant}: batch sizes {batch_sizes[batch_index:]} not run: --time_budget_s="
                                  f"{args.time_budget_s:g} spent.")
        break
      cell_groups = groups if batch_index == 0 else ["ours"]
      batch = random_batch(batch_size, length, length, model_config.vocab_size)
      try:
        measured = measure_cell(args, cell_groups, option_rows if batch_index == 0 else {}, config, model_config,
                                ours_model, batch, measurements)
      except jax.errors.JaxRuntimeError as error:  # a batch past what the device holds: the smaller ones stand
        if batch_index == 0 or not measure.is_out_of_memory(error):
          raise
        measurements.notes.append(f"{variant}: batch sizes {batch_sizes[batch_index:]} not run: batch {batch_size} "
                                  f"ran out of device memory ({str(error).splitlines()[0][:200]}).")
        print(measurements.notes[-1], flush=True)
        break
      measurements.rows += [dict(variant=variant, batch=batch_size, implementation=implementation, **result)
                            for implementation, result in measured.items()]
  return measurements


# Flags the parent handles itself, left out of the command of a group's process (those with a value in
# ``_VALUE_FLAGS`` take the next argument with them when written without "=").
_PARENT_FLAGS = ("--output_dir", "--update_committed", "--isolate", "--no_isolate", "--time_budget_s", "--only",
                 "--measurements_out")
_VALUE_FLAGS = ("--output_dir", "--time_budget_s", "--only", "--measurements_out")


def group_command(argv, group: str, path: str, time_budget_s: float | None) -> list[str]:
  """The command that measures ``group`` alone in a new process and writes its ``Measurements`` to ``path``:
  this script with the run's own flags (``argv``) less where it writes, ``--only=group``."""
  arguments, skip_value = [], False
  for argument in argv:
    if skip_value:
      skip_value = False
      continue
    name = argument.partition("=")[0]
    if name in _PARENT_FLAGS:
      skip_value = name in _VALUE_FLAGS and "=" not in argument
      continue
    arguments.append(argument)
  budget = [f"--time_budget_s={time_budget_s:g}"] if time_budget_s is not None else []
  return [sys.executable, "-m", "benchmarks.train_step", *arguments, "--no_isolate", f"--only={group}",
          f"--measurements_out={path}", *budget]


def measure_isolated(args, argv, groups) -> Measurements:
  """``measure_in_process`` of each group in a process of its own, one after the other; their measurements
  merged. A reference whose process fails is a note; ours failing is an error."""
  measurements = Measurements()
  with tempfile.TemporaryDirectory() as folder:
    for group in groups:
      if group == "pytorch" and importlib.util.find_spec("torch") is None:  # no process to learn that
        measurements.torch_note = ("PyTorch reference skipped: torch is not importable here (install the "
                                   "benchmark-only extra: pip install -e \".[benchmark]\").")
        continue
      path = os.path.join(folder, f"{group}.json")
      remaining = None if args.time_budget_s is None else max(
          1.0, args.time_budget_s - (time.monotonic() - args.started))
      print(f"--- {group}: in its own process", flush=True)
      process = subprocess.run(group_command(argv, group, path, remaining), cwd=REPO)
      if process.returncode or not os.path.exists(path):
        if group == "ours":
          raise RuntimeError(f"the process measuring ours failed (exit {process.returncode}); see its output above.")
        measurements.notes.append(f"{group} left out: its process failed (exit {process.returncode}).")
        continue
      with open(path) as f:
        measurements.merge(Measurements(**json.load(f)))
  return measurements


# ------------------------------------------------------------------------------------------------ main

def main(argv=None) -> common.Report | None:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  if args.isolate is None:  # default: isolated, except at --smoke size (its numbers mean nothing)
    args.isolate = not args.smoke
  if not args.smoke:
    measure.disable_persistent_cache()
  kind = "cpu" if jax.default_backend() == "cpu" else "accelerator"
  option_rows = {"none": {}, "eigen": dict(list(CPU_OPTION_ROWS.items())[:1]), "all": CPU_OPTION_ROWS}[
      args.cpu_option_rows] if kind == "cpu" else {"none": {}, "all": GPU_OPTION_ROWS}[args.gpu_option_rows]
  args.matmul_size_used = 128 if args.smoke else (args.matmul_size or (2048 if kind == "cpu" else 8192))
  groups = chosen_groups(args)
  if args.only:  # a group's own process: measure, hand the measurements over, no table
    measurements = measure_in_process(args, groups, option_rows)
    if args.measurements_out:
      with open(args.measurements_out, "w") as f:
        json.dump(dataclasses.asdict(measurements), f)
    else:
      print(json.dumps(dataclasses.asdict(measurements)), flush=True)
    return None
  machine = host_description(load_average=True)
  peaks = measure.measure_peaks(args.dtype, args.smoke, args.warmup, max(args.repeats, 3),
                                sizes=(args.matmul_size,) if args.matmul_size else None)
  measurements = (measure_isolated(args, argv, groups) if args.isolate
                  else measure_in_process(args, groups, option_rows))
  if args.no_torch:
    measurements.torch_note = "PyTorch reference skipped (--no_torch)."
  peaks.measure_after(args.warmup, max(args.repeats, 3))
  report = build_report(args, kind, measurements, peaks)
  return common.finish(report, args, argv, machine)


def cells(rows: list[dict]) -> dict:
  """``(variant, batch size) -> {implementation: measured row}`` of ``Measurements.rows``, in ``ROW_ORDER``."""
  grouped = {}
  for row in rows:
    grouped.setdefault((row["variant"], row["batch"]), {})[row["implementation"]] = row
  return {cell: dict(sorted(measured.items(), key=lambda item: ROW_ORDER.index(item[0])))
          for cell, measured in grouped.items()}


def add_cell(report, args, kind: str, variant: str, batch_size: int, measured: dict, torch_peak: float | None,
             peaks, timed_in: str) -> tuple[list, list[str], list[str]]:
  """The rows of one (variant, batch size), with ours' ratio to each reference (their targets' verdicts at the
  first batch size); returns ``(achieved, verdicts, PyTorch's MFU against its own peak)``, ``achieved`` a
  ``(row, model FLOP/s, variant, batch, implementation)`` per row for ``fill_mfu``."""
  with_references = batch_size == (2 if args.smoke else args.batch[0])
  _, model_config = experiment_config(variant, args.smoke, args.no_dropout, dtype=args.dtype)
  length = 8 if args.smoke else args.length
  tokens = batch_size * 2 * length
  flops = transformer_flops(model_config, batch_size, length, length)["total"]
  ours_rate = tokens / measured["ours"]["seconds"]
  achieved, verdicts, torch_own_mfu = [], [], []
  for implementation, result in measured.items():
    rate = tokens / result["seconds"]
    versus = measure.ratio(ours_rate, rate)
    if implementation != "ours" and with_references:
      report.ratios[f"{variant} ours / {implementation} tokens/s"] = versus
    if implementation.startswith("pytorch") and torch_peak:
      own_mfu = flops / result["seconds"] / torch_peak
      torch_own_mfu.append(f"{variant} {implementation} {100 * own_mfu:.1f}%")
    row = [variant + (" (smoke size)" if args.smoke else ""), batch_size, implementation, result["params"],
           1e3 * result["seconds"], rate, flops / 1e9, (result["xla_flops"] or float("nan")) / 1e9, None, None,
           result["compile"], None if implementation == "ours" else versus, timed_in]
    report.rows.append(row)
    achieved.append((row, flops / result["seconds"], variant, batch_size, implementation))
  if with_references:
    verdicts += reference_verdicts(report, variant, batch_size, measured, TARGETS[kind], flops, tokens, peaks)
    if variant == "transformer_base" and kind == "cpu" and not args.smoke:
      compile_s = measured["ours"]["compile"]
      verdicts.append(f"base compile {compile_s:.1f} s ({'met' if compile_s < COMPILE_TARGET_S else 'not met'})")
  return achieved, verdicts, torch_own_mfu


def method_notes(args, peaks) -> list[str]:
  """What was timed, in which processes, and what MFU and the FLOP columns count."""
  length = 8 if args.smoke else args.length
  batch_sizes = [2] if args.smoke else args.batch
  label_smoothing = experiment_config(args.configs[0], args.smoke)[0].label_smoothing
  return [
      f"Batch sizes {', '.join(map(str, batch_sizes))} x {length} source + {length} target tokens (references at "
      f"the first), {args.dtype} compute (parameters and Adam float32), label smoothing {label_smoothing}, "
      f"Adam, dropout {'off' if args.no_dropout else 'as configured'}; step time is the median of "
      f"{args.repeats} steps after {args.warmup} warm-up.",
      ("Each implementation timed in its own process (--isolate), one after the other: ours with its XLA:CPU "
       "option rows, flax-stock, then PyTorch (eager and compiled), so that no other implementation's libraries "
       "and threads are loaded where a step is timed; the steps within a process take turns, but load that "
       "changes between the processes falls on one of them only."
       if args.isolate else
       "All implementations timed in one process (--no_isolate), taking turns step by step: load falls on all "
       "alike, but PyTorch imported beside JAX has slowed flax-stock's CPU step (issue 49: 1.77-1.80 s against "
       "1.54 s without it)."),
      f"MFU = model FLOPs / step time / matmul peak; {peaks.describe()}. Model FLOPs: 6 x parameters x tokens "
      f"(each weight matrix counted for the tokens it multiplies, tied output projection included, embedding lookups "
      f"excluded) plus attention 12 x layers x q_length x kv_length x d_model per example (causal counted in "
      f"full); see transformer.nn.transformer_flops. XLA GFLOP is XLA's own count of the compiled step (all ops).",
  ]


def target_note(kind: str, verdicts: list[str]) -> str:
  """The targets of this kind of machine and this run's ``verdicts`` on them."""
  target_text = ", ".join(f">= {target}x {implementation}" for implementation, target in TARGETS[kind].items())
  return (f"Targets ({'CPU' if kind == 'cpu' else 'accelerator'}): ours {target_text} tokens/s; base MFU >= "
          f"{MFU_TARGETS[kind]:.0%} at the best batch size"
          + (f"; base compile < {COMPILE_TARGET_S:.0f} s" if kind == "cpu" else "")
          + f". This run: {'; '.join(verdicts)}.")


def build_report(args, kind: str, measurements: Measurements, peaks) -> common.Report:
  """The table, ratios, verdicts and notes of ``measurements``, MFU against ``peaks``."""
  timed_in = "own process" if args.isolate else "one process"
  report = common.Report(
      "train_step", "Train step: tokens/s, MFU and compile time (benchmarks/train_step.py)",
      ["config", "batch", "implementation", "parameters", "step ms", "src+tgt tokens/s", "model GFLOP/step",
       "XLA GFLOP/step", "MFU % (measured peak)", "MFU % (theoretical peak)", "compile s",
       "ours / this (tokens/s)", "timed in"])
  report.notes += measurements.notes
  achieved, verdicts, torch_own_mfu = [], [], []  # achieved: (row, model FLOP/s, variant, batch, implementation)
  for (variant, batch_size), measured in cells(measurements.rows).items():
    if "ours" not in measured:
      continue
    cell_achieved, cell_verdicts, cell_torch_mfu = add_cell(report, args, kind, variant, batch_size, measured,
                                                            measurements.torch_peak, peaks, timed_in)
    achieved += cell_achieved
    verdicts += cell_verdicts
    torch_own_mfu += cell_torch_mfu
  mfu_errors = fill_mfu(report, achieved, peaks, args, verdicts, MFU_TARGETS[kind])
  report.notes += [
      *method_notes(args, peaks),
      measurements.torch_note,
      *([f"Left out after failing at their first step: {', '.join(measurements.torch_failures)}."]
        if measurements.torch_failures else []),
      *mfu_errors,
      *([f"PyTorch's own {args.dtype} {args.matmul_size_used}x{args.matmul_size_used} matmul in this run: "
         f"{measurements.torch_peak / 1e9:,.1f} GFLOP/s, {measurements.torch_peak / peaks.measured:.2f}x XLA's "
         f"best; PyTorch's MFU against its own peak: {', '.join(torch_own_mfu)} (the MFU column uses XLA's peak "
         f"for every row)."] if measurements.torch_peak else []),
      target_note(kind, verdicts),
  ]
  report.notes = [note for note in report.notes if note]
  return report


def reference_verdicts(report, variant, batch_size, measured, targets, flops, tokens, peaks) -> list[str]:
  """Ours against each reference's target at the first batch size, the option rows' ratios as notes, and a
  note when flax-stock's parameter count differs from ours."""
  verdicts = []
  for implementation, target in targets.items():
    if implementation in measured:
      value = report.ratios[f"{variant} ours / {implementation} tokens/s"]
      # The target as an MFU: what ours would need against XLA's matmul peak, however it got there.
      needed_mfu = target * flops / measured[implementation]["seconds"] / peaks.measured  # the MFU column's peak
      verdicts.append(f"{variant} ours / {implementation} {value:.2f}x at batch {batch_size} "
                      f"({'met' if value >= target else 'not met'}; {target}x needs ours at "
                      f"{needed_mfu:.0%} MFU)")
  for alternative in (name for name in measured if name in CPU_OPTION_ROWS):
    alternative_rate = tokens / measured[alternative]["seconds"]
    versus_references = ", ".join(
        f"/ {implementation} {measure.ratio(alternative_rate, tokens / measured[implementation]['seconds']):.2f}x"
        for implementation in targets if implementation in measured)
    report.notes.append(f"{variant}: {alternative} {versus_references}.")
  if "flax-stock" in measured and measured["ours"]["params"] != measured["flax-stock"]["params"]:
    report.notes.append(f"{variant}: parameter counts differ (ours {measured['ours']['params']:,}, "
                        f"flax-stock {measured['flax-stock']['params']:,}); the comparison is not like for like.")
  return verdicts


def fill_mfu(report, achieved, peaks, args, verdicts, mfu_target) -> list[str]:
  """Fill the MFU cells of the rows (against the higher peak of before and after), add ours' best MFU per
  variant to the ratios and verdicts; the MFU measurement errors, as notes."""
  mfu_errors = []
  for row, flops_per_second, variant, batch_size, implementation in achieved:
    measured_mfu, theoretical_mfu = peaks.mfu(flops_per_second)
    row[8] = measure.mfu_cell(measured_mfu, theoretical_mfu)
    row[9] = None if theoretical_mfu is None else 100 * theoretical_mfu
    error = measure.mfu_error(f"{variant} batch {batch_size} {implementation}", measured_mfu, theoretical_mfu)
    if error:
      mfu_errors.append(error)
  for variant in dict.fromkeys(variant for _, _, variant, _, _ in achieved):
    ours_mfu = {batch_size: peaks.mfu(flops_per_second)[0] for _, flops_per_second, name, batch_size, implementation
                in achieved if name == variant and implementation == "ours"
                and not measure.mfu_error("", *peaks.mfu(flops_per_second))}
    if not ours_mfu:
      verdicts.append(f"{variant} MFU: a measurement error at every batch size (see the notes)")
      continue
    best_batch = max(ours_mfu, key=ours_mfu.get)
    report.ratios[f"{variant} MFU"] = ours_mfu[best_batch]
    if variant == "transformer_base" and not args.smoke:
      mfu = ours_mfu[best_batch]
      verdicts.append(f"base MFU {mfu:.0%} at batch {best_batch} ({'met' if mfu >= mfu_target else 'not met'})")
  return mfu_errors


if __name__ == "__main__":
  main(sys.argv[1:])
