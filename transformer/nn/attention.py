"""Multi-head attention: owns the projections and the decode cache, calls ``transformer.ops``."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import ops
from transformer.nn.config import ModelConfig

_dense_init = nn.initializers.xavier_uniform()
# Collection of the cross-attention keys and values ``[batch, source_length, heads, head_dim]`` per layer:
# filled by one call with it mutable (``transformer.nn.cross_attention_cache``), then read at every decoding
# step. Kept apart from the step-to-step ``cache`` because it never changes: a search need not carry it,
# reorder it per beam or copy it.
CROSS_CACHE = "cross_cache"


class MultiHeadAttention(nn.Module):
  """``MultiHead(Q, K, V) = Concat(head_1..head_h) W^O`` (Vaswani et al., section 3.2.2).

  Self attention when ``inputs_kv is inputs_q``, cross attention otherwise. Masks are given per position
  (``query_valid``, ``key_valid``, ``causal``) so the dense and the chunked implementations get the
  same information. With ``config.decode`` and ``causal``, each call takes one new position, appends its
  key and value to the ``cache`` collection and attends over the cache. Cross attention reads its keys
  and values from the ``cross_cache`` collection when given one (see ``CROSS_CACHE``).

  Parameters: ``query`` kernel ``[d_model, heads * head_dim]``, ``key``/``value`` kernels
  ``[d_model, kv_heads * head_dim]`` (``config.num_kv_heads``: grouped-query attention) with biases, and the
  output kernel ``W^O`` ``[heads * head_dim, d_model]`` with bias. The attention weights are sown into the
  ``intermediates`` collection (dense implementation) for plots.
  """
  config: ModelConfig
  # True when ``inputs_kv`` is another sequence (the encoder output): no rotary positions then, since a
  # target and a source position have no meaningful offset, and while decoding one token at a time a
  # cross-attention query (which keeps no cache) would not know its own position.
  cross_attention: bool = False

  def _projection(self, name, features_in, features_out):
    """The dense layer ``name`` as a function ``[batch, length, features_in] -> [.., features_out]``."""
    kernel = self.param(f"{name}_kernel", _dense_init, (features_in, features_out))
    bias = self.param(f"{name}_bias", nn.initializers.zeros, (features_out,))
    dtype = self.config.compute_dtype
    return lambda inputs: ops.dense(inputs.astype(dtype), kernel.astype(dtype), bias.astype(dtype))

  @nn.compact
  def __call__(self, inputs_q, inputs_kv, query_valid=None, key_valid=None, causal: bool = False):
    """Attend from ``inputs_q`` to ``inputs_kv``.

    Args:
      inputs_q: ``[batch, q_length, d_model]``.
      inputs_kv: ``[batch, kv_length, d_model]``.
      query_valid: ``[batch, q_length]`` bool; padding queries output zeros (before ``W^O``'s bias).
      key_valid: ``[batch, kv_length]`` bool; padding keys get no weight.
      causal: query ``i`` attends to keys ``j <= i`` (decoder self attention).

    Returns:
      ``[batch, q_length, d_model]``.
    """
    config = self.config
    batch, q_length, d_model = inputs_q.shape
    heads, kv_heads, head_dim = config.num_heads, config.kv_heads, config.head_dim
    features = heads * head_dim

    def split_heads(x):  # [batch, length, n * head_dim] -> [batch, length, n, head_dim]
      return x.reshape(x.shape[0], x.shape[1], x.shape[2] // head_dim, head_dim)

    query = split_heads(self._projection("query", d_model, features)(inputs_q))
    # Grouped-query attention: fewer key/value heads, each read by heads // kv_heads query heads.
    project_key = self._projection("key", inputs_kv.shape[-1], kv_heads * head_dim)
    project_value = self._projection("value", inputs_kv.shape[-1], kv_heads * head_dim)
    if self.cross_attention and self.has_variable(CROSS_CACHE, "key"):
      # Decoding: the encoder output's keys and values were projected once, before the first step.
      key, value = self.get_variable(CROSS_CACHE, "key"), self.get_variable(CROSS_CACHE, "value")
    else:
      key, value = split_heads(project_key(inputs_kv)), split_heads(project_value(inputs_kv))
      if self.cross_attention and self.is_mutable_collection(CROSS_CACHE) and not self.is_initializing():
        self.put_variable(CROSS_CACHE, "key", key)
        self.put_variable(CROSS_CACHE, "value", value)

    rotary = config.positional_encoding == "rotary" and not self.cross_attention
    query_positions = key_positions = None
    if rotary:
      query_positions = jnp.arange(q_length)
      key_positions = jnp.arange(key.shape[1])

    window = None if self.cross_attention else config.attention_window
    if config.decode and causal and self.has_variable("cache", "cached_key"):
      key, value, key_valid, query_positions, key_positions = self._update_cache(key, value, query_positions)
      if window is not None:  # keys older than the window, as position - offset of make_local_mask
        position = self.get_variable("cache", "cache_index") - 1
        key_valid = key_valid & ops.make_local_mask(1, window, key.shape[1], offset=position)[0, 0]
      query_valid, causal, window = None, False, None  # the cache mask already hides the future and the past
    elif config.decode and causal:
      self._create_cache(key, value)  # the init call: behave as full causal attention

    if rotary:
      query = ops.apply_rotary_embedding(query, query_positions)
      key = ops.apply_rotary_embedding(key, key_positions)

    kernels = ops.select_kernels(config.kernels)
    use_dropout = not config.deterministic and config.attention_dropout_rate > 0.0
    if config.attention_implementation == "chunked" and not use_dropout:
      output = ops.chunked_dot_product_attention(
          query, key, value, query_valid, key_valid, causal=causal, window=window, scale=config.scale_attention,
          query_chunk_size=config.attention_chunk_size, key_chunk_size=config.attention_chunk_size,
          kernels=kernels)
    else:
      # Attention-weight dropout needs the weights, so it always takes the dense path.
      mask = None
      if query_valid is not None or key_valid is not None:
        mask = ops.make_attention_mask(
            jnp.ones((batch, q_length), bool) if query_valid is None else query_valid,
            jnp.ones((batch, key.shape[1]), bool) if key_valid is None else key_valid)
      if causal:
        mask = ops.combine_masks(mask, ops.make_causal_mask(q_length, key.shape[1]))
      if window is not None:
        mask = ops.combine_masks(mask, ops.make_local_mask(q_length, window, key.shape[1]))
      # The weights are formed only when sown (a fused kernel, e.g. cuDNN's, never writes them out).
      sow_weights = self.is_mutable_collection("intermediates")
      output = ops.dot_product_attention(
          query, key, value, mask=mask, scale=config.scale_attention,
          dropout_rate=config.attention_dropout_rate if use_dropout else 0.0,
          dropout_rng=self.make_rng("dropout") if use_dropout else None, return_weights=sow_weights,
          float32_logits=config.float32_attention_logits, kernels=kernels)
      if sow_weights:
        output, weights = output
        self.sow("intermediates", "attention_weights", weights)

    output = output.reshape(batch, q_length, features)
    return self._projection("output", features, d_model)(output)

  def _create_cache(self, key, value):
    """Zero cache sized by the init call's inputs: ``[batch, max_length, kv_heads, head_dim]``."""
    self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))

  def _update_cache(self, key, value, query_positions):
    """Write this step's ``[batch, 1, heads, head_dim]`` key/value at ``cache_index``.

    Returns the whole cache, its validity ``[batch, max_length]`` (positions written so far) and the
    rotary positions of the query and keys (None unless rotary).
    """
    cached_key = self.variable("cache", "cached_key")
    cached_value = self.variable("cache", "cached_value")
    cache_index = self.variable("cache", "cache_index")
    batch, max_length = cached_key.value.shape[:2]
    if key.shape[1] != 1:
      raise ValueError(f"decode=True takes one position per call, got {key.shape[1]}.")
    index = cache_index.value
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key.astype(cached_key.value.dtype),
                                                    (0, index, 0, 0))
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value,
                                                      value.astype(cached_value.value.dtype), (0, index, 0, 0))
    cache_index.value = index + 1
    key_valid = jnp.broadcast_to(jnp.arange(max_length) <= index, (batch, max_length))
    if query_positions is None:
      return cached_key.value, cached_value.value, key_valid, None, None
    return cached_key.value, cached_value.value, key_valid, index[None], jnp.arange(max_length)
