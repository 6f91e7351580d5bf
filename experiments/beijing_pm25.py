"""Beijing PM2.5 forecasting: pm2.5 1, 6, 12, 24 and 48 hours ahead from the last 72 hours of pm2.5 and weather.

    TRANSFORMER_DATA_DIR=../shared/data python launch.py --config=experiments/beijing_pm25.py:gru \\
        --workdir=/tmp/pm25/gru
    python launch.py --config=experiments/beijing_pm25.py:transformer --workdir=/tmp/pm25/transformer \\
        --config.task.source_dir=../shared/data/beijing_pm25
    python launch.py --config=experiments/beijing_pm25.py:gru --workdir=/tmp/pm25/gru --mode=predict  # test CSV
    TRANSFORMER_DATA_DIR=../shared/data python -m experiments.beijing_pm25_results --workdir_root=/tmp/pm25 \
        --update_committed   # test-year table and plots of the runs under /tmp/pm25/<variant>

Variants: ``rnn``, ``lstm``, ``gru`` (recurrent forecasters), ``transformer`` (encoder over the window, one
decoder query per horizon), ``transformer_encoder`` (encoder only, the state at the origin to a linear head),
``tiny`` (a seconds-long smoke run on a generated series: no data needed). Three seeds train at once
(``config.num_seeds=3``, vmapped). Every model forecasts the change from the last hour's pm2.5, trained with an
MAE loss on the standardised ``log1p(pm2.5)`` (``transformer/tasks/forecasting.py``). Training: 2010-2012; validation (best checkpoint by MAE): 2013; test: 2014.
The raw CSV is found in ``config.task.source_dir``, else ``$TRANSFORMER_DATA_DIR/beijing_pm25``.
Measured results: experiments/beijing_pm25/RESULTS.md.
"""
from transformer.errors import ConfigError
from transformer.tasks import require_extra
from transformer.train import base_config

VARIANTS = ("rnn", "lstm", "gru", "transformer", "transformer_encoder", "tiny")


def get_config(variant: str = "gru"):
  if variant not in VARIANTS:
    raise ConfigError(f"unknown variant {variant!r} of experiments/beijing_pm25.py; choose one of "
                      f"{list(VARIANTS)} (e.g. --config=experiments/beijing_pm25.py:transformer).")
  # The feature names come with the dataset's builder (TFDS): without it, one line naming the extra.
  require_extra("data", "experiments/beijing_pm25.py")
  from transformer.data.beijing_pm25.features import FEATURE_NAMES, HORIZONS
  config = base_config("forecaster")  # config.model: the fields of transformer.nn.ForecasterConfig
  config.task.name = "forecasting"
  config.task.dataset = "synthetic" if variant == "tiny" else "beijing_pm25"
  config.task.source_dir = ""  # folder of the raw CSV; "" = $TRANSFORMER_DATA_DIR/beijing_pm25
  config.task.data_dir = ""  # TFDS data folder; "" = $TFDS_DATA_DIR or ~/tensorflow_datasets
  config.task.horizons = HORIZONS
  config.task.loss = "mae"  # of the standardised log1p(pm2.5): forecasts the median, what the MAE rewards
  config.task.residual = True  # forecast the change from the last hour's pm2.5 (persistence + a learned change)
  config.task.synthetic_hours = 4000  # the "synthetic" dataset's length

  model = config.model
  model.architecture = "gru" if variant == "tiny" else variant
  model.num_features = len(FEATURE_NAMES)
  model.num_horizons = len(HORIZONS)
  model.input_length = 72
  model.d_model = 64
  model.num_layers = 2 if variant in ("transformer", "transformer_encoder") else 1
  model.num_decoder_layers = 1
  model.num_heads = 4
  model.d_ff = 128
  model.dropout_rate = 0.1

  config.num_seeds = 3  # vmapped replicas: mean and spread over seeds
  config.batch_size = 64
  config.num_train_steps = 2000  # ~5 epochs; validation MAE stops improving well before
  config.optimizer.learning_rate = 1e-3
  config.optimizer.schedule = "cosine"
  config.optimizer.warmup_steps = 100
  config.optimizer.grad_clip_norm = 1.0
  config.log_every = 100
  config.eval_every = 250
  config.eval_batch_size = 512
  config.checkpoint_every = 250
  config.best_metric = "eval/mae"
  config.best_mode = "min"
  if variant in ("transformer", "transformer_encoder"):
    config.num_train_steps = 1500  # a step costs ~4x a GRU's on CPU: a similar wall-time budget
  if variant == "tiny":
    model.input_length = 48
    model.d_model = 16
    config.num_seeds = 1
    config.batch_size = 16
    config.num_train_steps = 20
    config.optimizer.warmup_steps = 5
    config.log_every = 10
    config.eval_every = 10
    config.checkpoint_every = 10
  return config
