"""The model configurations: frozen dataclasses, validated when built (``ConfigError`` naming the fix); and the model
FLOPs a configuration costs per step (``transformer_flops``, the numerator of MFU)."""
from __future__ import annotations

import dataclasses
import difflib
import functools

import jax.numpy as jnp

from transformer.effects import Effect, setting
from transformer.errors import ConfigError
from transformer.ops.kernels import KERNEL_SETTINGS, Kernels, select_kernels

POSITIONAL_ENCODINGS = ("sinusoidal", "learned", "rotary", "none")
NORMS = ("layer_norm", "rms_norm", "batch_norm")  # batch_norm: this batch's statistics (ops.batch_norm)
NORM_POSITIONS = ("post", "pre")
ACTIVATIONS = ("relu", "gelu", "gelu_exact")  # "gelu": tanh approximation; "gelu_exact": erf (BERT)
ATTENTION_IMPLEMENTATIONS = ("dense", "chunked")
POOLINGS = ("mean", "first")
DTYPES = ("float32", "bfloat16")
# What a training layer keeps for its backward pass (jax.checkpoint): "none" every activation; "dots" only the
# outputs of matmuls without batch dimensions (the projections and feed-forward; attention scores and
# elementwise ops are recomputed: t5x's and MaxText's usual policy); "full" only the layer's inputs.
REMAT_POLICIES = ("none", "dots", "full")


def check_field_types(cls, values, prefix: str) -> None:
  """Raise a ``ConfigError`` naming the first of ``values`` (field -> value, for the dataclass ``cls``) whose type is
  not its default's (an int is a float too, a list a tuple; fields defaulting to None take anything): a config
  written in Python can hold any value, and a string where a number belongs would otherwise fail deep inside a
  comparison or a traced step."""
  defaults = {field.name: field.default for field in dataclasses.fields(cls)}
  for name, value in values.items():
    default = defaults.get(name)
    if default is None or default is dataclasses.MISSING:
      continue
    allowed = {float: (int, float), tuple: (tuple, list)}.get(type(default), (type(default),))
    if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value, allowed):
      raise ConfigError(f"{prefix}.{name}={value!r} must be of type {type(default).__name__}, as its default "
                        f"{default!r} is.")


class ValidatedConfig:
  """Shared behaviour of the frozen configs (model, task, optimizer): ``replace`` and ``from_dict`` reject unknown
  fields with a "did you mean" hint, ``from_dict`` values of the wrong type, and ``check_*`` helpers word every
  error the same way (field, bad value, fix)."""

  @classmethod
  def field_names(cls) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(cls))

  @classmethod
  def unknown_field_message(cls, name: str) -> str:
    close = difflib.get_close_matches(name, cls.field_names(), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else f" Valid fields: {', '.join(cls.field_names())}."
    return f"{cls.__name__} has no field {name!r}.{hint}"

  def replace(self, **changes):
    unknown = [name for name in changes if name not in self.field_names()]
    if unknown:
      raise ConfigError(self.unknown_field_message(unknown[0]))
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_dict(cls, values):
    """Build from a mapping (e.g. an ``ml_collections.ConfigDict``), rejecting unknown keys."""
    values = dict(values)
    unknown = [name for name in values if name not in cls.field_names()]
    if unknown:
      raise ConfigError(cls.unknown_field_message(unknown[0]))
    check_field_types(cls, values, cls.__name__)
    return cls(**values)

  def check_choice(self, name: str, allowed) -> None:
    value = getattr(self, name)
    if value not in allowed:
      raise ConfigError(f"{type(self).__name__}.{name}={value!r} is not supported; choose one of {list(allowed)}.")

  def check_positive_int(self, name: str, or_none: bool = False) -> None:
    value = getattr(self, name)
    if or_none and value is None:
      return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      allowed = "a positive integer or None" if or_none else "a positive integer"
      raise ConfigError(f"{type(self).__name__}.{name} must be {allowed}, got {value!r}.")

  def check_rate(self, name: str) -> None:
    value = getattr(self, name)
    if not 0.0 <= value < 1.0:
      raise ConfigError(f"{type(self).__name__}.{name}={value} is outside [0, 1); use 0.0 to disable dropout.")


class ModelSettings(ValidatedConfig):
  """What the model configs share beyond validation (task configs need none of it): the compute dtype, the ops
  implementations, and the output vocabulary of the sequence models."""

  @functools.cached_property
  def resolved_kernels(self) -> Kernels:
    """The ops implementations of this config (its ``kernels`` setting on the current platform, and chunked
    attention where ``attention_implementation`` asks for it), resolved once and passed to every op."""
    chunked = getattr(self, "attention_implementation", "dense") == "chunked"
    return select_kernels(self.kernels, attention_chunk_size=self.attention_chunk_size if chunked else None)

  @property
  def output_vocab_size(self) -> int:
    return self.vocab_size if self.target_vocab_size is None else self.target_vocab_size

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)


@dataclasses.dataclass(frozen=True)
class ModelConfig(ModelSettings):
  """Hyper-parameters of every Transformer model in ``transformer.nn``.

  Defaults are the paper's base model (Vaswani et al. 2017, table 3). Switch to inference with
  ``config.replace(deterministic=True)`` and to cached autoregressive decoding with ``decode=True``.
  """
  vocab_size: int = 32000  # source vocabulary (the shared one when share_embeddings)
  target_vocab_size: int | None = None  # None: same as vocab_size
  share_embeddings: bool = True  # one embedding table for source and target (needs equal vocabularies)
  tie_output_embedding: bool = True  # output logits = decoder states @ target embedding^T
  d_model: int = 512  # residual stream width
  num_heads: int = 8  # attention heads; must divide d_model
  # Key/value heads, dividing num_heads: None = num_heads; fewer share each among a group of query heads
  # (grouped-query attention; 1 = multi-query), shrinking the key/value projections and the decode cache.
  num_kv_heads: int | None = None
  d_ff: int = 2048  # hidden width of the position-wise feed-forward network
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  dropout_rate: float = 0.1  # on embeddings + positions and on every sublayer output (P_drop)
  attention_dropout_rate: float = 0.1  # on attention weights
  feed_forward_dropout_rate: float = 0.0  # on the feed-forward hidden layer
  max_length: int = 512  # longest sequence (learned position table size and decode cache length)
  positional_encoding: str = "sinusoidal"  # one of POSITIONAL_ENCODINGS
  scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model) (paper section 3.4)
  num_token_types: int = 0  # rows of a learned token-type (segment) table added to the embeddings (BERT: 2)
  embedding_norm: bool = False  # a Norm on embeddings + positions (+ token types) before dropout (BERT)
  scale_attention: bool = True  # divide q.k by sqrt(d_k) (paper eq. 1); False for the ablation
  norm: str = "layer_norm"  # one of NORMS
  norm_position: str = "post"  # "post" (paper: LN(x + sublayer(x))) or "pre" (x + sublayer(LN(x)))
  norm_epsilon: float = 1e-6
  activation: str = "relu"  # feed-forward activation, one of ACTIVATIONS
  # "dense" or "chunked": memory-efficient blocks where no dropout, weights or decode-cache mask is needed
  # (ops.attend; the dense path elsewhere); equal to dense to float rounding, its logits always float32
  attention_implementation: str = "dense"
  attention_chunk_size: int = 512  # block size of the chunked implementation
  # None: every position; an int w: self attention sees keys less than w positions away (with causal masking,
  # itself and the w - 1 before it: a sliding window). Cross attention always sees the whole source.
  attention_window: int | None = None
  # False: dense attention's logits and softmax in the compute dtype (flax's stock behaviour), faster in
  # bfloat16 and less accurate; the chunked implementation always uses float32.
  float32_attention_logits: bool = True
  dtype: str = "float32"  # compute dtype; parameters stay float32
  # per-layer rematerialisation when training, one of REMAT_POLICIES: memory for compute
  remat: str = setting("none", Effect.LAYOUT)
  # True: each stack of layers is one nn.scan over stacked parameters (leading "layers" axis), compiled once
  # instead of once per layer; checkpoints keep the per-layer layout, so a run saved either way loads either way
  scan_layers: bool = setting(False, Effect.LAYOUT)
  # "auto": backend-tuned ops for the platform (transformer/ops/kernels.py); "reference": the formulas
  kernels: str = "auto"
  pad_id: int = 0
  bos_id: int = 1
  eos_id: int = 2
  deterministic: bool = False  # True disables dropout (eval and inference)
  decode: bool = False  # True: one token per call with a key/value cache

  def __post_init__(self):
    for name, allowed in (("positional_encoding", POSITIONAL_ENCODINGS), ("norm", NORMS),
                          ("norm_position", NORM_POSITIONS), ("activation", ACTIVATIONS),
                          ("attention_implementation", ATTENTION_IMPLEMENTATIONS), ("dtype", DTYPES),
                          ("kernels", KERNEL_SETTINGS), ("remat", REMAT_POLICIES)):
      self.check_choice(name, allowed)
    for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_length", "attention_chunk_size"):
      self.check_positive_int(name)
    for name in ("target_vocab_size", "num_kv_heads", "attention_window"):
      self.check_positive_int(name, or_none=True)
    config_name = type(self).__name__  # ModelConfig, or a subclass such as ClassifierConfig
    for name in ("num_encoder_layers", "num_decoder_layers", "num_token_types"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
        raise ConfigError(f"{config_name}.{name} must be a non-negative integer, got {getattr(self, name)!r}.")
    if self.d_model % self.num_heads:
      divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
      raise ConfigError(f"{config_name}.num_heads={self.num_heads} does not divide d_model={self.d_model}; "
                        f"choose num_heads from {divisors} or change d_model.")
    if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
      divisors = [h for h in range(1, self.num_heads + 1) if self.num_heads % h == 0]
      raise ConfigError(f"{config_name}.num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads}; "
                        f"choose num_kv_heads from {divisors} (or None for one per query head).")
    for name in ("dropout_rate", "attention_dropout_rate", "feed_forward_dropout_rate"):
      self.check_rate(name)
    if self.positional_encoding == "rotary" and self.head_dim % 2:
      raise ConfigError(f"{config_name}.positional_encoding='rotary' needs an even head_dim "
                        f"(d_model / num_heads), got {self.head_dim}.")
    if self.share_embeddings and self.target_vocab_size not in (None, self.vocab_size):
      raise ConfigError(f"{config_name}.share_embeddings=True needs target_vocab_size == vocab_size "
                        f"({self.target_vocab_size} != {self.vocab_size}); set share_embeddings=False or "
                        f"target_vocab_size=None.")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def kv_heads(self) -> int:
    """Key/value heads: ``num_kv_heads``, or ``num_heads`` when that is None."""
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


@dataclasses.dataclass(frozen=True)
class ClassifierConfig(ModelConfig):
  """Hyper-parameters of ``EncoderClassifier``: a Transformer encoder's fields plus the classifier head's."""
  num_classes: int = 2  # classifier outputs
  pooling: str = "mean"  # how encoder states become one vector, one of POOLINGS

  @classmethod
  def from_encoder(cls, encoder_config: ModelConfig, **changes) -> "ClassifierConfig":
    """A classifier over the encoder that ``encoder_config`` describes (e.g. one from ``transformer.pretrained``)."""
    return cls(**{**{f.name: getattr(encoder_config, f.name) for f in dataclasses.fields(encoder_config)}, **changes})

  def __post_init__(self):
    super().__post_init__()
    self.check_choice("pooling", POOLINGS)
    self.check_positive_int("num_classes")


def transformer_flops(config, batch_size: int, source_length: int, target_length: int,
                      train: bool = True) -> dict[str, float]:
  """Model FLOPs of one step of a Transformer, split into ``parameters`` and ``attention`` (and ``total``).

  ``config`` has the fields of ``transformer.nn.ModelConfig`` used here (``d_model``, ``d_ff``,
  ``num_encoder_layers``, ``num_decoder_layers``, ``output_vocab_size``). The encoder-decoder reads
  ``[batch_size, source_length]`` and predicts ``[batch_size, target_length]``; ``source_length`` 0 is a
  decoder-only language model (no encoder, no cross-attention), ``target_length`` 0 an encoder alone (a
  classifier, whose pooled head is not counted: one ``d_model x classes`` product per example).

  Convention (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, appendix B): only matmuls count, 2 FLOPs per
  multiply-add; a training step is 3x the forward pass (the backward pass computes the gradients of both the
  inputs and the weights, 2x forward). Hence "6 * parameters * tokens plus attention":

  - ``parameters``: ``6 * N * D`` with every weight matrix counted for the tokens it multiplies: encoder
    matrices for source tokens, decoder self-attention, cross-attention query/output and feed-forward for
    target tokens, cross-attention key/value for source tokens (once per decoder layer), and the (tied)
    output projection ``d_model x vocab`` for target tokens. Embedding lookups, biases, norms, the softmax,
    the loss and the optimizer update are not counted (they are not matmuls).
  - ``attention``: ``q k^T`` and ``weights v``, ``2 * 2 * q_length * kv_length * d_model`` forward per layer
    and example (``heads * head_dim = d_model``), times 3. Causal self attention is counted in full, as the
    dense kernel computes the whole matrix (PaLM halves nothing either).

  Dropout, padding and recomputation (remat) are ignored: this is *model* FLOPs, the numerator of MFU.
  """
  d, f = config.d_model, config.d_ff
  source, target = source_length, target_length
  cross = source > 0  # a decoder with an encoder to attend to
  encoder_parameters = config.num_encoder_layers * (4 * d * d + 2 * d * f) * source
  decoder_parameters = config.num_decoder_layers * (
      (4 * d * d + 2 * d * f) * target + cross * (2 * d * d * target + 2 * d * d * source)) if target else 0
  output_projection = d * config.output_vocab_size * target
  encoder_attention = config.num_encoder_layers * 2 * source * source * d
  decoder_attention = config.num_decoder_layers * 2 * (target * target + cross * target * source) * d
  multiplier = 6.0 if train else 2.0  # 2 FLOPs per multiply-add, x3 for forward + backward
  parameters = multiplier * batch_size * (encoder_parameters + decoder_parameters + output_projection)
  attention = multiplier * batch_size * (encoder_attention + decoder_attention)
  return {"parameters": parameters, "attention": attention, "total": parameters + attention}
