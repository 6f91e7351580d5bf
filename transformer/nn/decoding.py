"""The models as functions for ``transformer.decode``'s searches: a step ``(tokens, cache) -> (logits, cache)``,
a prefill ``(tokens, lengths, cache) -> (logits, cache)`` that writes a prompt into the key/value cache in one
pass, and the empty cache. (``transformer.decode`` knows no model, so the models provide these.)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer.nn.attention import CROSS_CACHE
from transformer.nn.models import EncoderDecoder, TransformerLM, cross_attention_cache


def _empty_cache(init):
  """Zeros shaped as the ``cache`` collection that ``init()`` creates (traced abstractly, never run)."""
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(init)["cache"])


def _step_and_prefill(apply):
  """``apply(tokens, valid, cache) -> (logits, cache)`` as the two functions of a search: the step writes every
  position, the prefill the first ``lengths[b]`` of row ``b``."""
  def step_fn(tokens, cache):
    return apply(tokens, None, cache)

  def prefill_fn(tokens, lengths, cache):
    return apply(tokens, jnp.arange(tokens.shape[1])[None] < lengths[:, None], cache)

  return step_fn, prefill_fn


def language_model_decoding(model: TransformerLM, params, batch_size: int, cache_length: int):
  """``(step_fn, prefill_fn, cache)`` of a ``TransformerLM`` (its config need not have ``decode``) for
  ``batch_size`` rows; the cache holds ``cache_length`` positions (BOS, the prompt and the generated tokens
  but the last)."""
  decoder = type(model)(model.config.replace(decode=True))
  cache = _empty_cache(lambda: decoder.init(jax.random.key(0), jnp.zeros((batch_size, cache_length), jnp.int32)))

  def apply(tokens, valid, cache):
    logits, variables = decoder.apply({"params": params, "cache": cache}, tokens, valid, mutable=["cache"])
    return logits, variables["cache"]

  return (*_step_and_prefill(apply), cache)


def encoder_decoder_decoding(model: EncoderDecoder, params, source, cache_length: int, copies: int = 1):
  """``(step_fn, prefill_fn, cache)`` of an ``EncoderDecoder`` (or RNN, whose decoder takes no prefill) for
  ``source`` ``[batch, source_length]``, encoded once here.

  ``prefill_fn`` and ``cache`` have ``batch`` rows; ``step_fn`` takes ``batch * copies`` rows (beams or
  samples, example-major as ``transformer.decode.expand_to_beams``) and attends to the encoder output
  repeated as many times. The cross-attention keys and values are projected once, constants of the search.
  """
  decoder = type(model)(model.config.replace(decode=True))
  encoded = model.apply({"params": params}, source, method=EncoderDecoder.encode)
  cache = _empty_cache(lambda: decoder.init(jax.random.key(0), encoded, source,
                                            jnp.zeros((source.shape[0], cache_length), jnp.int32),
                                            method=EncoderDecoder.decode))

  def applying(encoded, source):
    cross_cache = cross_attention_cache(model, params, encoded, source)

    def apply(tokens, valid, cache):
      logits, variables = decoder.apply({"params": params, "cache": cache, CROSS_CACHE: cross_cache}, encoded,
                                        source, tokens, valid, method=EncoderDecoder.decode, mutable=["cache"])
      return logits, variables["cache"]
    return apply

  step_fn, _ = _step_and_prefill(applying(jnp.repeat(encoded, copies, axis=0), jnp.repeat(source, copies, axis=0)))
  _, prefill_fn = _step_and_prefill(applying(encoded, source))
  return step_fn, prefill_fn, cache
