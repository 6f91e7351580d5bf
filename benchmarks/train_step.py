"""Questions 3 and 6a: train-step throughput, MFU and compile time, ours vs flax's stock layers (and PyTorch).

    python -m benchmarks.train_step            # small and base translation configs, writes RESULTS.md
    python -m benchmarks.train_step --smoke    # a tiny model, prints only

One full training step (label-smoothed cross entropy, backward pass, Adam update; dropout as configured)
on a batch of 16 x 64 source and 64 target tokens (no padding), float32, for the translation experiment's
``transformer_small`` (vocabulary 8k, as its data) and ``transformer_base`` (vocabulary 32k) models:

- ours: the translation task + ``make_train_step`` + ``make_optimizer``, compiled by the ``jit`` strategy,
  exactly as ``transformer.train.run`` builds it;
- ours, Eigen dots (CPU only): the same step compiled with the XLA option in ``CPU_DOT_LIBRARY_OPTIONS``,
  which moves the matmuls from YNNPACK (this jaxlib's default) to Eigen: how much is the matmul library;
- flax-stock: the same model built from ``flax.linen``'s stock ``MultiHeadDotProductAttention``,
  ``LayerNorm``, ``Dense`` and ``Embed.attend`` (``FlaxStockTransformer`` below), trained by the same task
  loss, optimizer and step, so only the model code differs;
- PyTorch ``nn.Transformer`` of the same shape with ``CrossEntropyLoss(label_smoothing)`` and Adam, on CPU,
  when torch is importable (``pip install -e ".[benchmark]"``; never a dependency of the package).

Throughput is source + target tokens per second; MFU is model FLOPs (``common.encoder_decoder_flops``) per
second over the float32 ``--matmul_size`` matmul peak measured in the same run (XLA's; PyTorch's own peak on
the same cores is reported beside it). Compile time is tracing +
lowering + XLA compilation of the step, with the persistent compilation cache off.
Targets: ours >= 1.2x flax-stock and >= 1.5x PyTorch (CPU) tokens/s, MFU >= 60% and compile < 60 s (CPU)
for base.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from experiments import multi30k
from transformer import ops
from transformer.nn import ModelConfig
from transformer.tasks import build_task
from transformer.train.optimizer import make_optimizer
from transformer.train.parallel import make_strategy
from transformer.train.state import create_train_state
from transformer.train.step import make_train_step

VOCAB_SIZES = {"transformer_small": 8000, "transformer_base": 32000}
TARGETS = {"flax-stock": 1.2, "pytorch": 1.5}
MFU_TARGET = 0.60
COMPILE_TARGET_S = 60.0
# XLA:CPU hands dots to YNNPACK by default in this jaxlib; an empty fusion type sends them to Eigen instead.
# Measured as an extra row of ours (same model and step, only the compiler option differs), CPU only.
CPU_DOT_LIBRARY_OPTIONS = {"ours, Eigen dots": {"xla_cpu_experimental_ynn_fusion_type": ""}}


def add_arguments(parser):
  parser.add_argument("--configs", nargs="+", default=["transformer_small", "transformer_base"],
                      choices=sorted(VOCAB_SIZES))
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=64, help="source and target tokens per example")
  parser.add_argument("--matmul_size", type=int, default=2048)
  parser.add_argument("--no_dropout", action="store_true", help="train without dropout (all three)")
  parser.add_argument("--no_torch", action="store_true", help="skip the PyTorch reference")


# --------------------------------------------------------------------------------- the configs, the batch

SMOKE_MODEL = dict(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1)


def experiment_config(variant: str, smoke: bool = False, no_dropout: bool = False, experiment=multi30k,
                      vocab_size: int | None = None, **model_changes):
  """``(config, model_config)``: a translation experiment's config and its model at a benchmark vocabulary
  (default ``VOCAB_SIZES[variant]``). ``smoke`` shrinks the model to a few thousand parameters (same code)."""
  config = experiment.get_config(variant)
  if smoke:
    model_changes = {**SMOKE_MODEL, **model_changes}
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

  def time(self, warmup: int, repeats: int, budget_s: float | None = None) -> common.Timing:
    return common.time_fn(self, warmup=warmup, repeats=repeats, budget_s=budget_s)

  def xla_flops(self) -> float:
    """FLOPs XLA's cost analysis counts for the step (all ops, not only matmuls); NaN if not reported."""
    analysis = self.compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
      analysis = analysis[0] if analysis else {}
    return float((analysis or {}).get("flops", float("nan")))


def compile_step(config, model, batch, seed: int = 0, smoke: bool = False,
                 compiler_options: dict | None = None) -> CompiledStep:
  """``model``'s train step as ``transformer.train.run`` builds it for ``config`` (its task's loss, optimizer,
  ``jit`` strategy with the state donated), compiled for ``batch`` (quickly but unoptimised if ``smoke``;
  with XLA ``compiler_options`` if given)."""
  task = build_task(config)
  optimizer = make_optimizer(config.optimizer, config.num_train_steps)
  strategy = make_strategy("jit")
  batch = strategy.put_batch(batch)
  state = strategy.create_state(
      lambda key: create_train_state(model, optimizer, task.init_inputs(batch), key), jax.random.PRNGKey(seed))
  step = strategy.compile_train_step(make_train_step(task, model, optimizer))
  compiled, seconds = common.compile_timed(
      step, state, batch,
      compiler_options={**(common.SMOKE_COMPILER_OPTIONS if smoke else {}), **(compiler_options or {})})
  num_params = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(state.params))
  return CompiledStep(compiled, state, batch, seconds, num_params)


# --------------------------------------------------------------------- the same model from stock layers

class FlaxStockTransformer(nn.Module):
  """The ``EncoderDecoder`` of ``config`` built from ``flax.linen`` stock layers, as a flax user would.

  Same shapes and parameter count as ours: shared embedding (normal, std ``d_model**-0.5``) scaled by
  ``sqrt(d_model)``, sinusoidal positions, post- or pre-LN (``config.norm_position``) residual sublayers
  around ``MultiHeadDotProductAttention`` and a ReLU feed-forward, output logits by ``Embed.attend``.
  Only the interface the task's loss needs: ``config`` and ``__call__(source, target) -> logits``.
  """
  config: ModelConfig

  def _embed(self, embedding, tokens, deterministic):
    config = self.config
    x = embedding(tokens) * jnp.sqrt(jnp.float32(config.d_model))
    x = x + ops.sinusoidal_position_encoding(tokens.shape[1], config.d_model)[None]
    return nn.Dropout(config.dropout_rate)(x, deterministic=deterministic)

  def _sublayer(self, x, sublayer, deterministic):
    config = self.config
    norm = nn.LayerNorm(epsilon=config.norm_epsilon)
    dropout = nn.Dropout(config.dropout_rate)
    if config.norm_position == "pre":
      return x + dropout(sublayer(norm(x)), deterministic=deterministic)
    return norm(x + dropout(sublayer(x), deterministic=deterministic))

  def _attention(self):
    config = self.config
    return nn.MultiHeadDotProductAttention(
        num_heads=config.num_heads, qkv_features=config.d_model, out_features=config.d_model,
        dropout_rate=config.attention_dropout_rate, kernel_init=nn.initializers.xavier_uniform())

  def _feed_forward(self, x):
    init = nn.initializers.xavier_uniform()
    hidden = nn.relu(nn.Dense(self.config.d_ff, kernel_init=init)(x))
    return nn.Dense(self.config.d_model, kernel_init=init)(hidden)

  @nn.compact
  def __call__(self, source, target):
    config = self.config
    deterministic = config.deterministic
    embedding = nn.Embed(config.vocab_size, config.d_model,
                         embedding_init=nn.initializers.normal(config.d_model ** -0.5))
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
    encoded = nn.LayerNorm(epsilon=config.norm_epsilon)(x) if config.norm_position == "pre" else x

    y = self._embed(embedding, ops.shift_right(target, config.bos_id), deterministic)
    for _ in range(config.num_decoder_layers):
      self_attention, cross_attention = self._attention(), self._attention()
      y = self._sublayer(y, lambda h: self_attention(h, h, mask=self_mask, deterministic=deterministic),
                         deterministic)
      y = self._sublayer(y, lambda h: cross_attention(h, encoded, mask=cross_mask, deterministic=deterministic),
                         deterministic)
      y = self._sublayer(y, self._feed_forward, deterministic)
    if config.norm_position == "pre":
      y = nn.LayerNorm(epsilon=config.norm_epsilon)(y)
    return embedding.attend(y).astype(jnp.float32)


# ------------------------------------------------------------------------------------- PyTorch reference

def torch_train_step(model_config: ModelConfig, label_smoothing: float, optimizer_config, batch):
  """``(step, parameter count)``: a PyTorch ``nn.Transformer`` train step of the same shape, as a callable
  that runs one step and returns the loss as a host float (so the step has finished when it returns).

  The model: shared ``nn.Embedding`` scaled by ``sqrt(d_model)`` plus sinusoidal positions, ``nn.Transformer``
  (``norm_first`` for pre-LN, ReLU, the config's dropout, batch first), logits by the embedding's transpose;
  ``CrossEntropyLoss(label_smoothing, ignore_index=pad)`` and Adam with the config's betas and epsilon.
  """
  import torch  # benchmark-only extra

  torch.manual_seed(0)
  torch.set_num_threads(os.cpu_count() or 1)
  d_model = model_config.d_model
  embedding = torch.nn.Embedding(model_config.vocab_size, d_model)
  torch.nn.init.normal_(embedding.weight, std=d_model ** -0.5)
  transformer = torch.nn.Transformer(
      d_model=d_model, nhead=model_config.num_heads, num_encoder_layers=model_config.num_encoder_layers,
      num_decoder_layers=model_config.num_decoder_layers, dim_feedforward=model_config.d_ff,
      dropout=model_config.dropout_rate, batch_first=True, norm_first=model_config.norm_position == "pre",
      layer_norm_eps=model_config.norm_epsilon)
  parameters = list(embedding.parameters()) + list(transformer.parameters())
  optimizer = torch.optim.Adam(parameters, lr=1e-4, betas=(optimizer_config.b1, optimizer_config.b2),
                               eps=optimizer_config.eps)
  loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing, ignore_index=model_config.pad_id)
  source = torch.from_numpy(np.asarray(batch["source"]).astype(np.int64))
  target = torch.from_numpy(np.asarray(batch["target"]).astype(np.int64))
  decoder_inputs = torch.cat([torch.full_like(target[:, :1], model_config.bos_id), target[:, :-1]], dim=1)
  length = max(source.shape[1], target.shape[1])
  positions = torch.from_numpy(np.array(ops.sinusoidal_position_encoding(length, d_model), np.float32))
  causal = torch.nn.Transformer.generate_square_subsequent_mask(target.shape[1])
  scale = d_model ** 0.5

  def step():
    optimizer.zero_grad(set_to_none=True)
    src = embedding(source) * scale + positions[:source.shape[1]]
    tgt = embedding(decoder_inputs) * scale + positions[:target.shape[1]]
    hidden = transformer(src, tgt, tgt_mask=causal, tgt_is_causal=True)
    logits = hidden @ embedding.weight.T
    loss = loss_fn(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss.item()  # a host float: the step has finished

  transformer.train()
  return step, sum(p.numel() for p in parameters)


def torch_matmul_peak(size: int, warmup: int, repeats: int) -> float:
  """FLOP/s of PyTorch's float32 ``[size, size] @ [size, size]`` on CPU (its BLAS), as ``common.matmul_peak``."""
  import torch  # benchmark-only extra

  torch.set_num_threads(os.cpu_count() or 1)
  generator = torch.Generator().manual_seed(0)
  a, b = (torch.randn(size, size, generator=generator) for _ in range(2))
  timing = common.time_fn(torch.matmul, a, b, warmup=warmup, repeats=repeats)
  return 2.0 * size**3 / timing.median


# ------------------------------------------------------------------------------------------------ main

def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  if not args.smoke:
    common.disable_persistent_cache()
  machine = common.machine_description()
  batch_size, length = (2, 8) if args.smoke else (args.batch, args.length)
  matmul_size = 128 if args.smoke else args.matmul_size
  variants = args.configs[:1] if args.smoke else args.configs
  peak = common.matmul_peak(matmul_size, jnp.float32, warmup=args.warmup, repeats=max(args.repeats, 3))

  report = common.Report(
      "train_step", "Train step: tokens/s, MFU and compile time (benchmarks/train_step.py)",
      ["config", "implementation", "parameters", "step ms", "src+tgt tokens/s", "model GFLOP/step",
       "XLA GFLOP/step", "MFU %", "compile s", "ours / this (tokens/s)"])
  torch_note = None
  torch_peak, torch_own_mfu = None, []
  verdicts = []
  for variant in variants:
    config, model_config = experiment_config(variant, args.smoke, args.no_dropout)
    batch = random_batch(batch_size, length, length, model_config.vocab_size)
    tokens = batch_size * 2 * length
    flops = common.encoder_decoder_flops(model_config, batch_size, length, length)["total"]
    name = variant + (" (smoke size)" if args.smoke else "")
    ours_model = build_task(config).build_model(model_config)
    steps = {implementation: compile_step(config, model, batch, smoke=args.smoke)
             for implementation, model in (("ours", ours_model), ("flax-stock", FlaxStockTransformer(model_config)))}
    if jax.default_backend() == "cpu":
      for implementation, options in CPU_DOT_LIBRARY_OPTIONS.items():
        try:
          steps[implementation] = compile_step(config, ours_model, batch, smoke=args.smoke, compiler_options=options)
        except Exception as error:  # an option this jaxlib does not know: skip the row, say why
          report.notes.append(f"{implementation} skipped: XLA rejected {options} ({str(error).splitlines()[0]}).")
    calls = dict(steps)
    if args.no_torch:
      torch_note = "PyTorch reference skipped (--no_torch)."
    elif jax.default_backend() != "cpu":
      torch_note = "PyTorch reference measured on CPU only; skipped on this accelerator run."
    else:
      try:
        calls["pytorch"], torch_params = torch_train_step(model_config, config.label_smoothing, config.optimizer,
                                                          batch)
        import torch
        torch_note = f"PyTorch {torch.__version__} nn.Transformer, {torch.get_num_threads()} threads."
        if torch_peak is None:  # the machine's other matmul: what PyTorch's BLAS reaches on the same cores
          torch_peak = torch_matmul_peak(matmul_size, args.warmup, max(args.repeats, 3))
      except ImportError:
        torch_note = ("PyTorch reference skipped: torch is not importable here (install the benchmark-only "
                      "extra: pip install -e \".[benchmark]\").")
    timings = common.time_interleaved(calls, warmup=args.warmup, repeats=args.repeats)
    measured = {implementation: dict(seconds=timings[implementation].median, params=step.num_params,
                                     compile=step.compile_seconds, xla_flops=step.xla_flops())
                for implementation, step in steps.items()}
    if "pytorch" in calls:
      seconds = timings["pytorch"].median
      measured["pytorch"] = dict(seconds=seconds, params=torch_params, compile=None, xla_flops=None)
      torch_own_mfu.append(f"{variant} {100 * flops / seconds / torch_peak:.1f}%")
    del steps, calls
    ours_rate = tokens / measured["ours"]["seconds"]
    for implementation, result in measured.items():
      rate = tokens / result["seconds"]
      mfu = flops / result["seconds"] / peak
      versus = common.ratio(ours_rate, rate)
      if implementation == "ours":
        report.ratios[f"{variant} MFU"] = mfu
      else:
        report.ratios[f"{variant} ours / {implementation} tokens/s"] = versus
      report.rows.append([name, implementation, result["params"], 1e3 * result["seconds"], rate, flops / 1e9,
                          (result["xla_flops"] or float("nan")) / 1e9, 100 * mfu, result["compile"],
                          None if implementation == "ours" else versus])
    for implementation, target in TARGETS.items():
      if implementation in measured:
        value = report.ratios[f"{variant} ours / {implementation} tokens/s"]
        # The target as an MFU: what ours would need against XLA's matmul peak, however it got there.
        needed_mfu = target * flops / measured[implementation]["seconds"] / peak
        verdicts.append(f"{variant} ours / {implementation} {value:.2f}x ({'met' if value >= target else 'not met'}; "
                        f"{target}x needs ours at {needed_mfu:.0%} MFU)")
    for alternative in CPU_DOT_LIBRARY_OPTIONS:  # what the compiler option alone would give against each reference
      if alternative in measured:
        alternative_rate = tokens / measured[alternative]["seconds"]
        versus_references = ", ".join(
            f"/ {implementation} {common.ratio(alternative_rate, tokens / measured[implementation]['seconds']):.2f}x"
            for implementation in TARGETS if implementation in measured)
        report.notes.append(f"{variant}: {alternative} {versus_references}.")
    if variant == "transformer_base" and not args.smoke:
      mfu = report.ratios[f"{variant} MFU"]
      verdicts.append(f"base MFU {mfu:.0%} ({'met' if mfu >= MFU_TARGET else 'not met'})")
      if jax.default_backend() == "cpu":
        compile_s = measured["ours"]["compile"]
        verdicts.append(f"base compile {compile_s:.1f} s ({'met' if compile_s < COMPILE_TARGET_S else 'not met'})")
    if measured["ours"]["params"] != measured["flax-stock"]["params"]:
      report.notes.append(f"{variant}: parameter counts differ (ours {measured['ours']['params']:,}, flax-stock "
                          f"{measured['flax-stock']['params']:,}); the comparison is not like for like.")

  report.notes += [
      f"Batch {batch_size} x {length} source + {length} target tokens, float32, label smoothing "
      f"{config.label_smoothing}, Adam, dropout {'off' if args.no_dropout else 'as configured'}; step time is the "
      f"median of {args.repeats} steps after {args.warmup} warm-up, all implementations (PyTorch included) "
      f"taking turns.",
      f"MFU = model FLOPs / step time / matmul peak; peak = float32 {matmul_size}x{matmul_size} matmul measured "
      f"in this run: {peak / 1e9:,.1f} GFLOP/s. Model FLOPs: 6 x parameters x tokens (each weight matrix counted "
      f"for the tokens it multiplies, tied output projection included, embedding lookups excluded) plus "
      f"attention 12 x layers x q_length x kv_length x d_model per example (causal counted in full); see "
      f"common.encoder_decoder_flops. XLA GFLOP is XLA's own count of the compiled step (all ops).",
      torch_note,
      *([f"PyTorch's own float32 {matmul_size}x{matmul_size} matmul in this run: {torch_peak / 1e9:,.1f} GFLOP/s, "
         f"{torch_peak / peak:.2f}x XLA's; PyTorch's MFU against its own peak: {', '.join(torch_own_mfu)} (the "
         f"MFU column uses XLA's peak for every row)."] if torch_peak else []),
      f"Targets: ours >= {TARGETS['flax-stock']}x flax-stock and >= {TARGETS['pytorch']}x PyTorch (CPU) "
      f"tokens/s; base MFU >= {MFU_TARGET:.0%}; base compile < {COMPILE_TARGET_S:.0f} s on CPU. This run: "
      f"{'; '.join(verdicts)}.",
  ]
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
