"""Flax linen modules: thin compositions of ``transformer.ops`` that own parameters and caches."""
from transformer.nn.attention import CROSS_CACHE, MultiHeadAttention
from transformer.nn.config import ModelConfig
from transformer.nn.forecasters import ForecasterConfig, RecurrentForecaster, TransformerForecaster, make_forecaster
from transformer.nn.layers import DecoderLayer, EncoderLayer, FeedForward, Norm, PositionalEncoding
from transformer.nn.models import (Decoder, Encoder, EncoderClassifier, EncoderDecoder, TransformerLM,
                                   cross_attention_cache)
from transformer.nn.rnn import RNNConfig, RNNEncoderDecoder

__all__ = ["CROSS_CACHE", "MultiHeadAttention", "ModelConfig", "DecoderLayer", "EncoderLayer", "FeedForward", "Norm",
           "PositionalEncoding", "Decoder", "Encoder", "EncoderClassifier", "EncoderDecoder", "TransformerLM",
           "RNNConfig", "RNNEncoderDecoder", "cross_attention_cache"]
