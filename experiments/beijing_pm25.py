r"""Beijing PM2.5 forecasting: pm2.5 1, 6, 12, 24, 48, 72 and 96 hours ahead from the hours up to the origin.

    TRANSFORMER_DATA_DIR=../shared/data python launch.py --config=experiments/beijing_pm25.py:gru \
        --workdir=/tmp/pm25/gru-168h
    python launch.py --config=experiments/beijing_pm25.py:patchtst --workdir=/tmp/pm25/patchtst-336h \
        --config.task.source_dir=../shared/data/beijing_pm25
    python launch.py --config=experiments/beijing_pm25.py:gru --workdir=/tmp/pm25/gru-168h --mode=predict  # test CSV
    python launch.py --config=experiments/beijing_pm25.py:gru --config.model.input_length=72 ...  # another window
    python launch.py --config=experiments/beijing_pm25.py:gru --config.model.input_features=target ...  # pm2.5 alone
    python launch.py --config=experiments/beijing_pm25.py:patchtst --config.model.input_features=all ...  # + weather
    TRANSFORMER_DATA_DIR=../shared/data python -m experiments.beijing_pm25_results --workdir_root=/tmp/pm25 \
        --update_committed   # test-year tables, comparisons and plots of the runs /tmp/pm25/<variant>-<hours>h

Variants: ``rnn``, ``lstm``, ``gru`` (recurrent forecasters), ``transformer`` (encoder over the window, one
decoder query per horizon), ``transformer_encoder`` (encoder only, the state at the origin to a linear head),
``patchtst`` (Nie et al. 2023: patches of the pm2.5 history as tokens), ``dlinear`` (Zeng et al. 2023: linear
maps from the trend and the rest of the pm2.5 history), ``tiny`` (a seconds-long smoke run on a generated
series: no data needed). Each variant's input window (``INPUT_HOURS``) is the one of ``WINDOW_CANDIDATES`` with
the lowest validation MAE (experiments/beijing_pm25/RESULTS.md shows the choice). Three seeds train at once
(``config.num_seeds=3``, vmapped). Inputs (``config.model.input_features``): by default (``"auto"``) each model's
as published, all 18 features of an hour for the 2017-style models, the pm2.5 history alone for PatchTST and
DLinear; ``"target"`` (pm2.5 alone) or ``"all"`` gives every model the same inputs, so that a comparison of
architectures is not one of inputs too (PatchTST and DLinear on several channels: ``transformer/nn/forecasters.py``).
The 2017-style models forecast the change from the last hour's pm2.5; PatchTST and DLinear forecast the level, as
published (PatchTST's instance normalisation restores it). Loss:
MAE on the standardised ``log1p(pm2.5)`` (``transformer/tasks/forecasting.py``). Training: 2010-2012;
validation (best checkpoint by MAE): 2013; test: 2014.
The raw CSV is found in ``config.task.source_dir``, else ``$TRANSFORMER_DATA_DIR/beijing_pm25``.
Measured results: experiments/beijing_pm25/RESULTS.md.
"""
from transformer.errors import ConfigError
from transformer.tasks import require_extra
from transformer.train import base_config

VARIANTS = ("rnn", "lstm", "gru", "transformer", "transformer_encoder", "patchtst", "dlinear", "tiny")
RECURRENT = ("rnn", "lstm", "gru")
TRANSFORMERS = ("transformer", "transformer_encoder", "patchtst")
# Input windows tried on validation (hours: three days, a week, two weeks), as many as a 2-core CPU host had
# time for: the 2017 Transformers' attention over 168 hours costs several times their 72-hour step.
WINDOW_CANDIDATES = {"rnn": (72, 168), "lstm": (72,), "gru": (72, 168), "transformer": (72,),
                     "transformer_encoder": (72,), "patchtst": (168, 336), "dlinear": (72, 168, 336)}
INPUT_HOURS = {"rnn": 168, "lstm": 72, "gru": 168, "transformer": 72, "transformer_encoder": 72, "patchtst": 336,
               "dlinear": 336}


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
  # The change from the last hour's pm2.5 (persistence + a learned change); PatchTST and DLinear as published.
  config.task.residual = variant not in ("patchtst", "dlinear")
  config.task.synthetic_hours = 4000  # the "synthetic" dataset's length

  model = config.model
  model.architecture = "gru" if variant == "tiny" else variant
  model.num_features = len(FEATURE_NAMES)
  model.num_horizons = len(HORIZONS)
  model.input_length = INPUT_HOURS.get(variant, 48)
  model.d_model = 64
  model.num_layers = {"transformer": 2, "transformer_encoder": 2, "patchtst": 3}.get(variant, 1)
  model.num_decoder_layers = 1
  model.num_heads = 4
  model.d_ff = 128
  model.dropout_rate = 0.1

  config.num_seeds = 3  # vmapped replicas: mean and spread over seeds
  config.batch_size = 64
  config.num_train_steps = 2000  # ~5 epochs of the 2010-2012 windows
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
  _variant_settings(config, variant)
  return config


def _variant_settings(config, variant: str) -> None:
  """What a variant changes from the shared settings: its step budget, PatchTST's and DLinear's published
  settings, the ``tiny`` run's size."""
  if variant in ("transformer", "transformer_encoder"):
    config.num_train_steps = 1500  # a step costs several GRU steps on CPU: a closer wall-time budget
  if variant == "patchtst":  # the paper's settings for its datasets of this size (ETTh: 17,420 hours)
    config.model.patch_length = 16
    config.model.patch_stride = 8
    config.model.positional_encoding = "learned"
    config.model.d_model = 16
    config.model.d_ff = 128
    config.model.dropout_rate = 0.3
  if variant == "dlinear":
    config.model.moving_average = 25  # the paper's
  if variant == "tiny":
    config.model.d_model = 16
    config.num_seeds = 1
    config.batch_size = 16
    config.num_train_steps = 20
    config.optimizer.warmup_steps = 5
    config.log_every = 10
    config.eval_every = 10
    config.checkpoint_every = 10
