"""Pieces every translation experiment shares (a helper, not an experiment: it has no ``get_config``).

``experiments/multi30k.py`` and ``experiments/iwslt15_en_vi.py`` start from ``base_config`` and call these by
name: ``task`` (the task's fields), ``paper_training`` (the paper's recipe), then in a variant's branch
``paper_base_schedule``, ``rnn_baseline`` or ``smoke``. What an experiment sizes for its data (its
``transformer_small``, batch sizes, test splits) stays in its own file, so that a change of one experiment's
defaults never changes the other's.
"""
from __future__ import annotations

import ml_collections

# RNN encoder-decoder baselines: cell_attention, as in Bahdanau et al. 2015 and Luong et al. 2015.
RNNS = {"gru_bahdanau": ("gru", "bahdanau"), "lstm_bahdanau": ("lstm", "bahdanau"),
        "lstm_luong_dot": ("lstm", "luong_dot"), "lstm_luong_general": ("lstm", "luong_general")}
# tiny: a one-layer Transformer that trains, evaluates and translates in a few minutes on 2 CPU cores (a smoke
# test of the data, tokenizer, batching and decoding, not a result).
SMOKE = "tiny"


def task(dataset: str, pair: str, test_splits: tuple[str, ...]) -> ml_collections.ConfigDict:
  """``config.task`` of the translation task on ``dataset`` (a key of ``transformer.data.translation.BUILDERS``)
  for ``pair`` ("<source>-<target>"); ``test_splits`` are scored only by --mode=eval."""
  return ml_collections.ConfigDict({
      "name": "translation",
      "dataset": dataset,
      "pair": pair,
      "source_dir": "",  # raw files; "" = $TRANSFORMER_DATA_DIR, else download the official files
      "data_dir": "",  # TFDS data dir for the prepared dataset and tokenizer; "" = TFDS default
      "vocab_size": 8000,  # shared SentencePiece vocabulary (trained on train only)
      "shared_vocab": True,
      "tokenizer_type": "unigram",  # SentencePiece model type: "unigram" or "bpe"
      "max_tokens": 4096,  # per batch, each of source and target, padding included
      "max_length": 128,  # training filter; evaluation keeps every sentence whole
      "batch_size_multiple": 8,  # batch sizes divisible by up to 8 devices
      # True: every batch [max_tokens // max_length, max_length], one compiled shape instead of one per length
      # bucket, at the cost of padding: for accelerators, where compiling a large step per bucket is slow.
      "fixed_batch_shape": False,
      # True: training examples packed whole into rows of max_length, one shape and almost no padding.
      "pack": False,
      "eval_split": "validation",
      "test_splits": test_splits,
      # --mode=eval decodes the tests with the alpha of these that scores best on the validation split; () = off.
      "length_penalty_candidates": (),
      "bleu_tokenize": "13a",  # sacreBLEU default on detokenised, cased output
      "num_eval_sentences": 0,  # 0 = the whole validation split
  })


def paper_training(config: ml_collections.ConfigDict) -> None:
  """Set the paper's training and decoding recipe on ``config``: label smoothing 0.1, Adam's beta2 0.98, the
  inverse square root schedule, beam search of 5 with GNMT's length penalty 0.6; checkpoints are chosen on
  validation BLEU."""
  config.label_smoothing = 0.1
  config.optimizer.schedule = "inverse_sqrt"
  config.optimizer.b2 = 0.98
  config.decode.method = "beam"
  config.decode.beam_size = 5
  config.decode.length_penalty = 0.6  # GNMT's alpha, used during training and whenever no candidates are given
  config.best_metric = "eval/bleu"
  config.best_mode = "max"
  config.log_every = 100


def paper_base_schedule(config: ml_collections.ConfigDict) -> None:
  """``transformer_base``: the paper's base model (``ModelConfig``'s defaults) with its learning rate and
  warmup, for an accelerator."""
  config.optimizer.learning_rate = (512 * 4000) ** -0.5  # d_model^-0.5 * warmup^-0.5 (paper eq. 3)
  config.optimizer.warmup_steps = 4000
  config.num_train_steps = 20000
  config.eval_every = 2000
  config.checkpoint_every = 1000


def rnn_baseline(config: ml_collections.ConfigDict, variant: str) -> None:
  """The RNN-attention baseline ``variant`` (a key of ``RNNS``) on a ``base_config("rnn")``: its cell and
  attention, size and schedule."""
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


def smoke(config: ml_collections.ConfigDict) -> None:
  """``tiny``: a one-layer Transformer with a 1,000-piece vocabulary, 40 steps, greedy decoding of 64
  validation sentences."""
  task = config.task
  task.vocab_size = 1000
  task.max_tokens = 1024
  # One [16, 64] batch shape: on a CPU a few dozen steps take less time than compiling a step per bucket.
  task.fixed_batch_shape = True
  task.max_length = 64
  task.num_eval_sentences = 64
  config.decode.method = "greedy"  # decoding an untrained model is the slow part of the evaluation
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
