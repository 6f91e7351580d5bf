r"""IWSLT'15 English-Vietnamese (Luong & Manning 2015), Stanford's pre-tokenised release.

    python launch.py --config=experiments/iwslt15_en_vi.py:transformer_small --workdir=/tmp/iwslt_small \
        --config.task.source_dir=../shared/data/iwslt15_en_vi
    python launch.py --config=experiments/iwslt15_en_vi.py:transformer_small --workdir=/tmp/iwslt_small --mode=eval

The builder uses whichever training files the source folder holds: the full train.{en,vi} (133,317 pairs) or
the first 10,000 (train.10k.*); results state which. Validation is tst2012 (checkpoint selection), test is
tst2013. The files are Moses-tokenised, so hypotheses stay in that form and BLEU uses sacreBLEU's
``tokenize="none"`` against tst2013.vi as distributed, comparable to the published tokenised BLEU.
Variants: ``transformer_small`` (3+3 layers of d_model 256 with rotary positions, sized for the 10k pairs),
``transformer_base`` (full data, accelerator), and the RNN-attention baselines of experiments/translation.py
(3000 steps here); ``tiny``, a smoke run (train, eval, translate) in a few minutes on 2 CPU cores. Results,
and the settings tried and not kept: experiments/iwslt15_en_vi/RESULTS.md.
"""
from experiments import translation
from experiments.translation import RNNS, SMOKE
from transformer.errors import ConfigError
from transformer.train import base_config

TRANSFORMERS = ("transformer_small", "transformer_base")
VARIANTS = (*TRANSFORMERS, *RNNS, SMOKE)
__all__ = ["RNNS", "SMOKE", "TRANSFORMERS", "VARIANTS", "get_config"]


def get_config(variant: str = "transformer_small"):
  if variant not in VARIANTS:
    raise ConfigError(f"unknown variant {variant!r} of experiments/iwslt15_en_vi.py; choose one of "
                      f"{list(VARIANTS)} (e.g. --config=experiments/iwslt15_en_vi.py:transformer_small).")
  config = base_config("rnn" if variant in RNNS else "transformer")
  config.task = translation.task("iwslt15_en_vi", "en-vi", test_splits=("test",))
  config.task.bleu_tokenize = "none"  # the references are already tokenised
  config.task.tokenizer_type = "bpe"  # the unigram model cut frequent words apart on these 10k pairs (RESULTS.md)
  translation.paper_training(config)
  if variant == "transformer_small":
    sized_for_10k_pairs(config)
    # Wider and shallower than Multi30k's, which underfit these longer TED sentences.
    model = config.model
    model.d_model = 256
    model.num_heads = 4
    model.d_ff = 1024
    model.num_encoder_layers = 3
    model.num_decoder_layers = 3
    model.dropout_rate = 0.3
    model.attention_dropout_rate = 0.2
    model.norm_position = "pre"
    model.positional_encoding = "rotary"  # ahead of sinusoids on validation, most on long sentences (RESULTS.md)
    config.optimizer.learning_rate = 3e-3
    config.optimizer.schedule = "cosine"
    config.optimizer.warmup_steps = 1000
    config.num_train_steps = 5000
    config.keep_checkpoints = 5  # the last 5 (steps 4000-5000) for --average_checkpoints=5
  elif variant == "transformer_base":  # the full 133k pairs
    translation.paper_base_schedule(config)
  elif variant in RNNS:
    translation.rnn_baseline(config, variant)
    sized_for_10k_pairs(config)
    config.num_train_steps = 3000  # about 14 epochs; the GRU's validation NLL flattens by then
  else:  # tiny: minutes end to end
    translation.smoke(config)
  return config


def sized_for_10k_pairs(config) -> None:
  """Batches, vocabulary and evaluations sized for the 10,000 training pairs: 2048-token batches give about 200
  updates per epoch. With the full 133k pairs, raise the steps (e.g. --config.num_train_steps=30000) and
  --config.task.max_tokens=4096."""
  task = config.task
  task.vocab_size = 4000  # 10k pairs support a smaller vocabulary
  task.max_tokens = 2048
  task.num_eval_sentences = 500  # BLEU on the first 500 of tst2012 during training keeps evaluations short
  # alpha 0.6 wrote too short a tst2013 for both model families: --mode=eval picks alpha on those 500 sentences.
  task.length_penalty_candidates = (0.6, 1.0, 1.5, 2.0)
  config.eval_every = 1000
  config.checkpoint_every = 250
