"""Multi-head attention: owns the projections and the decode cache, calls ``transformer.ops``."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import ops
from transformer.nn.axes import BATCH_LENGTH, with_activation_axes, with_axes
from transformer.nn.config import ModelConfig

_dense_init = nn.initializers.xavier_uniform()
# Collection of the cross-attention keys and values ``[batch, source_length, heads, head_dim]`` per layer:
# filled by one call with it mutable (``transformer.nn.cross_attention_cache``), then read at every decoding
# step. Kept apart from the step-to-step ``cache`` because it never changes: a search need not carry it,
# reorder it per beam or copy it.
CROSS_CACHE = "cross_cache"


def _split_heads(x, head_dim: int, heads_axis: str = "activation_heads"):
  """``[batch, length, n * head_dim]`` -> ``[batch, length, n, head_dim]``, its ``n`` heads laid out as the
  activation axis ``heads_axis`` (``with_activation_axes``)."""
  heads = x.reshape(x.shape[0], x.shape[1], x.shape[2] // head_dim, head_dim)
  return with_activation_axes(heads, *BATCH_LENGTH, heads_axis, None)


class MultiHeadAttention(nn.Module):
  """``MultiHead(Q, K, V) = Concat(head_1..head_h) W^O`` (Vaswani et al., section 3.2.2).

  Self attention when ``inputs_kv is inputs_q``, cross attention otherwise. Masks are given per position
  (``query_valid``, ``key_valid``, ``causal``) so the dense and the chunked implementations get the
  same information. With ``config.decode`` and ``causal``, each call appends its positions' keys and values
  to the ``cache`` collection, at each example's own ``cache_index``, and attends over the cache: one new
  token per call, or a whole prompt in one call (prefill; ``query_valid`` marks each row's real positions,
  which come first). Cross attention reads its keys and values from the ``cross_cache`` collection when
  given one (see ``CROSS_CACHE``).

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

  def _projection(self, name, features_in, features_out, axes: tuple[str, str]):
    """The dense layer ``name`` as a function ``[batch, length, features_in] -> [.., features_out]``; ``axes``:
    the kernel's logical axis names (``transformer.nn.LOGICAL_AXES``)."""
    kernel = self.param(f"{name}_kernel", with_axes(_dense_init, *axes), (features_in, features_out))
    bias = self.param(f"{name}_bias", with_axes(nn.initializers.zeros, axes[1]), (features_out,))
    dtype = self.config.compute_dtype
    return lambda inputs: ops.dense(inputs.astype(dtype), kernel.astype(dtype), bias.astype(dtype))

  @nn.compact
  def __call__(self, inputs_q, inputs_kv, query_valid=None, key_valid=None, causal: bool = False,
               query_segments=None, key_segments=None):
    """Attend from ``inputs_q`` to ``inputs_kv``.

    Args:
      inputs_q: ``[batch, q_length, d_model]``.
      inputs_kv: ``[batch, kv_length, d_model]``.
      query_valid: ``[batch, q_length]`` bool; padding queries output zeros (before ``W^O``'s bias).
      key_valid: ``[batch, kv_length]`` bool; padding keys get no weight.
      causal: query ``i`` attends to keys ``j <= i`` (decoder self attention).
      query_segments, key_segments: packed rows (training): ``[batch, q_length]`` and ``[batch, kv_length]``
        int segment ids; a query sees only keys of its own segment, and rotary positions restart per segment.

    Returns:
      ``[batch, q_length, d_model]``.
    """
    config = self.config
    batch, q_length, d_model = inputs_q.shape
    features = config.num_heads * config.head_dim
    query = _split_heads(self._projection("query", d_model, features, ("embed", "heads"))(inputs_q), config.head_dim)
    key, value = self._keys_and_values(inputs_kv)
    window = None if self.cross_attention else config.attention_window
    cache_mask = positions = None  # positions: the queries' [batch, q_length] in the decode cache
    if config.decode and causal and self.has_variable("cache", "cached_key"):
      key, value, cache_mask, positions = self._update_cache(key, value, query_valid)
      if window is not None:  # and hide keys older than the window: make_local_mask's rule, per example
        slots = jnp.arange(key.shape[1], dtype=positions.dtype)
        cache_mask = cache_mask & (slots[None, None, None, :] > positions[:, None, :, None] - window)
      query_valid, key_valid, causal, window = None, None, False, None  # the cache mask hides future and past
    elif config.decode and causal:
      self._create_cache(key, value)  # the init call: behave as full causal attention

    if config.positional_encoding == "rotary" and not self.cross_attention:
      key_positions = jnp.arange(key.shape[1])
      if query_segments is not None:  # packed: positions within each example
        positions, key_positions = ops.segment_positions(query_segments), ops.segment_positions(key_segments)
      query = ops.apply_rotary_embedding(query, jnp.arange(q_length) if positions is None else positions)
      key = ops.apply_rotary_embedding(key, key_positions)
    output = self._attend(query, key, value, query_valid, key_valid, causal, window, cache_mask,
                          query_segments, key_segments)
    output = with_activation_axes(output, *BATCH_LENGTH, "activation_heads", None).reshape(batch, q_length, features)
    return self._projection("output", features, d_model, ("heads", "embed"))(output)

  def _keys_and_values(self, inputs_kv):
    """The keys and values ``[batch, kv_length, kv_heads, head_dim]`` of ``inputs_kv`` ``[batch, kv_length,
    d_model]``; while decoding, cross attention reads them from (or writes them to) ``CROSS_CACHE``."""
    kv_heads, head_dim = self.config.kv_heads, self.config.head_dim
    # Grouped-query attention: fewer key/value heads, each read by heads // kv_heads query heads.
    project_key = self._projection("key", inputs_kv.shape[-1], kv_heads * head_dim, ("embed", "kv_heads"))
    project_value = self._projection("value", inputs_kv.shape[-1], kv_heads * head_dim, ("embed", "kv_heads"))
    if self.cross_attention and self.has_variable(CROSS_CACHE, "key"):
      # Decoding: the encoder output's keys and values were projected once, before the first step.
      return self.get_variable(CROSS_CACHE, "key"), self.get_variable(CROSS_CACHE, "value")
    key = _split_heads(project_key(inputs_kv), head_dim, "activation_kv_heads")
    value = _split_heads(project_value(inputs_kv), head_dim, "activation_kv_heads")
    if self.cross_attention and self.is_mutable_collection(CROSS_CACHE) and not self.is_initializing():
      self.put_variable(CROSS_CACHE, "key", key)
      self.put_variable(CROSS_CACHE, "value", value)
    return key, value

  def _attend(self, query, key, value, query_valid, key_valid, causal, window, cache_mask, query_segments=None,
              key_segments=None):
    """``ops.attend`` with the config's dropout and kernels: ``[batch, q_length, heads, head_dim]``. The
    weights are sown into ``intermediates`` when that collection is mutable."""
    config = self.config
    use_dropout = not config.deterministic and config.attention_dropout_rate > 0.0
    # The weights are formed only when sown (a fused or chunked kernel never writes them out); ops.attend
    # picks the implementation (chunked, fused or the formula) from the config's resolved kernels.
    sow_weights = self.is_mutable_collection("intermediates")
    output = ops.attend(
        query, key, value, query_valid=query_valid, key_valid=key_valid, causal=causal, window=window,
        mask=cache_mask, scale=config.scale_attention,
        dropout_rate=config.attention_dropout_rate if use_dropout else 0.0,
        dropout_rng=self.make_rng("dropout") if use_dropout else None, return_weights=sow_weights,
        float32_logits=config.float32_attention_logits, kernels=config.resolved_kernels,
        query_segments=query_segments, key_segments=key_segments)
    if not sow_weights:
      return output
    output, weights = output
    self.sow("intermediates", "attention_weights", weights)
    return output

  def _create_cache(self, key, value):
    """Zero cache sized by the init call's inputs: keys and values ``[batch, max_length, kv_heads, head_dim]``
    and each example's next free position ``cache_index`` ``[batch]`` int32."""
    self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    self.variable("cache", "cache_index", jnp.zeros, key.shape[:1], jnp.int32)

  def _update_cache(self, key, value, query_valid):
    """Write this call's keys/values ``[batch, length, kv_heads, head_dim]`` at each example's ``cache_index``
    and advance it by the example's number of valid positions (all ``length`` when ``query_valid`` is None).

    Returns the whole cache (keys and values ``[batch, max_length, kv_heads, head_dim]``), the mask
    ``[batch, 1, length, max_length]`` (query ``i`` of example ``b`` sees cache slots up to its own position
    ``cache_index[b] + i``), and the queries' positions ``[batch, length]``.
    """
    cached_key = self.variable("cache", "cached_key")
    cached_value = self.variable("cache", "cached_value")
    cache_index = self.variable("cache", "cache_index")
    max_length, length = cached_key.value.shape[1], key.shape[1]
    index = cache_index.value  # [batch] int32

    def write(cache, new):
      # Per example: [max_length, heads, head_dim] <- [length, heads, head_dim] at its index. The start
      # indices share the index's dtype: int64 literal zeros beside it fail under jax_enable_x64.
      zero = jnp.zeros((), index.dtype)
      return jax.vmap(lambda c, n, i: jax.lax.dynamic_update_slice(c, n.astype(c.dtype), (i, zero, zero)))(
          cache, new, index)

    cached_key.value = write(cached_key.value, key)
    cached_value.value = write(cached_value.value, value)
    written = length if query_valid is None else jnp.sum(query_valid, axis=1)
    cache_index.value = (index + written).astype(jnp.int32)
    query_positions = index[:, None] + jnp.arange(length, dtype=jnp.int32)  # [batch, length]
    mask = jnp.arange(max_length, dtype=jnp.int32)[None, None, :] <= query_positions[:, :, None]
    return cached_key.value, cached_value.value, mask[:, None], query_positions
