"""RNN encoder-decoder baselines with attention: Bahdanau et al. 2015 and Luong et al. 2015.

``RNNEncoderDecoder`` has the interface of ``EncoderDecoder`` (it is one, with other parts): ``encode``,
``decode`` and teacher-forced ``__call__``, and with ``config.decode`` one token per ``decode`` call with the
recurrent state in the ``cache`` collection, so the same task, loss and search code drive both models.

    config = RNNConfig(vocab_size=8000, cell="lstm", attention="luong_general")
    logits = RNNEncoderDecoder(config).apply({"params": params}, source, target)  # [batch, target_length, vocab]

The two attention families differ in *when* the decoder attends (Luong et al., section 3.1):
  * ``bahdanau``: the previous state ``s_{i-1}`` attends (additive score), and the context ``c_i`` is fed into
    the RNN with the previous token: ``s_i = f(s_{i-1}, [E y_{i-1}; c_i])``; logits from ``[s_i; c_i; E y_{i-1}]``
    through the paper's maxout deep output (appendix A.2.2, width ``readout_dim``); ``U h_j`` of the additive
    score is computed once per sentence, outside the time scan.
  * ``luong_*``: the RNN runs first, the new state ``h_t`` attends (dot, general or cosine score), and the
    attentional state ``h~_t = tanh(W_c [c_t; h_t])`` (eq. 5) gives the logits; with ``input_feeding``,
    ``h~_{t-1}`` is fed into the RNN with the previous token (section 3.3).
Scores come from ``transformer.ops.scores`` and go through the one attention core (``ops.attention_weights``,
``ops.weighted_values``) as single-head attention: heads axis of size 1 in ``[batch, length, heads, dim]``.

Sources are right-padded with ``pad_id``: the encoder reads each row up to its length (``seq_lengths``), so
extra padding changes neither the encoder states at real positions nor anything the decoder computes.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import ops
from transformer.nn.axes import cell_axes, dense_axes, embed_axes, with_axes
from transformer.nn.config import DTYPES, ModelSettings
from transformer.nn.layers import Dense, module_dropout
from transformer.nn.models import EncoderDecoder

CELLS = ("gru", "lstm")
# "none": no attention (the ablation): the context is 0, so the decoder sees the source only through its initial
# state (the bridge from the encoder's summary), as Cho et al. 2014 / Sutskever et al. 2014.
ATTENTIONS = ("bahdanau", "luong_dot", "luong_general", "luong_cosine", "none")


@dataclasses.dataclass(frozen=True)
class RNNConfig(ModelSettings):
  """Hyper-parameters of ``RNNEncoderDecoder``; validated when built, like ``ModelConfig``.

  Switch to inference with ``config.replace(deterministic=True)`` and to one-token-per-call decoding with
  ``decode=True``.
  """
  vocab_size: int = 32000  # source vocabulary
  target_vocab_size: int | None = None  # None: same as vocab_size
  embedding_dim: int = 256  # source and target token embeddings (two tables)
  hidden_dim: int = 512  # decoder state and encoder output width (bidirectional: hidden_dim / 2 per direction)
  num_layers: int = 1  # stacked RNN layers, in the encoder and in the decoder
  cell: str = "gru"  # one of CELLS: "gru" (nn.GRUCell) or "lstm" (nn.OptimizedLSTMCell)
  attention: str = "bahdanau"  # one of ATTENTIONS
  attention_dim: int | None = None  # Bahdanau's additive-score width d_attn; None: hidden_dim
  readout_dim: int | None = None  # Bahdanau's deep output: maxout width before the vocabulary; None: embedding_dim
  input_feeding: bool = True  # Luong: feed h~_{t-1} into the RNN; Bahdanau always feeds c_i (must be True)
  cosine_temperature: float = 0.1  # luong_cosine: logits = cos / temperature (cosines alone lie in [-1, 1])
  bidirectional_encoder: bool = True  # forward and backward encoder RNNs, outputs concatenated
  dropout_rate: float = 0.1  # on embeddings, between stacked layers and before the output layer
  dtype: str = "float32"  # compute dtype; parameters stay float32
  # "auto": backend-tuned ops for the platform (transformer/ops/kernels.py); "reference": the formulas
  kernels: str = "auto"
  pad_id: int = 0
  bos_id: int = 1
  eos_id: int = 2
  deterministic: bool = False  # True disables dropout (eval and inference)
  decode: bool = False  # True: decode takes one token per call, the recurrent state kept in the 'cache'

  def __post_init__(self):
    self.check_choice("cell", CELLS)
    self.check_choice("attention", ATTENTIONS)
    self.check_choice("dtype", DTYPES)
    self.check_choice("kernels", ops.kernels.KERNEL_SETTINGS)
    for name in ("vocab_size", "embedding_dim", "hidden_dim", "num_layers"):
      self.check_positive_int(name)
    for name in ("target_vocab_size", "attention_dim", "readout_dim"):
      self.check_positive_int(name, or_none=True)
    self.check_rate("dropout_rate")
    if not self.cosine_temperature > 0.0:
      raise ValueError(f"RNNConfig.cosine_temperature={self.cosine_temperature} must be > 0.")
    if self.bidirectional_encoder and self.hidden_dim % 2:
      raise ValueError(f"RNNConfig.hidden_dim={self.hidden_dim} must be even with bidirectional_encoder=True "
                       f"(each direction has hidden_dim / 2 units); use {self.hidden_dim + 1} or set "
                       f"bidirectional_encoder=False.")
    if self.attention == "bahdanau" and not self.input_feeding:
      raise ValueError("RNNConfig.input_feeding=False is not supported with attention='bahdanau', which always "
                       "feeds its context into the RNN; use a luong_* attention or input_feeding=True.")


def _make_cell(config: RNNConfig, features: int, layer: int, name: str | None = None) -> nn.RNNCellBase:
  cell_class = nn.GRUCell if config.cell == "gru" else nn.OptimizedLSTMCell
  inputs = "embed" if layer == 0 else "rnn_state"
  return cell_class(features=features, dtype=config.compute_dtype, **cell_axes(inputs), name=name)


class RNNEncoder(nn.Module):
  """Embedding and a stack of (bidirectional) GRU/LSTM layers that stop at each row's length."""
  config: RNNConfig

  @nn.compact
  def __call__(self, tokens):
    """``[batch, source_length]`` int, right-padded -> ``[batch, source_length, hidden_dim]``, 0 at padding.

    Right padding is assumed: a row's length is its number of non-pad tokens.
    """
    config = self.config
    valid = tokens != config.pad_id
    lengths = jnp.sum(valid, axis=1, dtype=jnp.int32)
    x = nn.Embed(config.vocab_size, config.embedding_dim, **embed_axes("vocab"), name="embedding")(tokens)
    x = x.astype(config.compute_dtype)
    x = module_dropout(self, x, config.dropout_rate)
    for index in range(config.num_layers):
      if index:
        x = module_dropout(self, x, config.dropout_rate)
      if config.bidirectional_encoder:
        features = config.hidden_dim // 2
        # With seq_lengths the backward RNN starts at each row's last real token, not at the padding.
        layer = nn.Bidirectional(nn.RNN(_make_cell(config, features, index, f"layer_{index}_forward")),
                                 nn.RNN(_make_cell(config, features, index, f"layer_{index}_backward")))
      else:
        layer = nn.RNN(_make_cell(config, config.hidden_dim, index, f"layer_{index}"))
      x = layer(x, seq_lengths=lengths)
    # flax's cells start from a float32 carry, so their outputs come back in float32 whatever the dtype.
    x = x.astype(config.compute_dtype)
    return jnp.where(valid[..., None], x, jnp.zeros((), x.dtype))


class RNNAttention(nn.Module):
  """Single-head attention of one decoder state over the encoder states, with the score of ``config.attention``.

  Parameters: Bahdanau ``query_weight`` ``W`` ``[d_q, d_attn]`` and ``score_vector`` ``v`` ``[d_attn]`` (its
  ``U`` is applied to the keys once per sentence, by ``project_keys``, not at every step); Luong general
  ``weight`` ``W_a`` ``[d_q, d_k]``; dot and cosine none. ``attention="none"`` returns a zero context and
  zero weights.
  """
  config: RNNConfig

  @nn.compact
  def __call__(self, query, encoded, encoded_valid, projected_keys=None):
    """Attend.

    Args:
      query: ``[batch, d_q]``, the decoder state.
      encoded: ``[batch, source_length, d_k]``, the keys and values.
      encoded_valid: ``[batch, source_length]`` bool, False at padding.
      projected_keys: Bahdanau only: ``U encoded`` ``[batch, source_length, d_attn]`` from ``project_keys``.

    Returns:
      The context ``[batch, d_k]`` and the weights ``[batch, source_length]``.
    """
    config = self.config
    if config.attention == "none":
      return jnp.zeros_like(encoded[:, 0, :]), jnp.zeros(encoded.shape[:2], jnp.float32)
    kernels = config.resolved_kernels
    init = nn.initializers.lecun_normal()
    query = query[:, None, None, :]  # [batch, q_length=1, heads=1, d_q]
    keys = encoded[:, :, None, :]  # [batch, kv_length, heads=1, d_k]
    d_q, d_k = query.shape[-1], keys.shape[-1]
    if config.attention == "bahdanau":
      if projected_keys is None:
        raise ValueError("Bahdanau attention needs projected_keys=project_keys(config, key_weight, encoded).")
      d_attn = projected_keys.shape[-1]
      logits = ops.additive_scores_projected(
          query, projected_keys[:, :, None, :],
          self.param("query_weight", with_axes(init, "rnn_state", "rnn"), (d_q, d_attn)),
          self.param("score_vector", with_axes(nn.initializers.normal(d_attn ** -0.5), "rnn"), (d_attn,)))
    elif config.attention == "luong_dot":
      logits = ops.luong_dot_scores(query, keys, kernels=kernels)
    elif config.attention == "luong_general":
      weight = self.param("weight", with_axes(init, "rnn_state", "rnn"), (d_q, d_k))
      logits = ops.general_scores(query, keys, weight, kernels=kernels)
    else:
      logits = ops.cosine_scores(query, keys, temperature=config.cosine_temperature, kernels=kernels)
    mask = encoded_valid[:, None, None, :]  # [batch, heads=1, q_length=1, kv_length]
    weights = ops.attention_weights(logits, mask, kernels=kernels)  # [batch, heads=1, q_length=1, kv_length]
    context = ops.weighted_values(weights, keys, kernels=kernels)  # [batch, q_length=1, heads=1, d_k]
    return context[:, 0, 0, :], weights[:, 0, 0, :]


def project_keys(key_weight, encoded):
  """Bahdanau's ``U h_j`` for every source position, once per sentence (Bahdanau et al. 2015, A.1.2):
  ``[batch, source_length, d_k]`` -> ``[batch, source_length, d_attn]``. Inside the decoder's time scan it
  would be recomputed, and its gradient accumulated, at every target step."""
  return ops.project_additive_keys(encoded[:, :, None, :], key_weight)[:, :, 0, :]


class RNNDecoderStep(nn.Module):
  """One decoder time step: attention, the stacked RNN cells and the output layer.

  The state is a dict of ``[batch, hidden_dim]`` arrays: ``hidden_{layer}`` (and ``cell_{layer}`` for LSTM),
  plus ``attentional`` (``h~_{t-1}``) for Luong attention with input feeding. The teacher-forced decoder scans
  this module over time; the cached decoder runs the same scan for a single step.
  """
  config: RNNConfig

  @nn.compact
  def __call__(self, state, embedded, encoded, encoded_valid, projected_keys):
    """``state``; ``embedded`` ``[batch, embedding_dim]`` (previous token) -> new state, (features, weights).

    ``projected_keys``: Bahdanau's ``U encoded`` (``project_keys``), None for Luong. Returns the features
    the output layer reads ``[batch, d_features]`` (the output layer runs once, after the scan) and the
    attention weights ``[batch, source_length]``.
    """
    config = self.config
    top = f"hidden_{config.num_layers - 1}"
    attention = RNNAttention(config, name="attention")
    state = dict(state)
    if config.attention == "bahdanau":
      # Bahdanau eq. (6): e_ij = a(s_{i-1}, h_j), then s_i = f(s_{i-1}, y_{i-1}, c_i) (eq. 4).
      context, weights = attention(state[top], encoded, encoded_valid, projected_keys)
      x = jnp.concatenate([embedded, context.astype(embedded.dtype)], axis=-1)
    elif config.input_feeding:
      x = jnp.concatenate([embedded, state["attentional"]], axis=-1)
    else:
      x = embedded
    for index in range(config.num_layers):
      if index:
        x = module_dropout(self, x, config.dropout_rate)
      cell = _make_cell(config, config.hidden_dim, index, name=f"layer_{index}")
      if config.cell == "lstm":
        (memory, x), _ = cell((state[f"cell_{index}"], state[f"hidden_{index}"]), x)
        state[f"cell_{index}"] = memory.astype(config.compute_dtype)
      else:
        x, _ = cell(state[f"hidden_{index}"], x)
      x = x.astype(config.compute_dtype)
      state[f"hidden_{index}"] = x
    if config.attention == "bahdanau":
      features = jnp.concatenate([x, context.astype(x.dtype), embedded], axis=-1)
    else:
      # Luong eq. (5): the current state h_t attends; h~_t = tanh(W_c [c_t; h_t]).
      context, weights = attention(x, encoded, encoded_valid)
      project = nn.Dense(config.hidden_dim, use_bias=False, dtype=config.compute_dtype,
                         **dense_axes("rnn_state", "rnn"), name="attentional")
      attentional = jnp.tanh(project(jnp.concatenate([context.astype(x.dtype), x], axis=-1)))
      if config.input_feeding:
        state["attentional"] = attentional
      features = attentional
    return state, (features, weights)


# Parameters are shared by all steps, each step gets its own dropout key.
_ScannedDecoderStep = nn.scan(RNNDecoderStep, variable_broadcast="params",
                              split_rngs={"params": False, "dropout": True},
                              in_axes=(1, nn.broadcast, nn.broadcast, nn.broadcast), out_axes=1)


class RNNDecoder(nn.Module):
  """Target embedding, the initial state from the encoder (a learned bridge), and the decoder steps."""
  config: RNNConfig

  @nn.compact
  def __call__(self, decoder_inputs, target_valid=None, encoded=None, encoded_valid=None, logits_index=None):
    """Decode (the signature of ``transformer.nn.Decoder``).

    Args:
      decoder_inputs: ``[batch, target_length]`` int, the right-shifted targets (teacher forcing), or
        ``[batch, 1]`` the previous token when ``config.decode``.
      target_valid: unused: the decoder reads left to right, so target padding never reaches a real position.
      encoded: ``[batch, source_length, hidden_dim]`` from ``RNNEncoder``.
      encoded_valid: ``[batch, source_length]`` bool (default: all True).
      logits_index: ``[]`` int: run the output layers at this position only (``[batch, 1, vocab]``).

    Returns:
      ``[batch, target_length, output_vocab_size]`` float32 logits. Attention weights
      ``[batch, 1, target_length, source_length]`` are sown into ``intermediates``.
    """
    del target_valid
    config = self.config
    if encoded is None:
      raise ValueError("RNNDecoder needs the encoder states: pass encoded=RNNEncoder(...)(source_tokens).")
    if encoded_valid is None:
      encoded_valid = jnp.ones(encoded.shape[:2], bool)
    embed = nn.Embed(config.output_vocab_size, config.embedding_dim, **embed_axes("vocab"), name="embedding")
    embedded = embed(decoder_inputs)
    embedded = module_dropout(self, embedded.astype(config.compute_dtype), config.dropout_rate)
    initial_state = self._initial_state(encoded, encoded_valid)
    projected_keys = None
    if config.attention == "bahdanau":
      d_attn = config.attention_dim or config.hidden_dim
      key_weight = self.param("attention_key_weight", with_axes(nn.initializers.lecun_normal(), "rnn_state", "rnn"),
                              (encoded.shape[-1], d_attn))
      projected_keys = project_keys(key_weight, encoded)
    step = _ScannedDecoderStep(config, name="step")
    if config.decode and self.has_variable("cache", "cache_index"):
      if decoder_inputs.shape[1] != 1:
        raise ValueError(f"decode=True takes one position per call, got {decoder_inputs.shape[1]}.")
      features, weights = self._cached_step(step, initial_state, embedded, encoded, encoded_valid, projected_keys)
    else:
      if config.decode:  # the init call: create a zero cache, then behave as teacher forcing
        for name, value in initial_state.items():
          self.variable("cache", name, jnp.zeros, value.shape, value.dtype)
        self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
      _, (features, weights) = step(initial_state, embedded, encoded, encoded_valid, projected_keys)
    # [batch, q_length, kv_length] -> [batch, heads=1, q_length, kv_length]
    self.sow("intermediates", "attention_weights", weights[:, None])
    # The output layers run on all positions at once, after the scan: large matmuls instead of one per step.
    if logits_index is not None:
      features = jax.lax.dynamic_slice_in_dim(features, logits_index, 1, axis=1)
    return self._output_logits(features)

  @nn.nowrap
  def _cached_step(self, step, initial_state, embedded, encoded, encoded_valid, projected_keys):
    """One decoding step from the state in the ``cache`` collection, which it updates: ``(features,
    weights)`` of ``step`` for ``embedded`` ``[batch, 1, embedding_dim]``."""
    cache_index = self.variable("cache", "cache_index")
    cached = {name: self.variable("cache", name) for name in initial_state}
    # A zero cache means "no step yet": the first step starts from the encoder, later ones from the cache.
    state = {name: jnp.where(cache_index.value == 0, initial_state[name], cached[name].value)
             for name in initial_state}
    state, (features, weights) = step(state, embedded, encoded, encoded_valid, projected_keys)
    for name, variable in cached.items():
      variable.value = state[name]
    cache_index.value = cache_index.value + 1
    return features, weights

  @nn.nowrap
  def _output_logits(self, features):
    """The output layers: ``[batch, length, d_features]`` -> float32 logits ``[batch, length, vocab]``."""
    config = self.config
    if config.attention == "bahdanau":
      # Bahdanau et al. 2015 (A.2.2) deep output: t_i = maxout(U_o s_i + V_o E y_{i-1} + C_o c_i), pool size 2,
      # so the vocabulary projection reads readout_dim features instead of hidden + context + embedding.
      width = config.readout_dim or config.embedding_dim
      pre_maxout = Dense(2 * width, ("rnn_state", "embed"), dtype=config.compute_dtype, name="readout")(features)
      features = jnp.max(pre_maxout.reshape(*pre_maxout.shape[:-1], width, 2), axis=-1)
    features = module_dropout(self, features, config.dropout_rate)
    inputs = "embed" if config.attention == "bahdanau" else "rnn_state"  # the readout's width, or the RNN's
    logits = Dense(config.output_vocab_size, (inputs, "vocab"), dtype=config.compute_dtype, name="logits")(features)
    return logits.astype(jnp.float32)

  @nn.nowrap
  def _summary(self, encoded, encoded_valid):
    """The encoder's view of the whole source, ``[batch, hidden_dim]``: last forward and first backward state."""
    last = jnp.maximum(jnp.sum(encoded_valid, axis=1) - 1, 0)
    final = encoded[jnp.arange(encoded.shape[0]), last]  # [batch, hidden_dim]
    if not self.config.bidirectional_encoder:
      return final
    half = self.config.hidden_dim // 2
    # Bahdanau (appendix A.2.2) starts from the backward RNN's state at the first source position.
    return jnp.concatenate([final[:, :half], encoded[:, 0, half:]], axis=-1)

  @nn.nowrap
  def _initial_state(self, encoded, encoded_valid):
    """Per layer ``tanh(W summary)`` for each part of the state; ``attentional`` (``h~_0``) starts at 0."""
    config = self.config
    summary = self._summary(encoded, encoded_valid)
    parts = ("hidden", "cell") if config.cell == "lstm" else ("hidden",)
    state = {}
    for index in range(config.num_layers):
      for part in parts:
        bridge = nn.Dense(config.hidden_dim, dtype=config.compute_dtype, **dense_axes("rnn_state", "rnn"),
                          name=f"bridge_{part}_{index}")
        state[f"{part}_{index}"] = jnp.tanh(bridge(summary))
    if config.attention != "bahdanau" and config.input_feeding:
      state["attentional"] = jnp.zeros((encoded.shape[0], config.hidden_dim), config.compute_dtype)
    return state


class RNNEncoderDecoder(EncoderDecoder):
  """An ``EncoderDecoder`` with an RNN encoder and an attentional RNN decoder (Bahdanau or Luong).

  ``encode``, ``decode`` and ``__call__`` are ``EncoderDecoder``'s: ``encode(source_tokens)`` returns
  ``[batch, source_length, hidden_dim]`` states, ``decode(encoded, source_tokens, decoder_inputs)`` the logits,
  ``__call__(source_tokens, target_tokens)`` the teacher-forced logits ``[batch, target_length, vocab]``.
  """
  config: RNNConfig

  def setup(self):
    self.encoder = RNNEncoder(self.config)
    self.decoder = RNNDecoder(self.config)
