r"""A decoder-only Transformer language model of the English captions of Multi30k (29k training sentences).

    python launch.py --config=experiments/language_model.py --workdir=/tmp/lm \
        --config.task.source_dir=../shared/data/multi30k
    printf 'A man in a red\nTwo dogs\n' | python launch.py --config=experiments/language_model.py \
        --workdir=/tmp/lm --mode=translate --config.decode.method=sample --config.decode.temperature=0.8 \
        --config.decode.top_p=0.9     # one continuation per prompt line; method=greedy (default) or beam
    python -c "import transformer; print(transformer.load('/tmp/lm').continue_texts(['A man in a red']))"

Variants: ``small`` (default: 3 layers, d_model 192, SentencePiece unigram vocabulary of 4000 pieces, sized for
2 CPU cores: its wall time is on the results page), ``tiny`` (a smoke run on the real data: under 40 s on 2 CPU
cores, preparing the data and training its SentencePiece model included; the tests also train it on a small made-up
corpus with ``--config.task.vocab_size=40``, as many pieces as such a corpus has). One
sentence per example; checkpoints are chosen on validation perplexity (per SentencePiece piece, EOS included).
Each evaluation prints continuations (``config.decode``) of the first words of a few validation sentences.
Results: experiments/language_model/RESULTS.md.
"""
from transformer.errors import ConfigError
from transformer.train import base_config

VARIANTS = ("small", "tiny")


def get_config(variant: str = "small"):
  if variant not in VARIANTS:
    raise ConfigError(f"unknown variant {variant!r} of experiments/language_model.py; choose one of "
                      f"{list(VARIANTS)} (e.g. --config=experiments/language_model.py:tiny).")
  config = base_config("lm")  # config.model: the fields of transformer.nn.ModelConfig
  _text_task(config.task)

  model = config.model
  model.d_model = 192
  model.num_heads = 4
  model.d_ff = 768
  model.num_encoder_layers = 0  # decoder only
  model.num_decoder_layers = 3
  model.dropout_rate = 0.2
  model.attention_dropout_rate = 0.1
  model.norm_position = "pre"
  model.max_length = 128

  config.optimizer.schedule = "cosine"
  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 200
  config.optimizer.grad_clip_norm = 1.0
  config.num_train_steps = 1200  # ~4 epochs
  config.log_every = 100
  config.eval_every = 400
  config.checkpoint_every = 400
  config.best_metric = "eval/perplexity"
  config.best_mode = "min"
  if variant == "tiny":
    _shrink_to_tiny(config)
  return config


def _text_task(task) -> None:
  """``config.task``: English captions of Multi30k, SentencePiece pieces, token-sized batches."""
  task.name = "language_model"
  task.dataset = "multi30k"  # a key of transformer.data.translation.BUILDERS
  task.pair = "en-de"  # the builder config whose ...
  task.language = "en"  # ... side is modelled
  task.source_dir = ""  # raw files; "" = $TRANSFORMER_DATA_DIR/multi30k, else download the official files
  task.data_dir = ""  # TFDS data dir for the prepared dataset and tokenizer; "" = TFDS default
  task.vocab_size = 4000  # SentencePiece pieces, 4 specials included
  task.tokenizer_type = "unigram"
  task.max_tokens = 2048  # per batch, padding included
  task.max_length = 64  # training filter (see chunk_long_sentences) and the longest continuation
  # False: training sentences longer than max_length are dropped, as the recorded runs were trained (the log says
  # how many); True cuts them into pieces of max_length instead, which changes those runs' data.
  task.chunk_long_sentences = False
  task.batch_size_multiple = 8
  task.fixed_batch_shape = False  # True: one batch shape (one compilation) instead of one per length bucket
  task.pack = False  # True: sentences packed whole into rows of max_length: one shape, almost no padding
  task.eval_split = "validation"
  task.num_eval_prompts = 3  # continuations printed at each evaluation
  task.prompt_words = 4


def _shrink_to_tiny(config) -> None:
  """The ``tiny`` variant: minutes end to end on 2 CPU cores."""
  # The real captions have 80 distinct characters, each a piece of its own: SentencePiece needs at least 84.
  config.task.vocab_size = 1000
  config.task.max_tokens = 256
  config.task.max_length = 32
  config.task.fixed_batch_shape = True  # one compiled train step: the tests' seconds go to compiling
  config.task.num_eval_prompts = 2
  config.model.d_model = 32
  config.model.num_heads = 2
  config.model.d_ff = 64
  config.model.num_decoder_layers = 1
  config.model.max_length = 64
  config.optimizer.warmup_steps = 5
  config.num_train_steps = 20
  config.log_every = 10
  config.eval_every = 20
  config.checkpoint_every = 20
