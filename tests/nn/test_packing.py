"""Packed rows: several examples in one row, told apart by segment ids, compute what each example computes alone
(attention masks, positions, the shifted decoder inputs), so their loss and gradients are the unpacked ones."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops
from transformer.nn import EncoderDecoder, ModelConfig, TransformerLM

CONFIG = ModelConfig(vocab_size=19, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=2,
                     dropout_rate=0.0, attention_dropout_rate=0.0, max_length=32, deterministic=True,
                     attention_chunk_size=4)
# (source length, target length) of the examples packed into one row of 16 source and 14 target positions.
LENGTHS = [(5, 4), (3, 6), (6, 3)]
SOURCE_ROW, TARGET_ROW = 16, 14


def _examples(seed):
  rng = np.random.default_rng(seed)
  return [(rng.integers(3, CONFIG.vocab_size, s), rng.integers(3, CONFIG.vocab_size, t)) for s, t in LENGTHS]


def _pack(sequences, row_length):
  """One row: the sequences one after another, segment ids 1, 2, ..., then padding (id 0)."""
  tokens, segments = np.zeros([1, row_length], np.int32), np.zeros([1, row_length], np.int32)
  start = 0
  for segment, sequence in enumerate(sequences, start=1):
    tokens[0, start:start + len(sequence)] = sequence
    segments[0, start:start + len(sequence)] = segment
    start += len(sequence)
  return jnp.asarray(tokens), jnp.asarray(segments)


def test_segment_positions_and_shift_right_restart_per_segment():
  segments = jnp.array([[1, 1, 1, 2, 2, 0, 0], [1, 2, 2, 2, 3, 3, 3]])
  np.testing.assert_array_equal(ops.segment_positions(segments), [[0, 1, 2, 0, 1, 0, 1], [0, 0, 1, 2, 0, 1, 2]])
  tokens = jnp.array([[5, 6, 7, 8, 9, 0, 0], [5, 6, 7, 8, 9, 4, 3]])
  np.testing.assert_array_equal(ops.shift_right(tokens, 1, segments=segments),
                                [[1, 5, 6, 1, 8, 1, 0], [1, 1, 6, 7, 1, 9, 4]])


@pytest.mark.parametrize("chunked", [False, True], ids=["dense", "chunked"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_attention_never_crosses_segments(causal, chunked):
  """``ops.attend`` over a packed row equals attention over each segment alone (padding rows out zeros)."""
  keys = jax.random.split(jax.random.key(0), 3)
  query, key, value = (jax.random.normal(k, (1, 12, 2, 8)) for k in keys)
  segments = jnp.array([[1, 1, 1, 1, 1, 2, 2, 3, 3, 3, 0, 0]])
  kernels = ops.select_kernels("reference", attention_chunk_size=4 if chunked else None)
  packed = ops.attend(query, key, value, query_valid=segments > 0, key_valid=segments > 0, causal=causal,
                      query_segments=segments, key_segments=segments, kernels=kernels)
  for start, stop in ((0, 5), (5, 7), (7, 10)):
    alone = ops.attend(query[:, start:stop], key[:, start:stop], value[:, start:stop], causal=causal)
    np.testing.assert_allclose(packed[:, start:stop], alone, atol=1e-5)
  np.testing.assert_array_equal(packed[:, 10:], 0.0)
  with pytest.raises(ValueError, match="both query_segments and key_segments"):
    ops.attend(query, key, value, query_segments=segments)


def _encoder_decoder_logits(config, seed):
  """The packed row's logits and each example's own, at its real target positions."""
  examples = _examples(seed)
  source, source_segments = _pack([s for s, _ in examples], SOURCE_ROW)
  target, target_segments = _pack([t for _, t in examples], TARGET_ROW)
  model = EncoderDecoder(config)
  params = model.init(jax.random.key(0), source, target)["params"]
  packed = model.apply({"params": params}, source, target, source_segments, target_segments)
  start, pairs = 0, []
  for example_source, example_target in examples:
    alone = model.apply({"params": params}, jnp.asarray(example_source[None]), jnp.asarray(example_target[None]))
    pairs.append((packed[0, start:start + len(example_target)], alone[0]))
    start += len(example_target)
  return pairs


@pytest.mark.parametrize("positional_encoding", ["sinusoidal", "learned", "rotary"])
@pytest.mark.parametrize("implementation", ["dense", "chunked"])
def test_a_packed_encoder_decoder_row_computes_each_example_alone(positional_encoding, implementation):
  config = CONFIG.replace(positional_encoding=positional_encoding, attention_implementation=implementation)
  for packed, alone in _encoder_decoder_logits(config, seed=1):
    np.testing.assert_allclose(packed, alone, atol=2e-5)


def test_a_packed_language_model_row_computes_each_text_alone():
  config = CONFIG.replace(positional_encoding="rotary")
  texts = [t for _, t in _examples(2)]
  tokens, segments = _pack(texts, TARGET_ROW)
  model = TransformerLM(config)
  params = model.init(jax.random.key(0), tokens)["params"]
  packed = model.apply({"params": params}, tokens, segments=segments)
  start = 0
  for text in texts:
    alone = model.apply({"params": params}, jnp.asarray(text[None]))
    np.testing.assert_allclose(packed[0, start:start + len(text)], alone[0], atol=2e-5)
    start += len(text)


@pytest.mark.slow
def test_packed_loss_and_gradients_equal_the_unpacked_examples():
  """The summed token loss of one packed row and its gradient equal those of the examples in a padded batch
  (dropout off, CONFIG: its draws differ between the two layouts)."""
  config = CONFIG.replace(positional_encoding="learned")
  examples = _examples(3)
  source, source_segments = _pack([s for s, _ in examples], SOURCE_ROW)
  target, target_segments = _pack([t for _, t in examples], TARGET_ROW)
  padded_source = jnp.asarray([np.pad(s, (0, SOURCE_ROW - len(s))) for s, _ in examples], jnp.int32)
  padded_target = jnp.asarray([np.pad(t, (0, TARGET_ROW - len(t))) for _, t in examples], jnp.int32)
  model = EncoderDecoder(config)
  params = model.init(jax.random.key(0), source, target)["params"]

  def summed_loss(params, source, target, *segments):
    logits = model.apply({"params": params}, source, target, *segments)
    weights = (target != config.pad_id).astype(jnp.float32)
    return jnp.sum(ops.softmax_cross_entropy(logits, target, label_smoothing=0.1) * weights)

  packed_loss, packed_gradients = jax.value_and_grad(summed_loss)(params, source, target, source_segments,
                                                                  target_segments)
  loss, gradients = jax.value_and_grad(summed_loss)(params, padded_source, padded_target)
  np.testing.assert_allclose(packed_loss, loss, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), packed_gradients, gradients)
