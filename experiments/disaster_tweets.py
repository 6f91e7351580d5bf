r"""Disaster Tweets (Kaggle's nlp-getting-started): is a tweet about a real disaster? F1 of the class "disaster".

    export TRANSFORMER_DATA_DIR=/path/holding/disaster_tweets      # Kaggle's train.csv and test.csv
    export TRANSFORMER_MODELS_DIR=/path/holding/all-MiniLM-L6-v2   # Hugging Face sentence-transformers/all-MiniLM-L6-v2
    python launch.py --config=experiments/disaster_tweets.py:minilm_finetune --workdir=/tmp/dt/minilm_finetune
    python launch.py --config=experiments/disaster_tweets.py:minilm_finetune --workdir=/tmp/dt/minilm_finetune \
        --mode=eval      # the fixed test split (test/f1, ...); --mode=predict writes Kaggle's submission.csv

(or ``--config.task.source_dir=...`` and ``--config.task.pretrained_dir=...`` instead of the variables.)
Variants, all tokenised by MiniLM's WordPiece tokenizer (``transformer.tasks.classification``):

- ``static_scratch``: mean-pooled token embeddings learned from scratch (d 128), linear head.
- ``static_minilm``: mean-pooled frozen MiniLM input embeddings (d 384), linear head.
- ``transformer_scratch``: a 2-layer Transformer encoder from scratch (d 128), mean pooling, linear head.
- ``minilm_frozen``: the pretrained MiniLM encoder frozen (no gradient reaches it), a linear head on its
  mean-pooled outputs: what the pretrained features give before any fine-tuning.
- ``minilm_finetune``: the pretrained MiniLM encoder (6 layers, d 384), mean pooling, all fine-tuned.
- ``tiny``: a seconds-long smoke run of the static model.

Every variant trains 3 seeds in one program (``num_seeds=3``, vmapped). The checkpoint kept is the best by
the seeds' mean validation F1.
Measured results: experiments/disaster_tweets/RESULTS.md (``python -m experiments.disaster_tweets_results``).
"""
from transformer.errors import ConfigError
from transformer.train import base_config

VARIANTS = ("static_scratch", "static_minilm", "transformer_scratch", "minilm_frozen", "minilm_finetune", "tiny")


def get_config(variant: str = "minilm_finetune"):
  if variant not in VARIANTS:
    raise ConfigError(f"unknown variant {variant!r} of experiments/disaster_tweets.py; choose one of "
                      f"{list(VARIANTS)} (e.g. --config=experiments/disaster_tweets.py:static_scratch).")
  config = base_config("encoder_classifier")  # config.model: the fields of transformer.nn.ClassifierConfig
  task = config.task
  task.name = "classification"
  task.dataset = "disaster_tweets"
  task.source_dir = ""  # Kaggle's CSV files; "" = $TRANSFORMER_DATA_DIR
  task.data_dir = ""  # TFDS data dir; "" = $TFDS_DATA_DIR or ~/tensorflow_datasets
  task.pretrained_dir = ""  # "" = $TRANSFORMER_MODELS_DIR/<pretrained_model>
  task.pretrained_model = "all-MiniLM-L6-v2"
  task.pretrained_init = "none"  # none | embedding | encoder
  task.max_length = 64  # tokens per tweet with [CLS] and [SEP]; longer ones (under 1%) lose their end
  task.bucket_length_multiple = 16  # training batches of similar lengths, padded to 16, 32, 48 or 64 tokens
  task.eval_split = "validation"
  task.test_split = "test"

  model = config.model
  model.num_classes = 2
  model.pooling = "mean"
  model.num_decoder_layers = 0
  model.max_length = task.max_length

  config.num_seeds = 3
  config.batch_size = 32
  config.eval_batch_size = 128
  config.optimizer.schedule = "cosine"
  config.optimizer.b2 = 0.999
  config.optimizer.eps = 1e-8
  config.optimizer.weight_decay = 0.01
  config.log_every = 50
  config.best_metric = "eval/f1"
  config.keep_checkpoints = 1

  _variant_settings(config, variant)
  return config


def _variant_settings(config, variant: str) -> None:
  """What each variant sets: the model's size and what starts from the checkpoint, the step budget, the rate."""
  task, model = config.task, config.model
  if variant in ("static_scratch", "static_minilm", "tiny"):
    # No layers, no positions, no scaling: the pooled vector is the mean of the tokens' embeddings.
    model.num_encoder_layers = 0
    model.positional_encoding = "none"
    model.scale_embeddings = False
    model.num_heads = 1
    model.dropout_rate = 0.1
    model.d_model = 64  # tiny; static_scratch: 128 (below), static_minilm: the checkpoint's 384
    config.num_train_steps = 1500
    config.eval_every = 150
    config.checkpoint_every = 150
    config.optimizer.learning_rate = 3e-3
    config.optimizer.warmup_steps = 50
    if variant == "static_scratch":  # a wider table, more dropout and a lower rate: no early overfitting
      model.d_model = 128
      model.dropout_rate = 0.3
      config.optimizer.learning_rate = 1e-3
    if variant == "static_minilm":
      task.pretrained_init = "embedding"
      config.optimizer.frozen_params = ("encoder/embedding",)
      config.optimizer.learning_rate = 1e-2
    if variant == "tiny":
      config.num_train_steps = 20
      config.eval_every = config.checkpoint_every = 10
  elif variant == "transformer_scratch":
    model.d_model = 128
    model.num_heads = 4
    model.d_ff = 256
    model.num_encoder_layers = 2
    model.positional_encoding = "learned"
    model.dropout_rate = 0.1
    model.attention_dropout_rate = 0.1
    config.num_train_steps = 1200
    config.eval_every = config.checkpoint_every = 150
    config.optimizer.learning_rate = 1e-3
    config.optimizer.warmup_steps = 100
  elif variant == "minilm_frozen":  # sizes from the checkpoint; only the head trains
    task.pretrained_init = "encoder"
    config.optimizer.frozen_params = ("encoder",)
    model.dropout_rate = 0.1
    config.num_train_steps = 600  # 3 epochs
    config.eval_every = config.checkpoint_every = 100
    config.optimizer.learning_rate = 1e-2
    config.optimizer.warmup_steps = 50
  else:  # minilm_finetune: sizes from the checkpoint; config.model gives the head and dropout
    task.pretrained_init = "encoder"
    model.dropout_rate = 0.1
    model.attention_dropout_rate = 0.1
    config.num_train_steps = 300  # 1.6 epochs
    config.eval_every = config.checkpoint_every = 75
    config.optimizer.learning_rate = 6e-5
    config.optimizer.warmup_steps = 30
