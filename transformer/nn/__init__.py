"""Flax linen modules: thin compositions of ``transformer.ops`` that own parameters and caches.

``MODELS`` is the one registry of models: ``config.model_name`` -> the model's hyper-parameter dataclass (whose
fields ``config.model`` holds) and its Flax module.
"""
from __future__ import annotations

import difflib
from typing import NamedTuple

from transformer.errors import ConfigError
from transformer.nn.attention import CROSS_CACHE, MultiHeadAttention
from transformer.nn.config import ClassifierConfig, ModelConfig
from transformer.nn.forecasters import ForecasterConfig, RecurrentForecaster, TransformerForecaster, make_forecaster
from transformer.nn.layers import DecoderLayer, EncoderLayer, FeedForward, Norm, PositionalEncoding
from transformer.nn.models import (Decoder, Encoder, EncoderClassifier, EncoderDecoder, TransformerLM,
                                   cross_attention_cache)
from transformer.nn.rnn import RNNConfig, RNNEncoderDecoder


class ModelSpec(NamedTuple):
  config: type  # the frozen hyper-parameter dataclass (``ModelConfig``, ``RNNConfig``, ...)
  module: type  # builds the Flax module from it: ``module(config)``


MODELS = {
    "transformer": ModelSpec(ModelConfig, EncoderDecoder),  # Vaswani et al. 2017
    "rnn": ModelSpec(RNNConfig, RNNEncoderDecoder),  # GRU/LSTM encoder-decoder with Bahdanau or Luong attention
    "encoder_classifier": ModelSpec(ClassifierConfig, EncoderClassifier),  # Transformer encoder + pooled head
    "forecaster": ModelSpec(ForecasterConfig, make_forecaster),  # time series: RNN/LSTM/GRU or Transformer
    "lm": ModelSpec(ModelConfig, TransformerLM),  # decoder-only language model (the encoder fields unused)
}


def model_spec(name: str) -> ModelSpec:
  """The registry entry of ``config.model_name``; an unknown name is a ``ConfigError`` with a suggestion."""
  if name not in MODELS:
    close = difflib.get_close_matches(str(name), MODELS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"config.model_name={name!r} is not a known model; choose one of {list(MODELS)}.{hint}")
  return MODELS[name]


__all__ = ["CROSS_CACHE", "MODELS", "ClassifierConfig", "ModelSpec", "MultiHeadAttention", "ModelConfig",
           "DecoderLayer", "EncoderLayer", "FeedForward", "Norm", "PositionalEncoding", "Decoder", "Encoder",
           "EncoderClassifier", "EncoderDecoder", "TransformerLM", "RNNConfig", "RNNEncoderDecoder",
           "cross_attention_cache", "model_spec", "ForecasterConfig", "RecurrentForecaster", "TransformerForecaster",
           "make_forecaster"]
