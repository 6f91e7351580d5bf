r"""Multi30k English-German translation (Elliott et al. 2016): Transformer and RNN-attention baselines.

    python launch.py --config=experiments/multi30k.py:transformer_small --workdir=/tmp/multi30k_small \
        --config.task.source_dir=../shared/data/multi30k
    python launch.py --config=experiments/multi30k.py:transformer_small --workdir=/tmp/multi30k_small --mode=eval
    # on a GPU: one batch shape, bfloat16 (what `python -m benchmarks.time_to_bleu` times)
    python launch.py --config=experiments/multi30k.py:transformer_gpu --workdir=/tmp/multi30k_gpu \
        --config.task.source_dir=.gpu_data/multi30k
    python launch.py --config=experiments/multi30k.py:gru_bahdanau --workdir=/tmp/multi30k_lstm \
        --config.task.source_dir=../shared/data/multi30k --config.model.cell=lstm

Variants: ``transformer_small`` (Wu et al. 2021's text-only baseline: 4+4 layers, d_model 128, 4 heads,
FFN 256), ``transformer_gpu`` (transformer_small's model and schedule shaped for a GPU: bfloat16 compute,
one padded batch shape ``[256, 64]`` so the step and the beam search compile once, about the sentences per
batch of transformer_small's 4,096-token buckets, only test_2016_flickr scored), ``transformer_base`` (the
paper's base model, for an accelerator), and the RNN-attention baselines ``gru_bahdanau``, ``lstm_bahdanau``,
``lstm_luong_dot``, ``lstm_luong_general`` (shared with the other translation experiments:
experiments/translation.py). ``config.model`` holds the variant's model fields only
(``config.model_name``: "transformer" or "rnn"). Checkpoints are chosen on the validation split;
test_2016_flickr is scored only by --mode=eval. ``tiny``: a smoke run (train, eval, translate) in a few minutes on
2 CPU cores, not a result. Results: experiments/multi30k/RESULTS.md.
"""
from experiments import translation
from experiments.translation import RNNS, SMOKE
from transformer.errors import ConfigError
from transformer.train import base_config

TRANSFORMERS = ("transformer_small", "transformer_gpu", "transformer_base")
VARIANTS = (*TRANSFORMERS, *RNNS, SMOKE)
__all__ = ["RNNS", "SMOKE", "TRANSFORMERS", "VARIANTS", "get_config"]


def get_config(variant: str = "transformer_small"):
  if variant not in VARIANTS:
    raise ConfigError(f"unknown variant {variant!r} of experiments/multi30k.py; choose one of {list(VARIANTS)} "
                      "(e.g. --config=experiments/multi30k.py:transformer_small).")
  if variant == "transformer_gpu":  # transformer_small's model, schedule and data, shaped for a GPU
    config = get_config("transformer_small")
    config.model.dtype = "bfloat16"  # parameters and Adam stay float32
    task = config.task
    task.fixed_batch_shape = True  # one compiled train step and beam search instead of one per length bucket
    # [256, 64] batches: about the sentences per batch of transformer_small's 4,096 tokens in length buckets
    # (Multi30k averages 12 words a sentence), so its learning rate and step count carry over unchanged.
    # 64 tokens keep the longest validation and test sentences whole (32 words at most): an evaluation
    # sentence over max_length would be a batch, and a compilation, of its own.
    task.max_length = 64
    task.max_tokens = 256 * 64
    task.test_splits = ("test_2016_flickr",)  # the score the time-to-BLEU benchmark reports
    config.checkpoint_every = 2000  # each save copies the state to the host: not every 500 steps of a few ms
    return config

  config = base_config("rnn" if variant in RNNS else "transformer")
  config.task = translation.task("multi30k", "en-de", test_splits=(
      "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr"))
  translation.paper_training(config)
  if variant == "transformer_small":
    model = config.model
    model.d_model = 128
    model.num_heads = 4
    model.d_ff = 256
    model.num_encoder_layers = 4
    model.num_decoder_layers = 4
    model.dropout_rate = 0.3
    model.attention_dropout_rate = 0.1
    model.norm_position = "pre"  # stable at this peak learning rate; the post-LN paper setup is an ablation
    config.optimizer.learning_rate = 5e-3
    config.optimizer.warmup_steps = 2000
    config.num_train_steps = 8000  # Wu et al. train for at most 8k steps
    config.eval_every = 2000
    config.checkpoint_every = 500
    config.keep_checkpoints = 5  # the last 5 (steps 6000-8000) for --average_checkpoints=5
  elif variant == "transformer_base":
    # Not trained to a result yet: RESULTS.md, "Runs not kept", says what the one try found.
    translation.paper_base_schedule(config)
  elif variant in RNNS:
    translation.rnn_baseline(config, variant)
  else:  # tiny: minutes end to end, one test split
    translation.smoke(config)
    config.task.test_splits = ("test_2016_flickr",)
  return config
