"""The model-aware searches (``transformer/tasks/decoding.py``): bad arguments named before any cache is built."""
import jax
import numpy as np
import pytest

from tests.train.conftest import load_experiment_config
from transformer.decode import DecodeSettings
from transformer.nn import EncoderDecoder, ModelConfig, TransformerLM
from transformer.train.config import build_task
from transformer.tasks.decoding import beam_decode, continue_prompts, greedy_decode, search_decode

CONFIG = ModelConfig(vocab_size=11, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
                     deterministic=True)


@pytest.mark.parametrize("max_length", [-1, 0, 2.5])
def test_a_max_length_below_one_is_named_before_the_cache_is_sized(max_length):
  """``max_length=-1`` once sized the decoding cache: a TypeError from deep inside JAX (0: an empty search)."""
  source = np.ones((2, 3), np.int32)
  params = EncoderDecoder(CONFIG).init(jax.random.key(0), source, source)["params"]
  expected = rf"max_length must be an integer >= 1 .*got {max_length}"
  with pytest.raises(ValueError, match=expected):
    greedy_decode(CONFIG, params, source, max_length)
  with pytest.raises(ValueError, match=expected):
    beam_decode(CONFIG, params, source, max_length, beam_size=2)
  with pytest.raises(ValueError, match=expected):
    search_decode(CONFIG, params, source, max_length, DecodeSettings("greedy"))
  prompt = np.ones((2, 3), np.int32)
  lm_params = TransformerLM(CONFIG).init(jax.random.key(0), prompt)["params"]
  with pytest.raises(ValueError, match=rf"max_new_tokens must be an integer >= 1 .*got {max_length}"):
    continue_prompts(CONFIG, lm_params, prompt, np.array([3, 1], np.int32), max_length, DecodeSettings("greedy"))


@pytest.mark.parametrize("max_new_tokens", [-1, 0])
def test_continue_texts_names_a_max_new_tokens_below_one_before_reading_anything(max_new_tokens):
  """Checked first: no tokenizer, data or model is needed to refuse it (``model_config`` and ``params`` unused)."""
  task = build_task(load_experiment_config("language_model", "tiny"))
  for prompts in (["a dog"], []):
    with pytest.raises(ValueError, match=rf"max_new_tokens must be an integer >= 1 .*got {max_new_tokens}"):
      task.continue_texts(None, None, prompts, max_new_tokens=max_new_tokens)
