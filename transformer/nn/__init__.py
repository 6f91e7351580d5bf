"""Flax linen modules: thin compositions of ``transformer.ops`` that own parameters and caches.

``MODELS`` is the one registry of models: ``config.model_name`` -> the model's hyper-parameter dataclass (whose
fields ``config.model`` holds) and its Flax module. The package's names import their module on first use, so a
run of one model family does not import the others.

Every parameter carries logical axis names (``transformer.nn.axes``): ``model.init`` returns them boxed, as flax's
logical partitioning does; ``model.apply`` takes the parameters boxed or plain, and ``unboxed`` gives the arrays.
"""
from __future__ import annotations

import difflib
import importlib
from typing import NamedTuple

from transformer.errors import ConfigError
from transformer import lazy_exports

# submodule -> the names it exports here, imported on first use
__getattr__, __dir__, _EXPORTED = lazy_exports(__name__, {
    "attention": ("CROSS_CACHE", "MultiHeadAttention"),
    "axes": ("ACTIVATION_AXES", "LOGICAL_AXES", "split_rows", "unboxed", "with_activation_axes", "with_axes"),
    "config": ("ClassifierConfig", "ModelConfig", "transformer_flops"),
    "forecasters": ("ForecasterConfig", "RecurrentForecaster", "TransformerForecaster", "make_forecaster"),
    "layers": ("DecoderLayer", "EncoderLayer", "FeedForward", "Norm", "PositionalEncoding"),
    "models": ("Decoder", "Encoder", "EncoderClassifier", "EncoderDecoder", "TransformerLM", "cross_attention_cache",
               "stack_layers", "unstack_layers"),
    "rnn": ("RNNConfig", "RNNEncoderDecoder"),
})


class ModelSpec(NamedTuple):
  """A registry entry: where the model's frozen hyper-parameter dataclass (``ModelConfig``, ``RNNConfig``, ...)
  and what builds its Flax module from it (``module(config)``) live, as ``"submodule:Name"`` under
  ``transformer.nn``; each is imported when first asked for."""
  config_path: str
  module_path: str

  @property
  def config(self) -> type:
    return _named(self.config_path)

  @property
  def module(self):
    return _named(self.module_path)


def _named(path: str):
  submodule, name = path.split(":")
  return getattr(importlib.import_module(f"{__name__}.{submodule}"), name)


MODELS = {
    "transformer": ModelSpec("config:ModelConfig", "models:EncoderDecoder"),  # Vaswani et al. 2017
    # GRU/LSTM encoder-decoder with Bahdanau or Luong attention
    "rnn": ModelSpec("rnn:RNNConfig", "rnn:RNNEncoderDecoder"),
    "encoder_classifier": ModelSpec("config:ClassifierConfig", "models:EncoderClassifier"),  # encoder + pooled head
    "forecaster": ModelSpec("forecasters:ForecasterConfig", "forecasters:make_forecaster"),  # RNN or Transformer
    "lm": ModelSpec("config:ModelConfig", "models:TransformerLM"),  # decoder-only LM (the encoder fields unused)
}


def model_spec(name: str) -> ModelSpec:
  """The registry entry of ``config.model_name``; an unknown name is a ``ConfigError`` with a suggestion."""
  if name not in MODELS:
    close = difflib.get_close_matches(str(name), MODELS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"config.model_name={name!r} is not a known model; choose one of {list(MODELS)}.{hint}")
  return MODELS[name]


__all__ = sorted([*_EXPORTED, "MODELS", "ModelSpec", "model_spec"])
