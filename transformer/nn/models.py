"""Transformer models: encoder, decoder, encoder-decoder, decoder-only LM, encoder classifier."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer import ops
from transformer.nn.attention import CROSS_CACHE
from transformer.nn.axes import BATCH_LENGTH, dense_axes, embed_axes, with_activation_axes
from transformer.nn.config import ClassifierConfig, ModelConfig
from transformer.nn.layers import (Dense, DecoderLayer, EncoderLayer, Norm, PositionalEncoding, module_dropout,
                                    residual_stream)


def make_embedding(config: ModelConfig, vocab_size: int, name: str) -> nn.Embed:
  # std 1/sqrt(d_model): unit scale after the sqrt(d_model) multiplication, and well-scaled logits
  # when the table doubles as the output projection.
  return nn.Embed(vocab_size, config.d_model, **embed_axes("vocab", nn.initializers.normal(config.d_model ** -0.5)),
                  name=name)


def training_layer(layer: type[nn.Module], config: ModelConfig, **remat_options) -> type[nn.Module]:
  """``layer`` (``EncoderLayer`` or ``DecoderLayer``) rematerialised as ``config.remat`` asks: in the backward
  pass it recomputes what the policy does not keep. Only when training: evaluation and decoding have no backward
  pass. The parameters' names and values are the same under every policy."""
  if config.remat == "none" or config.deterministic or config.decode:
    return layer
  policy = None if config.remat == "full" else jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  return nn.remat(layer, policy=policy, **remat_options)


# The scanned stack's module name, and the logical name of its parameters' leading axis (config.scan_layers).
LAYERS = "layers"


def _carrying(layer: type[nn.Module]) -> type[nn.Module]:
  """``layer`` returning ``(x, None)``: the ``(carry, output)`` of a scan body."""
  class Carrying(layer):
    def __call__(self, x, *args):
      return super().__call__(x, *args), None
  Carrying.__name__ = layer.__name__  # the same module names in traces and tabulate
  return Carrying


def apply_layers(layer: type[nn.Module], config: ModelConfig, num_layers: int, x, *args):
  """``x`` ``[batch, length, d_model]`` through ``num_layers`` of ``layer(config)``, each called as
  ``layer(x, *args)`` (the same ``args`` for every layer: masks, segments, the encoder output).

  Unrolled (``config.scan_layers`` False): submodules ``layer_0`` ... ``layer_{n-1}``, each traced and compiled on
  its own. Scanned: one ``nn.scan`` named ``layers`` whose parameters are stacked ``[num_layers, ...]`` (logical
  axis ``"layers"``), traced once; the decode caches stack on axis 1, so their leading axis stays the batch that
  ``transformer.decode`` reorders; sown intermediates stack on axis 0. ``unstack_layers`` and ``stack_layers``
  convert between the two parameter layouts.
  """
  if not config.scan_layers:
    for index in range(num_layers):
      x = training_layer(layer, config)(config, name=f"layer_{index}")(x, *args)
    return x
  if num_layers == 0:
    return x
  body = training_layer(_carrying(layer), config, prevent_cse=False)  # scan already keeps the layers apart
  stack = nn.scan(body, variable_axes={"params": 0, "cache": 1, CROSS_CACHE: 1, "intermediates": 0},
                  split_rngs={"params": True, "dropout": True}, in_axes=(nn.broadcast,) * len(args),
                  length=num_layers, metadata_params={nn.PARTITION_NAME: LAYERS})
  x, _ = stack(config, name=LAYERS)(x, *args)
  return x


def _dict_keys(path) -> tuple[str, ...]:
  return tuple(str(key.key) for key in path if isinstance(key, jax.tree_util.DictKey))


def _map_dicts(on_dict, node, keys: tuple[str, ...] = ()):
  """``node`` with each outermost dict ``d`` below it (itself included) replaced by ``on_dict(d, keys)``, ``keys``
  the dict keys down to ``d`` (other pytree nodes, such as a train state's fields, add none)."""
  if isinstance(node, dict):
    return on_dict(node, keys)
  return jax.tree_util.tree_map_with_path(
      lambda path, child: on_dict(child, keys + _dict_keys(path)) if isinstance(child, dict) else child, node,
      is_leaf=lambda child: isinstance(child, dict))


def _stacks(tree) -> dict[tuple[str, ...], dict]:
  """``{keys down to a dict holding a stack: the stack}`` of every ``LAYERS`` subtree of ``tree``."""
  found = {}

  def visit(node, keys):
    for key, value in node.items():
      if key == LAYERS and isinstance(value, dict):
        found[keys] = value
      else:
        _map_dicts(visit, value, keys + (str(key),))
    return node
  _map_dicts(visit, tree)
  return found


def _layer_of(leaf, index: int, axis: int):
  """Layer ``index`` of a stacked leaf: an array, or a ``jax.ShapeDtypeStruct`` (a restore target) whose
  ``NamedSharding`` loses the axis too."""
  if isinstance(leaf, jax.ShapeDtypeStruct):
    sharding = leaf.sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
      spec = tuple(sharding.spec) + (None,) * (len(leaf.shape) - len(sharding.spec))
      sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec[:axis], *spec[axis + 1:]))
    return jax.ShapeDtypeStruct(leaf.shape[:axis] + leaf.shape[axis + 1:], leaf.dtype, sharding=sharding)
  return leaf[(slice(None),) * axis + (index,)]


def unstack_layers(tree, axis: int = 0):
  """``tree`` (parameters, or any pytree holding parameter-shaped dicts: a train state with its optimizer
  moments, restore targets of ``jax.ShapeDtypeStruct``) with each scanned stack ``{"layers": {... [num_layers,
  ...]}}`` replaced by the unrolled layout ``{"layer_0": {...}, ..., "layer_{n-1}": {...}}``; ``axis``: the layer
  axis of the stacked leaves (1 under a leading replica axis). A tree without stacks comes back unchanged. Pure;
  ``stack_layers`` undoes it."""
  stacks = _stacks(tree)
  if not stacks:
    return tree
  counts = {keys: jax.tree.leaves(stack)[0].shape[axis] for keys, stack in stacks.items() if jax.tree.leaves(stack)}

  def shared_suffix(a, b):
    length = 0
    while length < min(len(a), len(b)) and a[-1 - length] == b[-1 - length]:
      length += 1
    return length

  def count_of(keys):
    # An optimizer state's stack of frozen parameters (optax's masked nodes) has no leaves: the count of the
    # stack whose path ends most like its own (the parameters' "encoder" for the moments' "encoder").
    if keys in counts:
      return counts[keys]
    shared, count = max(((shared_suffix(keys, k), n) for k, n in counts.items()), default=(0, 0))
    return count if shared else 0

  def convert(node, keys):
    out = {}
    for key, value in node.items():
      if key == LAYERS and isinstance(value, dict):
        for index in range(count_of(keys)):
          out[f"layer_{index}"] = jax.tree.map(lambda leaf, i=index: _layer_of(leaf, i, axis), value)
      else:
        out[key] = _map_dicts(convert, value, keys + (str(key),))
    return out
  return _map_dicts(convert, tree)


def stack_layers(tree, like, axis: int = 0):
  """``unstack_layers`` undone: ``tree`` in the unrolled layout, its ``layer_0`` ... ``layer_{n-1}`` stacked
  along ``axis`` into ``"layers"`` wherever ``like`` (the same kind of tree in the wanted layout: the model's
  parameters, a train state, their shapes) holds a stack. Where ``like`` holds none, ``tree`` is unchanged."""
  stacks = set(_stacks(like))
  if not stacks:
    return tree

  def convert(node, keys):
    names = [key for key in node if key.startswith("layer_") and key[len("layer_"):].isdigit()]
    out = {key: _map_dicts(convert, value, keys + (str(key),)) for key, value in node.items()
           if not (keys in stacks and key in names)}
    if keys in stacks and names:
      layers = [node[f"layer_{index}"] for index in range(len(names))]
      out[LAYERS] = jax.tree.map(
          lambda *leaves: (np.stack if isinstance(leaves[0], np.ndarray) else jnp.stack)(leaves, axis=axis), *layers)
    return out
  return _map_dicts(convert, tree)


class Embedder(nn.Module):
  """Token embedding (optionally scaled by sqrt(d_model)), plus positions, plus token types (if
  ``config.num_token_types``), then a Norm (if ``config.embedding_norm``, as BERT), then dropout.

  ``embedding`` is a token table, or any module mapping the inputs to ``[batch, length, d_model]`` (the
  forecasters' ``nn.Dense`` projection of continuous features, ``[batch, length, num_features]``).
  """
  config: ModelConfig
  embedding: nn.Module

  @nn.compact
  def __call__(self, tokens, token_types=None, valid=None, segments=None):
    """``[batch, length]`` int tokens (and token types, default all 0) -> ``[batch, length, d_model]`` in the
    compute dtype; ``valid`` ``[batch, length]`` bool, when decoding: each row's real positions, and
    ``segments`` ``[batch, length]`` int, packed rows (see ``PositionalEncoding``)."""
    config = self.config
    x = self.embedding(tokens).astype(config.compute_dtype)
    if config.scale_embeddings:
      x = ops.scale_embeddings(x, config.d_model)
    x = PositionalEncoding(config, name="positions")(x, valid, segments)
    if config.num_token_types:
      if token_types is None:
        token_types = jnp.zeros_like(tokens)
      table = nn.Embed(config.num_token_types, config.d_model,
                       **embed_axes("token_types", nn.initializers.normal(0.02)),
                       name="token_type_embedding")
      x = x + table(token_types).astype(x.dtype)
    elif token_types is not None:
      raise ValueError("token_types were given but ModelConfig.num_token_types=0; set num_token_types to the "
                       "number of token types (2 for BERT).")
    if config.embedding_norm:
      x = Norm(config, name="embedding_norm")(x)
    return residual_stream(module_dropout(self, x, config.dropout_rate))


class Encoder(nn.Module):
  """A stack of ``EncoderLayer`` over embedded source tokens (paper section 3.1).

  ``embedding``: the token table (default: its own), or any module the ``Embedder`` accepts, e.g. a
  projection of continuous inputs, which then come with their ``valid`` mask.
  """
  config: ModelConfig
  embedding: nn.Module | None = None

  @nn.compact
  def __call__(self, tokens, token_types=None, valid=None, segments=None):
    """``tokens``: ``[batch, source_length]`` int (``pad_id`` = padding), or what ``embedding`` takes;
    ``token_types``: the same shape, BERT's segment ids (only with ``config.num_token_types``; default all 0);
    ``valid``: ``[batch, source_length]`` bool, True at real positions (default: ``tokens != pad_id``);
    ``segments``: ``[batch, source_length]`` int, packed rows: the example of each position (``data.packing``).

    Returns ``[batch, source_length, d_model]``.
    """
    # The source is read whole in one call even when decoding: ``decode`` (one position per call, positions
    # kept in the ``cache``) concerns the decoder only.
    config = self.config.replace(decode=False)
    embedding = self.embedding or make_embedding(config, config.vocab_size, "embedding")
    if valid is None:
      valid = tokens != config.pad_id
    x = Embedder(config, embedding, name="embedder")(tokens, token_types, segments=segments)
    x = apply_layers(EncoderLayer, config, config.num_encoder_layers, x, valid, segments)
    if config.norm_position == "pre":
      x = Norm(config, name="final_norm")(x, valid)
    return x


class Decoder(nn.Module):
  """A stack of ``DecoderLayer`` and the output projection to target-vocabulary logits."""
  config: ModelConfig
  embedding: nn.Embed | None = None

  @nn.compact
  def __call__(self, decoder_inputs, target_valid=None, encoded=None, encoded_valid=None, logits_index=None,
               segments=None, encoded_segments=None):
    """Decode.

    Args:
      decoder_inputs: ``[batch, target_length]`` int, the right-shifted targets (teacher forcing), or, when
        ``config.decode``, the next positions to write into the cache: ``[batch, 1]`` the previous token, or
        a whole prompt (prefill).
      target_valid: ``[batch, target_length]`` bool, True at real target positions (default: all); when
        decoding, each row's real positions come first and only they advance its cache.
      encoded: ``[batch, source_length, d_model]`` or None for a decoder-only model.
      encoded_valid: ``[batch, source_length]`` bool.
      logits_index: ``[]`` int (may be traced): project only this position to the vocabulary, e.g. the
        newest one when a prefix is re-decoded without a cache (the projection is most of a small
        decoder's work). None: every position.
      segments, encoded_segments: packed rows (training): ``[batch, target_length]`` and
        ``[batch, source_length]`` int segment ids (see ``DecoderLayer``).

    Returns:
      ``[batch, target_length, output_vocab_size]`` float32 logits, or ``[batch, 1, output_vocab_size]`` at
      ``logits_index``.
    """
    config = self.config
    embedding = self.embedding or make_embedding(config, config.output_vocab_size, "embedding")
    if target_valid is None:
      target_valid = jnp.ones(decoder_inputs.shape, bool)
    x = Embedder(config, embedding, name="embedder")(decoder_inputs, valid=target_valid, segments=segments)
    x = apply_layers(DecoderLayer, config, config.num_decoder_layers, x, target_valid, encoded, encoded_valid,
                     segments, encoded_segments)
    if config.norm_position == "pre":
      x = Norm(config, name="final_norm")(x, target_valid)
    if logits_index is not None:
      x = jax.lax.dynamic_slice_in_dim(x, logits_index, 1, axis=1)
    if config.tie_output_embedding:
      # Operands in the compute dtype (in bfloat16 this matmul is a large share of a step's FLOPs: d_model x
      # vocabulary per target token), products accumulated and returned in float32 for the softmax.
      # ops.dense, not a 3-D einsum: see layers.Dense.
      x, table = x.astype(config.compute_dtype), embedding.embedding.astype(config.compute_dtype)
      logits = ops.dense(x, table.T, preferred_element_type=jnp.float32)
    else:
      logits = Dense(config.output_vocab_size, ("embed", "vocab"), dtype=config.compute_dtype, name="logits")(x)
    return with_activation_axes(logits.astype(jnp.float32), *BATCH_LENGTH, "activation_vocab")


class EncoderDecoder(nn.Module):
  """The Transformer of Vaswani et al. 2017: ``encode`` the source, ``decode`` the shifted target."""
  config: ModelConfig

  def setup(self):
    config = self.config
    if config.share_embeddings:
      source_embedding = target_embedding = make_embedding(config, config.vocab_size, "shared_embedding")
    else:
      source_embedding = make_embedding(config, config.vocab_size, "source_embedding")
      target_embedding = make_embedding(config, config.output_vocab_size, "target_embedding")
    self.encoder = Encoder(config, source_embedding)
    self.decoder = Decoder(config, target_embedding)

  def encode(self, source_tokens, source_segments=None):
    """``[batch, source_length]`` (and its packed rows' segment ids) -> ``[batch, source_length, d_model]``."""
    # Segment keywords only when packed: the RNN baseline's parts share this interface without them.
    return self.encoder(source_tokens, **({} if source_segments is None else {"segments": source_segments}))

  def decode(self, encoded, source_tokens, decoder_inputs, target_valid=None, logits_index=None,
             source_segments=None, target_segments=None):
    """Logits ``[batch, target_length, vocab]`` for decoder inputs ``[batch, target_length]`` (only at
    ``logits_index``, ``[batch, 1, vocab]``, if given: see ``Decoder``)."""
    packed = {} if target_segments is None else {"segments": target_segments, "encoded_segments": source_segments}
    return self.decoder(decoder_inputs, target_valid, encoded, source_tokens != self.config.pad_id, logits_index,
                        **packed)

  def __call__(self, source_tokens, target_tokens, source_segments=None, target_segments=None):
    """Teacher-forced logits.

    Args:
      source_tokens: ``[batch, source_length]`` int.
      target_tokens: ``[batch, target_length]`` int, the targets themselves (shifted right inside).
      source_segments, target_segments: packed rows (``data.packing``): ``[batch, source_length]`` and
        ``[batch, target_length]`` int, the example of each position; target segment ``s`` is the translation of
        source segment ``s``. Each example is then computed as if alone in its row.

    Returns:
      ``[batch, target_length, vocab]`` float32 logits; position ``i`` predicts ``target_tokens[:, i]``.
    """
    encoded = self.encode(source_tokens, source_segments)
    decoder_inputs = ops.shift_right(target_tokens, self.config.bos_id, segments=target_segments)
    return self.decode(encoded, source_tokens, decoder_inputs, target_tokens != self.config.pad_id,
                       source_segments=source_segments, target_segments=target_segments)


class TransformerLM(nn.Module):
  """Decoder-only language model: causal self attention, no encoder."""
  config: ModelConfig

  @nn.compact
  def __call__(self, tokens, valid=None, segments=None):
    """``[batch, length]`` targets -> ``[batch, length, vocab]`` logits; position ``i`` predicts ``tokens[:, i]``;
    ``segments`` ``[batch, length]`` int: packed rows, each segment a text of its own (``data.packing``).

    With ``config.decode``, ``tokens`` are the next inputs to write into the cache, which start with
    ``bos_id``: ``[batch, 1]`` the previous token, or a whole prompt in one call, ``valid`` ``[batch, length]``
    bool marking each row's real positions (first); logits at ``i`` then predict the token after input ``i``.
    """
    config = self.config
    decoder = Decoder(config, name="decoder")
    if config.decode:
      return decoder(tokens, valid)
    return decoder(ops.shift_right(tokens, config.bos_id, segments=segments), tokens != config.pad_id,
                   segments=segments)


def mean_pool(encoded, valid):
  """The mean over real positions: ``encoded`` ``[batch, length, d_model]``, ``valid`` ``[batch, length]``
  bool -> ``[batch, d_model]`` (zeros for a row without a real position)."""
  weights = valid.astype(encoded.dtype)[..., None]
  return jnp.sum(encoded * weights, axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1.0)


class EncoderClassifier(nn.Module):
  """Encoder, then mean (over real tokens) or first-token pooling, then a linear classifier."""
  config: ClassifierConfig

  @nn.compact
  def __call__(self, tokens, token_types=None):
    """``[batch, length]`` int (and optional token types, see ``Encoder``) -> ``[batch, num_classes]``
    float32 logits."""
    config = self.config
    encoded = Encoder(config, name="encoder")(tokens, token_types)
    if config.pooling == "first":
      pooled = encoded[:, 0]
    else:
      pooled = mean_pool(encoded, tokens != config.pad_id)
    pooled = module_dropout(self, pooled, config.dropout_rate)
    return nn.Dense(config.num_classes, **dense_axes("embed", "outputs"), name="classifier")(pooled.astype(jnp.float32))


def cross_attention_cache(model, params, encoded, source_tokens) -> dict:
  """The ``cross_cache`` collection for decoding: every layer's cross-attention keys and values.

  ``model`` is an ``EncoderDecoder`` (or an ``RNNEncoderDecoder``, which has no cross attention and gets an
  empty collection); ``encoded`` is its encoder output ``[batch, source_length, d_model]``, whose keys and
  values are projected once here. Pass the result beside ``params`` and ``cache`` to each decoding step.
  Only the projections run: the rest of this dummy decoder call is dead code under ``jit``.
  """
  dummy_inputs = jnp.zeros((source_tokens.shape[0], 1), jnp.int32)
  _, variables = model.apply({"params": params}, encoded, source_tokens, dummy_inputs,
                             method=EncoderDecoder.decode, mutable=[CROSS_CACHE])
  return variables.get(CROSS_CACHE, {})
