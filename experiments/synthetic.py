"""Synthetic sequence tasks (copy, reverse, sort) on a small encoder-decoder Transformer; no download.

    python launch.py --config=experiments/synthetic.py:copy --workdir=/tmp/synthetic_copy

Variants: ``copy`` (default), ``reverse``, ``sort``; ``tiny``, a copy run of seconds for smoke tests (not a
result). Sequences of 1..12 symbols from 10, variable length with padding; success is exact-match accuracy of
greedy decoding on 512 held-out sequences.
Measured results: experiments/synthetic/RESULTS.md.
"""
from transformer.errors import ConfigError
from transformer.train import base_config

VARIANTS = ("copy", "reverse", "sort")  # the experiments (RESULTS.md has a row for each)
SMOKE = "tiny"


def get_config(variant: str = "copy"):
  if variant not in (*VARIANTS, SMOKE):
    raise ConfigError(f"unknown variant {variant!r} of experiments/synthetic.py; choose one of "
                     f"{[*VARIANTS, SMOKE]} (e.g. --config=experiments/synthetic.py:reverse).")
  if variant == SMOKE:
    config = get_config("copy")
    config.num_train_steps = 40
    config.log_every = 10
    config.eval_every = config.checkpoint_every = 20
    config.task.num_eval_examples = 64
    return config
  config = base_config("transformer")  # config.model: the fields of transformer.nn.ModelConfig
  config.task.name = "synthetic"
  config.task.kind = variant  # copy | reverse | sort
  config.task.num_symbols = 10  # symbol ids 3..12 (0 pad, 1 BOS, 2 EOS)
  config.task.min_length = 1
  config.task.max_length = 12
  config.task.num_eval_examples = 512

  model = config.model
  model.d_model = 64
  model.num_heads = 4
  model.d_ff = 128
  model.num_encoder_layers = 2
  model.num_decoder_layers = 2
  model.dropout_rate = 0.0
  model.attention_dropout_rate = 0.0
  model.max_length = 16

  config.batch_size = 128
  config.num_train_steps = 2000
  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 200
  config.optimizer.schedule = "cosine"  # annealing to 0 removes the last few errors of a constant-ish rate
  config.optimizer.grad_clip_norm = 1.0
  config.log_every = 100
  config.eval_every = 500
  config.checkpoint_every = 500
  config.best_metric = "eval/exact_match"
  return config
