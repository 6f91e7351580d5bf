"""Prompts: a prefix per example (different lengths in one batch) written into the cache in one pass, then
decoded, equals feeding the prefix token by token; for TransformerLM and EncoderDecoder."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.decode import DecodeSettings, beam_search, greedy_search, search
from transformer.nn import EncoderDecoder, ModelConfig, TransformerLM
from transformer.tasks.decoding import encoder_decoder_decoding, language_model_decoding, search_decode

CONFIG = ModelConfig(vocab_size=11, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=2,
                     dropout_rate=0.0, attention_dropout_rate=0.0, max_length=16, deterministic=True)
PROMPT = np.array([[5, 6, 7], [8, 0, 0], [4, 9, 0]], np.int32)  # real lengths 3, 1, 2; 0 is padding
PROMPT_LENGTHS = np.array([3, 1, 2], np.int32)
MAX_LENGTH = 6


def _token_by_token(step_fn, cache, prompt, max_length):
  """Greedy continuation of one example ``[1, length]``: BOS and the prompt fed one step each, then argmax
  steps; ``(tokens, log P)`` of the continuation (EOS included, padding after it)."""
  logits, cache = step_fn(jnp.full((1, 1), CONFIG.bos_id, jnp.int32), cache)
  for token in prompt:
    logits, cache = step_fn(jnp.full((1, 1), token, jnp.int32), cache)
  tokens, total = [], 0.0
  while len(tokens) < max_length:
    log_probs = np.asarray(jax.nn.log_softmax(logits[0, -1]))
    tokens.append(int(np.argmax(log_probs)))
    total += log_probs[tokens[-1]]
    if tokens[-1] == CONFIG.eos_id:
      break
    logits, cache = step_fn(jnp.full((1, 1), tokens[-1], jnp.int32), cache)
  return tokens + [CONFIG.pad_id] * (max_length - len(tokens)), total


@pytest.mark.slow
@pytest.mark.parametrize("positional_encoding", ["learned", "rotary"])
def test_language_model_prefill_then_decode_equals_token_by_token(positional_encoding):
  model = TransformerLM(CONFIG.replace(positional_encoding=positional_encoding))
  params = model.init(jax.random.key(4), jnp.ones((1, 4), jnp.int32))["params"]  # varied continuations
  cache_length = PROMPT.shape[1] + MAX_LENGTH

  @jax.jit
  def prefilled(params):
    step_fn, prefill_fn, cache = language_model_decoding(model, params, len(PROMPT), cache_length)
    return greedy_search(step_fn, cache, len(PROMPT), MAX_LENGTH, CONFIG.bos_id, CONFIG.eos_id, CONFIG.pad_id,
                         prompt=PROMPT, prompt_lengths=PROMPT_LENGTHS, prefill_fn=prefill_fn)

  tokens, log_probs = map(np.asarray, prefilled(params))
  step_fn, _, cache = language_model_decoding(model, params, 1, cache_length)
  step_fn = jax.jit(step_fn)
  for row, length in enumerate(PROMPT_LENGTHS):
    expected_tokens, expected_log_prob = _token_by_token(step_fn, cache, PROMPT[row, :length], MAX_LENGTH)
    np.testing.assert_array_equal(tokens[row], expected_tokens)
    np.testing.assert_allclose(log_probs[row], expected_log_prob, atol=1e-4)
  assert len({tuple(t) for t in tokens}) == len(tokens)  # the prompts lead to different continuations


@pytest.mark.slow
def test_encoder_decoder_prefill_then_decode_equals_token_by_token():
  source = jnp.array([[3, 4, 5, 6], [6, 5, 0, 0], [7, 3, 9, 0]], jnp.int32)
  model = EncoderDecoder(CONFIG)
  params = model.init(jax.random.key(2), source, source)["params"]
  tokens, log_probs = map(np.asarray, search_decode(CONFIG, params, source, MAX_LENGTH, DecodeSettings("greedy"),
                                                     PROMPT, PROMPT_LENGTHS))
  for row, length in enumerate(PROMPT_LENGTHS):
    step_fn, _, cache = encoder_decoder_decoding(model, params, source[row:row + 1], length + MAX_LENGTH)
    expected_tokens, expected_log_prob = _token_by_token(jax.jit(step_fn), cache, PROMPT[row, :length], MAX_LENGTH)
    np.testing.assert_array_equal(tokens[row, 0], expected_tokens)
    np.testing.assert_allclose(log_probs[row, 0], expected_log_prob, atol=1e-4)

  # Beam search and sampling read the prompt once per example, then copy the cache per beam or sample.
  beams, _ = search_decode(CONFIG, params, source, MAX_LENGTH, DecodeSettings("beam", beam_size=1, length_penalty=0.0),
                           PROMPT, PROMPT_LENGTHS)
  np.testing.assert_array_equal(beams[:, 0], tokens[:, 0])
  samples, _ = search_decode(CONFIG, params, source, MAX_LENGTH,
                             DecodeSettings("sample", temperature=1e-4, num_samples=2), PROMPT, PROMPT_LENGTHS)
  np.testing.assert_array_equal(samples, np.repeat(tokens, 2, axis=1))


def test_a_prompt_needs_its_lengths_and_a_prefill_function():
  with pytest.raises(ValueError, match="prompt_lengths"):
    beam_search(lambda tokens, cache: None, {}, 1, 2, 3, 1, 2, prompt=PROMPT)
  with pytest.raises(ValueError, match="prefill_fn"):
    search(DecodeSettings(), lambda tokens, cache: None, {}, 1, 3, 1, 2, prompt=PROMPT, prompt_lengths=PROMPT_LENGTHS)
