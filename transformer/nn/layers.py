"""Transformer layers: dense (output layers), norms, feed-forward, positions, residual sublayers, encoder and decoder
layers."""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp

from transformer import ops
from transformer.errors import ConfigError
from transformer.nn.attention import MultiHeadAttention
from transformer.nn.axes import BATCH_LENGTH, with_activation_axes, with_axes
from transformer.nn.config import ModelConfig


def module_dropout(module: nn.Module, x, rate: float):
  """``ops.dropout`` with the module's ``dropout`` key and ``config.kernels``; identity when the config is
  deterministic."""
  if module.config.deterministic or rate == 0.0:
    return x
  return ops.dropout(x, rate, module.make_rng("dropout"), kernels=module.config.resolved_kernels)


class Dense(nn.Module):
  """``nn.Dense`` (the same parameters, names and initialisation) computed by ``ops.dense``: one 2-D matmul over
  the flattened leading axes, ``[..., features_in] -> [..., features]``.

  Why: with a 3-D input, XLA:CPU computes ``nn.Dense``'s weight gradient from a transposed copy of the
  ``[..., features]`` cotangent; under ``jax.vmap`` (seeds in one program) that copy of the vocabulary logits'
  gradient was the costliest op of a step (benchmarks/FINDINGS.md#why-these-kernels).
  """
  features: int
  axes: tuple[str, str]  # the kernel's logical axis names, in and out (transformer.nn.LOGICAL_AXES)
  use_bias: bool = True
  dtype: Any = None  # compute dtype (None: that of the input and parameters); parameters stay float32

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", with_axes(nn.linear.default_kernel_init, *self.axes), (x.shape[-1], self.features))
    bias = (self.param("bias", with_axes(nn.initializers.zeros_init(), self.axes[1]), (self.features,))
            if self.use_bias else None)
    dtype = self.dtype or jnp.result_type(x, kernel)
    return ops.dense(x.astype(dtype), kernel.astype(dtype), None if bias is None else bias.astype(dtype))


class Norm(nn.Module):
  """LayerNorm, RMSNorm or BatchNorm (``config.norm``) with a learned gain (and bias for LN and BN).

  LayerNorm and RMSNorm normalise each position over its features; BatchNorm each feature over the batch's
  ``valid`` positions, with this batch's statistics also at evaluation (``ops.batch_norm``: no running averages).
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x, valid=None):
    """``x``: ``[batch, length, features]``; ``valid``: ``[batch, length]`` bool, used by BatchNorm only."""
    features = x.shape[-1]
    kernels = self.config.resolved_kernels
    scale = self.param("scale", with_axes(nn.initializers.ones, "embed"), (features,))
    if self.config.norm == "rms_norm":
      return ops.rms_norm(x, scale, epsilon=self.config.norm_epsilon, kernels=kernels)
    bias = self.param("bias", with_axes(nn.initializers.zeros, "embed"), (features,))
    if self.config.norm == "batch_norm":
      return ops.batch_norm(x, scale, bias, valid, epsilon=self.config.norm_epsilon, kernels=kernels)
    return ops.layer_norm(x, scale, bias, epsilon=self.config.norm_epsilon, kernels=kernels)


class FeedForward(nn.Module):
  """Position-wise feed-forward network, ``act(x W_1 + b_1) W_2 + b_2`` (paper eq. 2)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x):
    """``[batch, length, d_model] -> [batch, length, d_model]``."""
    config = self.config
    dtype = config.compute_dtype
    init = nn.initializers.xavier_uniform()
    kernel_in = self.param("kernel_in", with_axes(init, "embed", "mlp"), (config.d_model, config.d_ff))
    bias_in = self.param("bias_in", with_axes(nn.initializers.zeros, "mlp"), (config.d_ff,))
    kernel_out = self.param("kernel_out", with_axes(init, "mlp", "embed"), (config.d_ff, config.d_model))
    bias_out = self.param("bias_out", with_axes(nn.initializers.zeros, "embed"), (config.d_model,))
    rate = 0.0 if config.deterministic else config.feed_forward_dropout_rate
    return ops.feed_forward(
        x.astype(dtype), kernel_in.astype(dtype), bias_in.astype(dtype), kernel_out.astype(dtype),
        bias_out.astype(dtype), activation=config.activation, dropout_rate=rate,
        dropout_rng=self.make_rng("dropout") if rate > 0.0 else None, kernels=config.resolved_kernels,
        constrain_hidden=lambda hidden: with_activation_axes(hidden, *BATCH_LENGTH, "activation_mlp"))


class PositionalEncoding(nn.Module):
  """Adds sinusoidal or learned position information to ``[batch, length, d_model]`` embeddings.

  "rotary" is applied inside attention and "none" adds nothing (both return the input). With
  ``config.decode`` each example's next position is kept in the ``cache`` collection (``position``
  ``[batch]``) and advances by its number of ``valid`` positions, so a prompt of any length per example can
  be read in one call.
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x, valid=None, segments=None):
    """``x`` ``[batch, length, d_model]``; ``valid`` ``[batch, length]`` bool, read only when decoding: each
    row's real positions, first (default: all); ``segments`` ``[batch, length]`` int, packed rows: positions
    restart at each segment."""
    config = self.config
    if config.positional_encoding in ("rotary", "none"):
      return x
    length = x.shape[1]
    if config.positional_encoding == "learned" and length > config.max_length:  # indexing would clamp silently
      raise ConfigError(f"a sequence of {length} positions is longer than the learned position table "
                        f"(config.model.max_length={config.max_length}); raise max_length or shorten the inputs.")
    positions = jnp.arange(length, dtype=jnp.int32)[None]  # [1, length]
    if segments is not None:
      positions = ops.segment_positions(segments)  # [batch, length]
    if config.decode:
      initialized = self.has_variable("cache", "position")
      position = self.variable("cache", "position", jnp.zeros, x.shape[:1], jnp.int32)
      if initialized:
        positions = position.value[:, None] + positions  # [batch, length]
        written = length if valid is None else jnp.sum(valid, axis=1)
        position.value = (position.value + written).astype(jnp.int32)
    if config.positional_encoding == "sinusoidal":
      encoding = ops.sinusoidal_position_encoding(positions, config.d_model)
    else:
      table = self.param("position_table", with_axes(nn.initializers.normal(stddev=0.02), "position", "embed"),
                         (config.max_length, config.d_model))
      encoding = table[positions]
    return x + encoding.astype(x.dtype)


def residual_stream(x):
  """``x`` ``[batch, length, d_model]`` laid out as the residual stream between sublayers: split by batch, each
  position's width whole (``with_activation_axes``)."""
  return with_activation_axes(x, *BATCH_LENGTH, "activation_embed")


def residual(module: nn.Module, x, sublayer: Callable, norm: Norm, valid=None):
  """One residual sublayer: post-LN ``LN(x + Dropout(f(x)))`` (paper) or pre-LN ``x + Dropout(f(LN(x)))``;
  ``valid`` (``[batch, length]`` bool) goes to the norm (BatchNorm's statistics skip padding)."""
  rate = module.config.dropout_rate
  if module.config.norm_position == "pre":
    return residual_stream(x + module_dropout(module, sublayer(norm(x, valid)), rate))
  return residual_stream(norm(x + module_dropout(module, sublayer(x), rate), valid))


class EncoderLayer(nn.Module):
  """Self attention then feed-forward, each in a residual sublayer (paper section 3.1)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, valid, segments=None):
    """``x``: ``[batch, length, d_model]``; ``valid``: ``[batch, length]`` bool; ``segments``: ``[batch, length]``
    int, packed rows (attention stays within each). Returns ``x``'s shape."""
    attention = MultiHeadAttention(self.config, name="self_attention")
    x = residual(self, x, lambda h: attention(h, h, valid, valid, query_segments=segments, key_segments=segments),
                 Norm(self.config, name="attention_norm"), valid)
    return residual(self, x, FeedForward(self.config, name="feed_forward"),
                    Norm(self.config, name="feed_forward_norm"), valid)


class DecoderLayer(nn.Module):
  """Masked self attention, cross attention over the encoder output (if given), then feed-forward."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, valid, encoded=None, encoded_valid=None, segments=None, encoded_segments=None):
    """Decoder layer.

    Args:
      x: ``[batch, target_length, d_model]``.
      valid: ``[batch, target_length]`` bool.
      encoded: ``[batch, source_length, d_model]`` encoder output, or None (decoder-only model).
      encoded_valid: ``[batch, source_length]`` bool.
      segments, encoded_segments: packed rows: ``[batch, target_length]`` and ``[batch, source_length]`` int
        segment ids; each target segment attends within itself and to the source segment of the same id.

    Returns:
      ``[batch, target_length, d_model]``.
    """
    config = self.config
    self_attention = MultiHeadAttention(config, name="self_attention")
    x = residual(self, x, lambda h: self_attention(h, h, valid, valid, causal=True, query_segments=segments,
                                                   key_segments=segments),
                 Norm(config, name="self_attention_norm"), valid)
    if encoded is not None:
      cross_attention = MultiHeadAttention(config, cross_attention=True, name="cross_attention")
      x = residual(self, x, lambda h: cross_attention(h, encoded, valid, encoded_valid, query_segments=segments,
                                                      key_segments=encoded_segments),
                   Norm(config, name="cross_attention_norm"), valid)
    return residual(self, x, FeedForward(config, name="feed_forward"), Norm(config, name="feed_forward_norm"),
                    valid)
