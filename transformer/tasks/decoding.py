"""Model-aware decoding: the models as functions for ``transformer.decode``'s searches, and those searches run
on a model and its parameters.

``transformer.decode`` knows no model (it imports no ``transformer.nn``), so the binding lives here: a step
``(tokens, cache) -> (logits, cache)``, a prefill ``(tokens, lengths, cache) -> (logits, cache)`` that writes a
prompt into the key/value cache in one pass, and the empty cache (``language_model_decoding``,
``encoder_decoder_decoding``); the jitted searches of an ``EncoderDecoder`` or RNN (``search_decode``,
``greedy_decode``, ``beam_decode``) and of a ``TransformerLM`` (``continue_prompts``).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from transformer.decode import DecodeSettings, check_max_length, search
from transformer.nn import (CROSS_CACHE, MODELS, EncoderDecoder, ModelConfig, TransformerLM, cross_attention_cache,
                            split_rows)

# The config.model_name values (keys of transformer.nn.MODELS) a seq2seq task trains. Both models share the
# EncoderDecoder interface (encode, decode, teacher-forced __call__, a decode cache), so loss and search code
# is the same for both.
SEQ2SEQ_MODELS = ("transformer", "rnn")


def model_class(model_config) -> type[EncoderDecoder]:
  """The Flax module of a seq2seq model's hyper-parameters (``ModelConfig`` or ``RNNConfig``)."""
  return next(MODELS[name].module for name in SEQ2SEQ_MODELS if type(model_config) is MODELS[name].config)


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


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def search_decode(model_config: ModelConfig, params, source, max_length: int, settings: DecodeSettings,
                  prompt=None, prompt_lengths=None):
  """``settings``' search of an ``EncoderDecoder`` (or RNN) with its key/value cache, for ``source``
  ``[batch, source_length]``: ``(sequences int32 [batch, n, max_length], scores float32 [batch, n])``, the ``n``
  hypotheses (beams or samples) best first (see ``transformer.decode.search``).

  ``prompt`` ``[batch, prompt_length]`` with ``prompt_lengths`` ``[batch]``: target prefixes to continue,
  written into the cache in one pass (Transformer only); the output holds the continuations.
  ``model_config`` should have ``deterministic=True``.

  Raises:
    ValueError: ``max_length`` is not an integer >= 1 (checked before the cache is sized by it).
  """
  check_max_length(max_length)
  prompt_length = 0 if prompt is None else prompt.shape[1]

  def decode(source, prompt=None, prompt_lengths=None):
    # BOS, the prompt and every generated token but the last are written into the cache.
    step_fn, prefill_fn, cache = encoder_decoder_decoding(model_class(model_config)(model_config), params, source,
                                                          prompt_length + max_length, settings.copies)
    return search(settings, step_fn, cache, source.shape[0], max_length, model_config.bos_id, model_config.eos_id,
                  model_config.pad_id, prompt=prompt, prompt_lengths=prompt_lengths, prefill_fn=prefill_fn)

  return split_rows(decode, source, *(() if prompt is None else (prompt, prompt_lengths)))


def greedy_decode(model_config: ModelConfig, params, source, max_length: int):
  """Greedy search of an ``EncoderDecoder`` (or RNN): ``([batch, max_length] int32 tokens, [batch] log P)``,
  EOS included, padded after it. ``model_config`` should have ``deterministic=True``."""
  sequences, log_probs = search_decode(model_config, params, source, max_length, DecodeSettings("greedy"))
  return sequences[:, 0], log_probs[:, 0]


def beam_decode(model_config: ModelConfig, params, source, max_length: int, beam_size: int,
                length_penalty: float = 0.6, return_all_beams: bool = False, finish_rule: str = "within_beam"):
  """Beam search of an ``EncoderDecoder`` (or RNN) with its key/value cache: ``([batch, max_length] tokens,
  [batch] scores)`` of the best hypothesis, or of all beams (``[batch, beam, ...]``, see ``beam_search``)."""
  settings = DecodeSettings("beam", beam_size=beam_size, length_penalty=length_penalty, finish_rule=finish_rule)
  sequences, scores = search_decode(model_config, params, source, max_length, settings)
  return (sequences, scores) if return_all_beams else (sequences[:, 0], scores[:, 0])


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def continue_prompts(model_config: ModelConfig, params, prompt, prompt_lengths, max_new_tokens: int,
                     settings: DecodeSettings):
  """Continuations of a ``TransformerLM`` with its key/value cache, the prompts prefilled in one pass.

  Args:
    model_config: with ``deterministic=True``.
    prompt: int32 ``[batch, prompt_length]``, row ``b``'s first ``prompt_lengths[b]`` tokens real (no BOS, no
      EOS; a length may be 0).
    max_new_tokens: tokens generated at most.
    settings: the search (``transformer.decode.DecodeSettings``).

  Returns:
    ``(sequences int32 [batch, n, max_new_tokens], scores float32 [batch, n])``: the ``n`` continuations
    (beams or samples) best first, EOS included, padded after it (``transformer.decode.search``).

  Raises:
    ValueError: ``max_new_tokens`` is not an integer >= 1 (checked before the cache is sized by it).
  """
  check_max_length(max_new_tokens, "max_new_tokens")

  def decode(prompt, prompt_lengths):
    batch, prompt_length = prompt.shape
    step_fn, prefill_fn, cache = language_model_decoding(TransformerLM(model_config), params, batch,
                                                         prompt_length + max_new_tokens)
    return search(settings, step_fn, cache, batch, max_new_tokens, model_config.bos_id, model_config.eos_id,
                  model_config.pad_id, prompt=prompt, prompt_lengths=prompt_lengths, prefill_fn=prefill_fn)

  return split_rows(decode, prompt, prompt_lengths)
