"""Time-series forecasters: a window of hourly features in, one value per forecast horizon out.

    config = ForecasterConfig(architecture="transformer", num_features=18, input_length=72, num_horizons=5)
    model = make_forecaster(config)
    forecasts = model.apply({"params": params}, inputs, rngs={"dropout": key})  # [batch, num_horizons]

Every architecture maps ``inputs`` ``[batch, input_length, num_features]`` (the window, its last hour the
forecast origin) to ``[batch, num_horizons]`` float32: each horizon predicted directly, in the space of the
normalised targets. Nothing else enters, so no hour after the origin can leak in. Feature 0
(``TARGET_FEATURE``) is the forecast variable's own history.

Which features a model reads (``input_features``): ``"all"`` of them, or the ``"target"`` feature alone;
``"auto"`` (the default) is each architecture's published choice: ``"target"`` for ``patchtst`` and ``dlinear``,
``"all"`` for the others. So a comparison of architectures on equal inputs is one setting away.

  * ``rnn`` / ``lstm`` / ``gru`` (``RecurrentForecaster``): stacked ``nn.RNN`` layers of ``nn.SimpleCell`` /
    ``nn.OptimizedLSTMCell`` / ``nn.GRUCell`` read the window; a linear head maps the top layer's last hidden
    state to the horizons.
  * ``transformer`` (``TransformerForecaster``): the ``Encoder`` reads the window through a linear projection in
    place of its token table. The ``Decoder``'s "tokens" are the horizon indices ``0 .. num_horizons - 1``, so
    its table holds one learned query per horizon (plus the positional encoding of the index); horizon ``i``
    attends causally to the horizons ``<= i`` and across to the encoded window, and the Decoder's output
    layer, with a vocabulary of one, gives the horizon's value.
  * ``transformer_encoder`` (``TransformerForecaster``): the same ``Encoder``, then the state at the origin (or
    the mean over the window), then a linear head to the horizons.
  * ``patchtst`` (``PatchTSTForecaster``, Nie et al. 2023): each channel it reads, normalised over its window
    (RevIN), cut into patches (``patch_length``, ``patch_stride``) that a linear layer embeds as tokens, the
    ``Encoder`` (learned positions), the flattened patch states to a linear head, and the target's window scale
    put back. PatchTST is channel independent: every variable goes through the same embedding and encoder
    alone. As published (``"target"``), the target's forecast reads its own history only; computing the
    other variables' forecasts, which the loss never sees, would change nothing, so only the target is
    computed. With several channels (``input_features="all"``) the encoder stays channel independent (one
    series per token sequence, shared weights), and the head maps the flattened states of every channel to
    the target's horizons: the paper's multivariate setting forecasts each channel from its own history,
    which would leave the target's forecast blind to the other channels; mixing them in the head alone keeps
    the channel-independent representation the paper argues for and lets the weather reach the forecast
    (at the encoder's cost times the number of channels).
    Unlike the paper: the ``Encoder``'s norm (``norm_position``, LayerNorm), not BatchNorm, whose batch
    statistics would make a forecast depend on the batch it is in; no residual attention scores.
  * ``dlinear`` (``DLinearForecaster``, Zeng et al. 2023): each channel split into a moving-average trend
    (``moving_average`` hours) and the rest; a linear map over the window from each, summed. As published
    (``"target"``), channel independent, so it reads the target's history only; with several channels, each
    channel's two linear maps to the target's horizons are summed with the others' (one linear map over
    every channel's trend and rest).
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from transformer.errors import ConfigError
from transformer.nn.axes import cell_axes, dense_axes, embed_axes
from transformer.nn.config import DTYPES, NORM_POSITIONS, POSITIONAL_ENCODINGS, ModelConfig, ModelSettings
from transformer.nn.layers import module_dropout
from transformer.nn.models import Decoder, Encoder
from transformer.ops.kernels import KERNEL_SETTINGS
from transformer.ops.series import instance_normalize, patches, series_decomposition

RECURRENT_CELLS = {"rnn": nn.SimpleCell, "lstm": nn.OptimizedLSTMCell, "gru": nn.GRUCell}
TRANSFORMER_ARCHITECTURES = ("transformer", "transformer_encoder", "patchtst")
ARCHITECTURES = tuple(RECURRENT_CELLS) + TRANSFORMER_ARCHITECTURES + ("dlinear",)
TARGET_FEATURE = 0  # the forecast variable's column in the inputs
# Which features a forecaster reads: "all", the "target" alone, or "auto": the architecture's published choice.
INPUT_FEATURES = ("auto", "all", "target")
CHANNEL_INDEPENDENT = ("patchtst", "dlinear")  # "auto" reads the target alone
FORECAST_POOLINGS = ("last", "mean")  # "last": the state at the forecast origin


@dataclasses.dataclass(frozen=True)
class ForecasterConfig(ModelSettings):
  """Hyper-parameters of every forecaster; validated when built, like ``ModelConfig``.

  One config for all architectures, so that comparing them is a change of ``architecture`` alone; a field
  an architecture does not use is ignored. Defaults fit the Beijing PM2.5 windows. Switch to evaluation with
  ``config.replace(deterministic=True)``.
  """
  architecture: str = "transformer"  # one of ARCHITECTURES
  num_features: int = 18  # inputs per hour
  input_length: int = 72  # hours in a window
  num_horizons: int = 5  # outputs, one per horizon (1, 6, 12, 24, 48 hours)
  d_model: int = 64  # Transformer residual stream width, or recurrent state width
  num_layers: int = 2  # stacked recurrent layers, or Transformer encoder layers
  num_decoder_layers: int = 1  # "transformer" only
  num_heads: int = 4  # Transformers; must divide d_model
  d_ff: int = 128  # Transformers' feed-forward hidden width
  dropout_rate: float = 0.1  # Transformers: as ModelConfig's; recurrent: between layers and before the head
  attention_dropout_rate: float = 0.0  # Transformers: on attention weights
  positional_encoding: str = "sinusoidal"  # Transformers: one of POSITIONAL_ENCODINGS
  norm_position: str = "pre"  # Transformers: one of NORM_POSITIONS
  pooling: str = "last"  # "transformer_encoder": one of FORECAST_POOLINGS
  patch_length: int = 16  # "patchtst": hours per patch (token)
  patch_stride: int = 8  # "patchtst": hours between two patches' starts
  moving_average: int = 25  # "dlinear": odd number of hours in the trend's centred moving average
  # One of INPUT_FEATURES: "all" features, the "target" (feature 0) alone, or "auto": "target" for
  # CHANNEL_INDEPENDENT architectures (as published), "all" for the others.
  input_features: str = "auto"
  dtype: str = "float32"  # compute dtype; parameters and forecasts stay float32
  kernels: str = "auto"  # ops implementations: "auto" (backend-tuned) or "reference" (ops.kernels)
  deterministic: bool = False  # True disables dropout (evaluation)

  def __post_init__(self):
    for name, allowed in (("architecture", ARCHITECTURES), ("positional_encoding", POSITIONAL_ENCODINGS),
                          ("norm_position", NORM_POSITIONS), ("pooling", FORECAST_POOLINGS), ("dtype", DTYPES),
                          ("kernels", KERNEL_SETTINGS), ("input_features", INPUT_FEATURES)):
      self.check_choice(name, allowed)
    for name in ("num_features", "input_length", "num_horizons", "d_model", "num_layers", "num_decoder_layers",
                 "num_heads", "d_ff", "patch_length", "patch_stride", "moving_average"):
      self.check_positive_int(name)
    for name in ("dropout_rate", "attention_dropout_rate"):
      self.check_rate(name)
    if self.architecture in TRANSFORMER_ARCHITECTURES:
      if self.d_model % self.num_heads:
        divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
        raise ConfigError(f"ForecasterConfig.num_heads={self.num_heads} does not divide d_model={self.d_model}; "
                         f"choose num_heads from {divisors} or change d_model.")
      if self.positional_encoding == "rotary" and (self.d_model // self.num_heads) % 2:
        raise ConfigError(f"ForecasterConfig.positional_encoding='rotary' needs an even head dimension "
                         f"(d_model / num_heads), got {self.d_model // self.num_heads}; change d_model or "
                         f"num_heads.")

    if self.architecture == "patchtst" and self.patch_length > self.input_length:
      raise ConfigError(f"ForecasterConfig.patch_length={self.patch_length} is longer than the window "
                       f"(input_length={self.input_length}); choose patch_length <= input_length.")
    if self.architecture == "dlinear" and self.moving_average % 2 == 0:
      raise ConfigError(f"ForecasterConfig.moving_average={self.moving_average} must be odd (a window centred on "
                       f"each hour); use {self.moving_average + 1}.")

  @property
  def reads_target_only(self) -> bool:
    """Whether the model reads feature 0 (``TARGET_FEATURE``) alone, ``input_features`` resolved."""
    if self.input_features == "auto":
      return self.architecture in CHANNEL_INDEPENDENT
    return self.input_features == "target"

  @property
  def num_input_channels(self) -> int:
    """Features the model reads of each hour: 1 or ``num_features``."""
    return 1 if self.reads_target_only else self.num_features

  @property
  def num_patches(self) -> int:
    """"patchtst": tokens per window, the last patch ending on the padded window's end (``ops.patches``)."""
    return (self.input_length - self.patch_length) // self.patch_stride + 2

  def transformer_config(self) -> ModelConfig:
    """The ``ModelConfig`` of the ``Encoder`` and ``Decoder`` inside ``TransformerForecaster``."""
    return ModelConfig(
        # The Decoder's output layer is the regression head: one "vocabulary" entry, untied, as a Dense layer.
        vocab_size=1, tie_output_embedding=False,
        d_model=self.d_model, num_heads=self.num_heads, d_ff=self.d_ff, num_encoder_layers=self.num_layers,
        num_decoder_layers=self.num_decoder_layers, dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        max_length=max(self.input_length, self.num_horizons, self.num_patches), positional_encoding=self.positional_encoding,
        # The projected features and the query table have unit scale already (see TransformerForecaster).
        scale_embeddings=False, norm_position=self.norm_position, dtype=self.dtype, kernels=self.kernels,
        deterministic=self.deterministic)


def _check_inputs(config: ForecasterConfig, inputs) -> None:
  """A clear error for windows of another shape than the config's (a Dense layer would read any width)."""
  expected = (config.input_length, config.num_features)
  if inputs.ndim != 3 or tuple(inputs.shape[1:]) != expected:
    raise ValueError(f"Forecaster inputs must be [batch, input_length, num_features] = [batch, {expected[0]}, "
                     f"{expected[1]}], got {list(inputs.shape)}; set ForecasterConfig.input_length and "
                     f"num_features to the windows' shape.")


def _read_features(config: ForecasterConfig, inputs):
  """The features the model reads of checked ``inputs``: ``[batch, input_length, num_input_channels]``, the
  target's column alone under ``reads_target_only``; the target stays channel ``TARGET_FEATURE`` (0) either way."""
  _check_inputs(config, inputs)
  return inputs[:, :, TARGET_FEATURE:TARGET_FEATURE + 1] if config.reads_target_only else inputs


class RecurrentForecaster(nn.Module):
  """Stacked ``nn.RNN`` layers of the cell ``RECURRENT_CELLS[config.architecture]``, then a linear head.

  Parameters: ``layer_{i}`` (the cell's; the first reads ``num_input_channels`` features), ``head`` ``[d_model,
  num_horizons]`` with bias.
  """
  config: ForecasterConfig

  @nn.compact
  def __call__(self, inputs):
    """``[batch, input_length, num_features]`` -> ``[batch, num_horizons]`` float32."""
    config = self.config
    cell_class = RECURRENT_CELLS[config.architecture]
    x = _read_features(config, inputs).astype(config.compute_dtype)
    for index in range(config.num_layers):
      if index:
        x = module_dropout(self, x, config.dropout_rate)
      cell = cell_class(features=config.d_model, dtype=config.compute_dtype,
                        **cell_axes("rnn_state" if index else "features"), name=f"layer_{index}")
      x = nn.RNN(cell)(x)
    last_hidden = module_dropout(self, x[:, -1], config.dropout_rate)  # [batch, d_model], at the origin
    head = nn.Dense(config.num_horizons, **dense_axes("rnn_state", "outputs"), name="head")
    return head(last_hidden.astype(jnp.float32))


class TransformerForecaster(nn.Module):
  """``Encoder`` over the projected window; then the horizon-query ``Decoder`` (``transformer``) or pooling
  and a linear head (``transformer_encoder``).

  Parameters: ``input_projection`` ``[num_input_channels, d_model]`` with bias, ``encoder`` (as ``Encoder``'s,
  less the token table); ``transformer``: ``horizon_queries`` ``[num_horizons, d_model]``, ``decoder`` (its
  ``logits`` layer ``[d_model, 1]`` is the head); ``transformer_encoder``: ``head`` ``[d_model, num_horizons]``.
  """
  config: ForecasterConfig

  @nn.compact
  def __call__(self, inputs):
    """``[batch, input_length, num_features]`` -> ``[batch, num_horizons]`` float32."""
    config = self.config
    inputs = _read_features(config, inputs)
    model_config = config.transformer_config()
    batch = inputs.shape[0]
    window_valid = jnp.ones((batch, config.input_length), bool)  # [batch, input_length]: no padding
    # Default Dense init: unit-variance features give unit-scale projections, the scale of the positions.
    projection = nn.Dense(config.d_model, **dense_axes("features", "embed"), name="input_projection")
    encoded = Encoder(model_config, projection, name="encoder")(inputs, valid=window_valid)  # [b, L, d_model]
    if config.architecture == "transformer_encoder":
      pooled = encoded[:, -1] if config.pooling == "last" else jnp.mean(encoded, axis=1)  # [batch, d_model]
      pooled = module_dropout(self, pooled, config.dropout_rate)
      return nn.Dense(config.num_horizons, **dense_axes("embed", "outputs"), name="head")(pooled.astype(jnp.float32))
    queries = nn.Embed(config.num_horizons, config.d_model, **embed_axes("outputs", nn.initializers.normal(1.0)),
                       name="horizon_queries")
    horizons = jnp.broadcast_to(jnp.arange(config.num_horizons), (batch, config.num_horizons))
    values = Decoder(model_config, queries, name="decoder")(horizons, None, encoded, window_valid)
    return values[..., 0]  # [batch, num_horizons, 1] -> [batch, num_horizons]


class PatchTSTForecaster(nn.Module):
  """PatchTST (Nie et al. 2023): per channel RevIN and patches as tokens, a shared ``Encoder``, every channel's
  patch states flattened into one linear head to the target's horizons, the target's scale put back.

  Parameters: ``patch_embedding`` ``[patch_length, d_model]`` with bias, ``encoder`` (as ``Encoder``'s, with a
  learned position table under ``positional_encoding="learned"``), ``head`` ``[num_input_channels * num_patches *
  d_model, num_horizons]`` with bias (channel-major rows; one channel, as published: ``[num_patches * d_model,
  num_horizons]``).
  """
  config: ForecasterConfig

  @nn.compact
  def __call__(self, inputs):
    """``[batch, input_length, num_features]`` -> ``[batch, num_horizons]`` float32."""
    config = self.config
    series = _read_features(config, inputs).astype(jnp.float32)  # [batch, input_length, channels]
    normalized, mean, std = instance_normalize(series)  # mean, std: [batch, 1, channels]
    batch, _, channels = series.shape
    # Channel independence: each channel's window is its own token sequence, through the same weights.
    per_channel = jnp.swapaxes(normalized, 1, 2).reshape(batch * channels, config.input_length)
    tokens = patches(per_channel, config.patch_length, config.patch_stride)  # [batch * channels, patches, patch_len]
    num_patches = tokens.shape[1]
    patch_embedding = nn.Dense(config.d_model, **dense_axes("features", "embed"), name="patch_embedding")
    encoded = Encoder(config.transformer_config(), patch_embedding, name="encoder")(
        tokens, valid=jnp.ones((batch * channels, num_patches), bool))
    # [batch * channels, patches, d_model] -> [batch, channels * patches * d_model]; the paper's head has no
    # dropout of its own.
    flat = encoded.reshape(batch, -1).astype(jnp.float32)
    head = nn.Dense(config.num_horizons, **dense_axes("window", "outputs"), name="head")
    forecast = head(flat)  # [batch, num_horizons], normalised units
    target = slice(TARGET_FEATURE, TARGET_FEATURE + 1)  # [batch, 1] below: the target's window scale
    return forecast * std[:, 0, target] + mean[:, 0, target]


class DLinearForecaster(nn.Module):
  """DLinear (Zeng et al. 2023): each channel's moving-average trend and rest, a linear map over the windows of
  all channels from each, summed (one channel, as published: the target's own history).

  Parameters: ``trend`` and ``seasonal``, each ``[num_input_channels * input_length, num_horizons]`` with bias
  (channel-major rows: channel ``c``'s map to the target's horizons is rows ``c * input_length`` on).
  """
  config: ForecasterConfig

  @nn.compact
  def __call__(self, inputs):
    """``[batch, input_length, num_features]`` -> ``[batch, num_horizons]`` float32."""
    config = self.config
    series = _read_features(config, inputs).astype(jnp.float32)  # [batch, input_length, channels]
    seasonal, trend = series_decomposition(series, config.moving_average)

    def by_channel(x):  # [batch, input_length, channels] -> [batch, channels * input_length]
      return jnp.swapaxes(x, 1, 2).reshape(x.shape[0], -1)

    # Each horizon its own row of the published model's [input_length -> longest horizon] map; several
    # channels' maps summed is one map over their concatenated windows.
    return (nn.Dense(config.num_horizons, **dense_axes("window", "outputs"), name="seasonal")(by_channel(seasonal))
            + nn.Dense(config.num_horizons, **dense_axes("window", "outputs"), name="trend")(by_channel(trend)))


def make_forecaster(config: ForecasterConfig) -> nn.Module:
  """The forecaster of ``config.architecture``: ``apply({"params": p}, inputs) -> [batch, num_horizons]``."""
  if config.architecture in RECURRENT_CELLS:
    return RecurrentForecaster(config)
  if config.architecture == "patchtst":
    return PatchTSTForecaster(config)
  if config.architecture == "dlinear":
    return DLinearForecaster(config)
  return TransformerForecaster(config)
