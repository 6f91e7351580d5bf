"""IWSLT'15 English-Vietnamese (Luong & Manning 2015), Stanford's pre-tokenised release.

    python launch.py --config=experiments/iwslt15_en_vi.py:transformer_small --workdir=/tmp/iwslt_small \\
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
from experiments.translation import RNNS, SMOKE, TRANSFORMERS, VARIANTS, translation_config

__all__ = ["RNNS", "SMOKE", "TRANSFORMERS", "VARIANTS", "get_config"]


def get_config(variant: str = "transformer_small"):
  config = translation_config("iwslt15_en_vi", variant)
  task = config.task
  task.dataset = "iwslt15_en_vi"
  task.pair = "en-vi"
  task.vocab_size = 8000 if variant == "transformer_base" else 4000  # 10k pairs support a smaller vocabulary
  task.test_splits = ("test",)
  task.bleu_tokenize = "none"  # the references are already tokenised
  task.tokenizer_type = "bpe"  # the unigram model cut frequent words apart on these 10k pairs (RESULTS.md)
  if variant == "transformer_base":
    return config
  if variant == SMOKE:  # translation_config's tiny model and schedule; minutes end to end
    task.vocab_size = 1000
    return config
  # Sized for the 10,000 training pairs: 2048-token batches give about 200 updates per epoch. With the full
  # 133k pairs, raise the steps (e.g. --config.num_train_steps=30000) and --config.task.max_tokens=4096.
  task.max_tokens = 2048
  task.num_eval_sentences = 500  # BLEU on the first 500 of tst2012 during training keeps evaluations short
  # alpha 0.6 wrote too short a tst2013 for both model families: --mode=eval picks alpha on those 500 sentences.
  task.length_penalty_candidates = (0.6, 1.0, 1.5, 2.0)
  config.eval_every = 1000
  config.checkpoint_every = 250
  if variant in RNNS:
    config.num_train_steps = 3000  # about 14 epochs; the GRU's validation NLL flattens by then
  else:  # transformer_small: wider and shallower than Multi30k's, which underfit these longer TED sentences
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
  return config
