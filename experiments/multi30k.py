"""Multi30k English-German translation (Elliott et al. 2016): Transformer and RNN-attention baselines.

    python launch.py --config=experiments/multi30k.py:transformer_small --workdir=/tmp/multi30k_small \\
        --config.task.source_dir=../shared/data/multi30k
    python launch.py --config=experiments/multi30k.py:transformer_small --workdir=/tmp/multi30k_small --mode=eval

Variants: ``transformer_small`` (Wu et al. 2021's text-only baseline: 4+4 layers, d_model 128, 4 heads,
FFN 256), ``transformer_base`` (the paper's base model, for an accelerator), and the RNN-attention
baselines ``gru_bahdanau``, ``lstm_bahdanau``, ``lstm_luong_dot``, ``lstm_luong_general``. Checkpoints are chosen on
the validation split; test_2016_flickr is scored only by --mode=eval. Results: experiments/multi30k/RESULTS.md.
"""
from transformer.train import base_config

TRANSFORMERS = ("transformer_small", "transformer_base")
# RNN encoder-decoder baselines: cell_attention, as in Bahdanau et al. 2015 and Luong et al. 2015.
RNNS = {"gru_bahdanau": ("gru", "bahdanau"), "lstm_bahdanau": ("lstm", "bahdanau"),
        "lstm_luong_dot": ("lstm", "luong_dot"), "lstm_luong_general": ("lstm", "luong_general")}
VARIANTS = TRANSFORMERS + tuple(RNNS)


def get_config(variant: str = "transformer_small"):
  if variant not in VARIANTS:
    raise ValueError(f"unknown variant {variant!r} of experiments/multi30k.py; choose one of {list(VARIANTS)}.")
  config = base_config()
  task = config.task
  task.name = "translation"
  task.dataset = "multi30k"
  task.pair = "en-de"
  task.source_dir = ""  # raw files; "" = $TRANSFORMER_DATA_DIR, else download the official files
  task.data_dir = ""  # TFDS data dir for the prepared dataset and tokenizer; "" = TFDS default
  task.vocab_size = 8000  # shared SentencePiece vocabulary (trained on train only)
  task.shared_vocab = True
  task.tokenizer_type = "unigram"  # SentencePiece model type: "unigram" or "bpe"
  task.max_tokens = 4096  # per batch, each of source and target, padding included
  task.max_length = 128  # training filter; evaluation keeps every sentence whole
  task.batch_size_multiple = 8  # batch sizes divisible by up to 8 devices
  # True: every batch [max_tokens // max_length, max_length], one compiled shape instead of one per length
  # bucket, at the cost of padding. For accelerators, where compiling the base step took 40-60 s per shape
  # on an H100 (see transformer_base below).
  task.fixed_batch_shape = False
  task.eval_split = "validation"
  task.test_splits = ("test_2016_flickr", "test_2017_flickr", "test_2018_flickr")
  task.beam_size = 5
  task.length_penalty = 0.6  # GNMT's alpha, used during training and whenever no candidates are given
  # --mode=eval decodes the tests with the alpha of these that scores best on the validation split; () = off.
  task.length_penalty_candidates = ()
  task.bleu_tokenize = "13a"  # sacreBLEU default on detokenised, cased output
  task.num_eval_sentences = 0  # 0 = the whole validation split

  model = config.model
  config.label_smoothing = 0.1
  config.optimizer.schedule = "inverse_sqrt"
  config.optimizer.b2 = 0.98
  config.best_metric = "eval/bleu"
  config.best_mode = "max"
  config.log_every = 100
  if variant == "transformer_small":
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
    config.num_train_steps = 8000  # ~3 h alone on 2 CPU cores (0.73 steps/s with evals); Wu et al.: <= 8k
    config.eval_every = 2000
    config.checkpoint_every = 500
    config.keep_checkpoints = 5  # the last 5 (steps 6000-8000) for --average_checkpoints=5
  elif variant in RNNS:
    config.architecture = "rnn"
    config.rnn.cell, config.rnn.attention = RNNS[variant]
    config.rnn.embedding_dim = 256
    config.rnn.hidden_dim = 512  # bidirectional encoder: 256 per direction
    config.rnn.num_layers = 1
    config.rnn.dropout_rate = 0.3
    config.optimizer.schedule = "cosine"
    config.optimizer.learning_rate = 2e-3
    config.optimizer.warmup_steps = 500
    config.optimizer.grad_clip_norm = 1.0
    config.num_train_steps = 8000
    config.eval_every = 2000
    config.checkpoint_every = 500
  else:  # the paper's base model (defaults of ModelConfig)
    # Not trained to a result yet. One try on a lent H100 (2026-11-24, JAX 0.11.2, bfloat16,
    # --config.model.dtype=bfloat16 --config.task.max_tokens=8192 --config.task.max_length=64, 3000 steps
    # planned inside a 330-second limit of that machine's 10-minute command) reached step 67. The step
    # compiles once per length bucket (7 shapes here), and the benchmark measured 38-60 s per compilation of
    # this step on that GPU, so compiling, not training, took most of the time (per-shape compile times were
    # not logged in the run; XLA_FLAGS=--xla_gpu_autotune_level=0 was set and did not make it short). The
    # steps themselves are fast (benchmarks/RESULTS.md, train_step.gpu: 21 ms at 128 x 64+64 tokens). Next
    # try: --config.task.fixed_batch_shape=True (one shape) and a persistent compilation cache
    # (JAX_COMPILATION_CACHE_DIR) so a resumed run does not compile again.
    config.optimizer.learning_rate = (512 * 4000) ** -0.5  # d_model^-0.5 * warmup^-0.5 (paper eq. 3)
    config.optimizer.warmup_steps = 4000
    config.num_train_steps = 20000
    config.eval_every = 2000
    config.checkpoint_every = 1000
  return config
