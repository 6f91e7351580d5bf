"""Settings every translation experiment shares (a helper, not an experiment: it has no ``get_config``).

``experiments/multi30k.py`` and ``experiments/iwslt15_en_vi.py`` start from ``translation_config`` and set what
their data needs (dataset, pair, vocabulary, batches, and the ``transformer_small`` model each sizes for its
data), so that a change of one experiment's defaults never changes the other's.
"""
from __future__ import annotations

import ml_collections

from transformer.errors import ConfigError
from transformer.train.config import base_config

TRANSFORMERS = ("transformer_small", "transformer_base")
# RNN encoder-decoder baselines: cell_attention, as in Bahdanau et al. 2015 and Luong et al. 2015.
RNNS = {"gru_bahdanau": ("gru", "bahdanau"), "lstm_bahdanau": ("lstm", "bahdanau"),
        "lstm_luong_dot": ("lstm", "luong_dot"), "lstm_luong_general": ("lstm", "luong_general")}
# tiny: a one-layer Transformer that trains, evaluates and translates in a few minutes on 2 CPU cores (a smoke
# test of the data, tokenizer, batching and decoding, not a result).
SMOKE = "tiny"
VARIANTS = TRANSFORMERS + tuple(RNNS) + (SMOKE,)


def translation_config(experiment: str, variant: str) -> ml_collections.ConfigDict:
  """The translation task's defaults and the ``variant``'s model family for ``experiments/<experiment>.py``.

  RNN variants get the RNN baselines' size and schedule, ``transformer_base`` the paper's base model and
  schedule; ``transformer_small`` keeps the Transformer defaults for the experiment to size. An unknown
  variant is a ``ConfigError`` listing ``VARIANTS``.
  """
  if variant not in VARIANTS:
    raise ConfigError(f"unknown variant {variant!r} of experiments/{experiment}.py; choose one of "
                      f"{list(VARIANTS)} (e.g. --config=experiments/{experiment}.py:{VARIANTS[0]}).")
  config = base_config("rnn" if variant in RNNS else "transformer")
  task = config.task
  task.name = "translation"
  task.dataset = ""  # a key of transformer.data.translation.BUILDERS: set by the experiment
  task.pair = ""  # "<source>-<target>"
  task.source_dir = ""  # raw files; "" = $TRANSFORMER_DATA_DIR, else download the official files
  task.data_dir = ""  # TFDS data dir for the prepared dataset and tokenizer; "" = TFDS default
  task.vocab_size = 8000  # shared SentencePiece vocabulary (trained on train only)
  task.shared_vocab = True
  task.tokenizer_type = "unigram"  # SentencePiece model type: "unigram" or "bpe"
  task.max_tokens = 4096  # per batch, each of source and target, padding included
  task.max_length = 128  # training filter; evaluation keeps every sentence whole
  task.batch_size_multiple = 8  # batch sizes divisible by up to 8 devices
  # True: every batch [max_tokens // max_length, max_length], one compiled shape instead of one per length
  # bucket, at the cost of padding: for accelerators, where compiling a large step per bucket is slow.
  task.fixed_batch_shape = False
  task.eval_split = "validation"
  task.test_splits = ()  # scored only by --mode=eval
  config.decode.method = "beam"
  config.decode.beam_size = 5
  config.decode.length_penalty = 0.6  # GNMT's alpha, used during training and whenever no candidates are given
  # --mode=eval decodes the tests with the alpha of these that scores best on the validation split; () = off.
  task.length_penalty_candidates = ()
  task.bleu_tokenize = "13a"  # sacreBLEU default on detokenised, cased output
  task.num_eval_sentences = 0  # 0 = the whole validation split

  config.label_smoothing = 0.1
  config.optimizer.schedule = "inverse_sqrt"
  config.optimizer.b2 = 0.98
  config.best_metric = "eval/bleu"  # checkpoints are chosen on validation BLEU
  config.best_mode = "max"
  config.log_every = 100
  if variant in RNNS:
    model = config.model
    model.cell, model.attention = RNNS[variant]
    model.embedding_dim = 256
    model.hidden_dim = 512  # bidirectional encoder: 256 per direction
    model.num_layers = 1
    model.dropout_rate = 0.3
    config.optimizer.schedule = "cosine"
    config.optimizer.learning_rate = 2e-3
    config.optimizer.warmup_steps = 500
    config.optimizer.grad_clip_norm = 1.0
    config.num_train_steps = 8000
    config.eval_every = 2000
    config.checkpoint_every = 500
  elif variant == "transformer_base":  # the paper's base model (the defaults of ModelConfig) and schedule
    config.optimizer.learning_rate = (512 * 4000) ** -0.5  # d_model^-0.5 * warmup^-0.5 (paper eq. 3)
    config.optimizer.warmup_steps = 4000
    config.num_train_steps = 20000
    config.eval_every = 2000
    config.checkpoint_every = 1000
  elif variant == SMOKE:
    task.vocab_size = 1000
    task.max_tokens = 1024
    # One [16, 64] batch shape: on a CPU a few dozen steps take less time than compiling a step per bucket.
    task.fixed_batch_shape = True
    task.max_length = 64
    config.decode.method = "greedy"  # decoding an untrained model is the slow part of the evaluation
    task.num_eval_sentences = 64
    model = config.model
    model.d_model = 32
    model.num_heads = 2
    model.d_ff = 64
    model.num_encoder_layers = 1
    model.num_decoder_layers = 1
    config.optimizer.learning_rate = 2e-3
    config.optimizer.warmup_steps = 20
    config.num_train_steps = 40
    config.log_every = 10
    config.eval_every = 40
    config.checkpoint_every = 20
  return config
