"""Models: cached decoding equals teacher forcing, chunked equals dense, causality, padding invariance."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops
from transformer.nn import (CROSS_CACHE, ClassifierConfig, Encoder, EncoderClassifier, EncoderDecoder, ModelConfig,
                            RNNConfig, RNNEncoderDecoder, TransformerLM, cross_attention_cache, unboxed)

# One layer each keeps compilation short; decoding uses two decoder layers, so that a cached layer feeds
# another cached layer.
CONFIG = ModelConfig(vocab_size=13, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
                     dropout_rate=0.0, attention_dropout_rate=0.0, max_length=16, deterministic=True)
DECODING_CONFIG = CONFIG.replace(num_decoder_layers=2, attention_chunk_size=2)
RNN_CONFIG = RNNConfig(vocab_size=13, embedding_dim=8, hidden_dim=12, dropout_rate=0.0, deterministic=True)
BATCH = 2


def _tokens(seed, length, padding_from=None):
  """Random non-special tokens ``[BATCH, length]``; example 1 is padded from ``padding_from`` on."""
  tokens = np.random.default_rng(seed).integers(3, CONFIG.vocab_size, (BATCH, length))
  if padding_from is not None:
    tokens[1, padding_from:] = CONFIG.pad_id
  return jnp.asarray(tokens, jnp.int32)


def _decode_step_by_step(step, cache, decoder_inputs):
  logits = []
  for position in range(decoder_inputs.shape[1]):
    step_logits, cache = step(cache, decoder_inputs[:, position:position + 1])
    logits.append(step_logits)
  return jnp.concatenate(logits, axis=1)


DECODING_CASES = [pytest.param("sinusoidal", "dense", id="sinusoidal"), pytest.param("learned", "dense", id="learned"),
                  pytest.param("rotary", "dense", id="rotary")]


@pytest.mark.slow
@pytest.mark.parametrize("cross_cache", [False, True], ids=["cross-projected-each-step", "cross-cache"])
@pytest.mark.parametrize("positional_encoding, implementation", DECODING_CASES)
def test_encoder_decoder_cached_decoding_equals_teacher_forcing(positional_encoding, implementation, cross_cache):
  config = DECODING_CONFIG.replace(positional_encoding=positional_encoding, attention_implementation=implementation)
  source, targets = _tokens(0, 6, padding_from=4), _tokens(1, 5)
  model = EncoderDecoder(config)
  variables = model.init(jax.random.key(0), source, targets)
  assert CROSS_CACHE not in variables  # filled only on request: init values would be stale for other sources
  params = variables["params"]
  full = jax.jit(model.apply)({"params": params}, source, targets)

  decoding = EncoderDecoder(config.replace(decode=True))
  encoded = decoding.apply({"params": params}, source, method=EncoderDecoder.encode)
  np.testing.assert_allclose(encoded, model.apply({"params": params}, source, method=EncoderDecoder.encode),
                             atol=1e-6)
  cache = decoding.init(jax.random.key(0), encoded, source, jnp.zeros_like(targets),
                        method=EncoderDecoder.decode)["cache"]
  assert "encoder" not in cache  # the source is encoded whole, with no cache
  variables = {"params": params}
  if cross_cache:
    variables[CROSS_CACHE] = cross_attention_cache(model, params, encoded, source)
    leaves = jax.tree.leaves(variables[CROSS_CACHE])  # keys and values [batch, source_length, heads, head_dim]
    assert len(leaves) == 2 * config.num_decoder_layers and all(x.shape == (BATCH, 6, 2, 8) for x in leaves)

  @jax.jit
  def step_with(variables, cache, token):
    logits, variables_out = decoding.apply({**variables, "cache": cache}, encoded, source, token,
                                           method=EncoderDecoder.decode, mutable=["cache"])
    return logits, variables_out["cache"]

  decoder_inputs = ops.shift_right(targets, config.bos_id)
  stepwise = _decode_step_by_step(lambda *args: step_with(variables, *args), cache, decoder_inputs)
  np.testing.assert_allclose(stepwise, full, atol=1e-5, rtol=1e-5)
  if cross_cache:  # the steps read the cached keys and values rather than projecting the encoder again
    zeroed = {**variables, CROSS_CACHE: jax.tree.map(jnp.zeros_like, variables[CROSS_CACHE])}
    assert not np.allclose(_decode_step_by_step(lambda *args: step_with(zeroed, *args), cache, decoder_inputs),
                           full, atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("positional_encoding, implementation",
                         DECODING_CASES + [pytest.param("rotary", "chunked", id="rotary-chunked")])
def test_language_model_cached_decoding_equals_teacher_forcing(positional_encoding, implementation):
  config = DECODING_CONFIG.replace(positional_encoding=positional_encoding, attention_implementation=implementation)
  tokens = _tokens(2, 6)
  model = TransformerLM(config)
  params = model.init(jax.random.key(0), tokens)["params"]
  full = jax.jit(model.apply)({"params": params}, tokens)
  assert full.shape == (BATCH, 6, config.vocab_size) and full.dtype == jnp.float32

  decoding = TransformerLM(config.replace(decode=True))
  cache = decoding.init(jax.random.key(0), jnp.zeros_like(tokens))["cache"]

  @jax.jit
  def step(cache, token):
    logits, variables = decoding.apply({"params": params, "cache": cache}, token, mutable=["cache"])
    return logits, variables["cache"]

  stepwise = _decode_step_by_step(step, cache, ops.shift_right(tokens, config.bos_id))
  np.testing.assert_allclose(stepwise, full, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_chunked_attention_gives_the_dense_model():
  """Ragged chunks (2 into lengths 5 and 7) with padding on both sides: same logits as dense attention."""
  source, targets = _tokens(3, 7, padding_from=4), _tokens(4, 5, padding_from=3)
  dense, chunked = (EncoderDecoder(CONFIG.replace(attention_implementation=name, attention_chunk_size=2))
                    for name in ("dense", "chunked"))
  params = dense.init(jax.random.key(0), source, targets)["params"]
  expected = jax.jit(dense.apply)({"params": params}, source, targets)
  np.testing.assert_allclose(jax.jit(chunked.apply)({"params": params}, source, targets), expected,
                             atol=1e-5, rtol=1e-5)


def _influence_of_positions(model, params, tokens):
  """``[batch, i, j]``: sum |d logits[i] / d position_table[j]| for the decoder's learned positions.

  A learned position row ``j`` is added at decoder input position ``j`` only, so this is the gradient of
  output ``i`` w.r.t. input position ``j``.
  """
  def logits_of_table(table):
    new_params = jax.tree_util.tree_map(lambda x: x, params)
    new_params["decoder"]["embedder"]["positions"]["position_table"] = table
    return model(new_params)

  table = params["decoder"]["embedder"]["positions"]["position_table"]
  jacobian = np.asarray(jax.jit(jax.jacrev(logits_of_table))(table))  # [batch, i, vocab, max_length, d]
  return np.abs(jacobian).sum(axis=(2, 4))[:, :, :tokens.shape[1]]


@pytest.mark.slow
def test_language_model_and_decoder_are_causal():
  """d logits[i] / d input[j] is exactly zero for j > i: nothing leaks from later positions."""
  config = CONFIG.replace(positional_encoding="learned")
  tokens = _tokens(5, 5)
  future = np.triu(np.ones((5, 5), bool), k=1)

  lm = TransformerLM(config)
  params = unboxed(lm.init(jax.random.key(0), tokens)["params"])
  influence = _influence_of_positions(lambda p: lm.apply({"params": p}, tokens), params, tokens)
  assert (influence[:, future] == 0).all() and (influence[:, ~future] > 0).all()

  translation = EncoderDecoder(config)
  source = _tokens(6, 4, padding_from=2)
  params = unboxed(translation.init(jax.random.key(0), source, tokens)["params"])
  influence = _influence_of_positions(lambda p: translation.apply({"params": p}, source, tokens), params, tokens)
  assert (influence[:, future] == 0).all() and (influence[:, ~future] > 0).all()


@pytest.mark.slow
def test_appending_source_padding_leaves_outputs_unchanged():
  source, targets = _tokens(7, 5, padding_from=3), _tokens(8, 4)
  longer_source = jnp.concatenate([source, jnp.full((BATCH, 3), CONFIG.pad_id, jnp.int32)], axis=1)
  model = EncoderDecoder(CONFIG)
  params = model.init(jax.random.key(0), source, targets)["params"]

  @jax.jit
  def encoded_and_logits(source):
    encoded = model.apply({"params": params}, source, method=EncoderDecoder.encode)
    return encoded, model.apply({"params": params}, encoded, source, ops.shift_right(targets, CONFIG.bos_id),
                                method=EncoderDecoder.decode)

  encoded, logits = encoded_and_logits(source)
  longer_encoded, longer_logits = encoded_and_logits(longer_source)
  real = np.asarray(source != CONFIG.pad_id)
  np.testing.assert_allclose(np.asarray(longer_encoded)[:, :5][real], np.asarray(encoded)[real], atol=1e-5)
  np.testing.assert_allclose(longer_logits, logits, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("model", [EncoderDecoder(CONFIG), RNNEncoderDecoder(RNN_CONFIG)], ids=["transformer", "rnn"])
def test_decoder_logits_index_projects_only_that_position(model):
  source, targets = _tokens(9, 5, padding_from=3), _tokens(10, 6)
  params = model.init(jax.random.key(0), source, targets)["params"]
  encoded = model.apply({"params": params}, source, method=EncoderDecoder.encode)
  decoder_inputs = ops.shift_right(targets, CONFIG.bos_id)

  @jax.jit
  def logits_at(index):  # a traced index: one compiled program serves every position
    return model.apply({"params": params}, encoded, source, decoder_inputs, logits_index=index,
                       method=EncoderDecoder.decode)

  full = model.apply({"params": params}, encoded, source, decoder_inputs, method=EncoderDecoder.decode)
  for index in range(targets.shape[1]):
    one = logits_at(jnp.int32(index))
    assert one.shape == (BATCH, 1, full.shape[-1])
    np.testing.assert_allclose(one[:, 0], full[:, index], atol=1e-5)


@pytest.mark.slow
def test_bfloat16_tied_output_projection_accumulates_in_float32():
  """In bfloat16 the tied projection multiplies bfloat16 operands but returns float32 sums: logits close to
  the float32 model's (same parameters), and not merely bfloat16 values cast up."""
  config = CONFIG.replace(d_model=64, num_heads=4, d_ff=64, vocab_size=512)
  source, targets = _tokens(11, 7), _tokens(12, 6)
  params = EncoderDecoder(config).init(jax.random.key(0), source, targets)["params"]
  logits = {dtype: EncoderDecoder(config.replace(dtype=dtype)).apply({"params": params}, source, targets)
            for dtype in ("float32", "bfloat16")}
  low = np.asarray(logits["bfloat16"])
  assert low.dtype == np.float32
  rounded = np.asarray(jnp.asarray(low).astype(jnp.bfloat16).astype(jnp.float32))
  assert np.mean(low != rounded) > 0.5  # float32 results; a bfloat16 product would round every one
  error = np.abs(low - np.asarray(logits["float32"])).max() / np.abs(np.asarray(logits["float32"])).max()
  assert error < 0.05, error


@pytest.mark.slow
def test_encoder_classifier_shape_and_mean_pooling_ignores_padding():
  config = ClassifierConfig(**{**dataclasses.asdict(CONFIG), "num_classes": 3})
  tokens = _tokens(9, 6, padding_from=2)
  classifier = EncoderClassifier(config)
  params = unboxed(classifier.init(jax.random.key(0), tokens)["params"])
  apply = jax.jit(classifier.apply)
  logits = apply({"params": params}, tokens)
  assert logits.shape == (BATCH, 3) and logits.dtype == jnp.float32

  # Reference: the mean of the encoder outputs over real tokens only, then the linear classifier.
  encoded = np.asarray(Encoder(config).apply({"params": params["encoder"]}, tokens), np.float64)
  real = np.asarray(tokens != config.pad_id)
  pooled = np.stack([encoded[b][real[b]].mean(0) for b in range(BATCH)])
  expected = pooled @ np.asarray(params["classifier"]["kernel"]) + np.asarray(params["classifier"]["bias"])
  np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=1e-5)

  # More padding changes nothing; the same tokens with padding counted in the mean would.
  longer = jnp.concatenate([tokens, jnp.full((BATCH, 4), config.pad_id, jnp.int32)], axis=1)
  np.testing.assert_allclose(apply({"params": params}, longer), logits, atol=1e-5)
  assert np.abs(encoded[1].mean(0) - pooled[1]).max() > 1e-3

  first = EncoderClassifier(config.replace(pooling="first"))
  expected = encoded[:, 0] @ np.asarray(params["classifier"]["kernel"]) + np.asarray(params["classifier"]["bias"])
  np.testing.assert_allclose(first.apply({"params": params}, tokens), expected, atol=1e-5, rtol=1e-5)


def test_bert_style_embeddings_add_token_types_then_normalise():
  """num_token_types and embedding_norm (BERT): LayerNorm(word + position + token type), against numpy."""
  config = CONFIG.replace(num_encoder_layers=0, positional_encoding="learned", scale_embeddings=False,
                          num_token_types=2, embedding_norm=True, norm_epsilon=1e-12)
  tokens = _tokens(11, 5)
  token_types = jnp.asarray([[0, 0, 1, 1, 1], [0, 1, 0, 1, 0]])
  encoder = Encoder(config)
  params = unboxed(encoder.init(jax.random.key(0), tokens, token_types)["params"])
  embedder = params["embedder"]
  # Non-trivial norm parameters, so that the test sees where they apply.
  embedder["embedding_norm"] = {"scale": jnp.linspace(0.5, 1.5, config.d_model),
                                "bias": jnp.linspace(-0.2, 0.2, config.d_model)}
  summed = (np.asarray(params["embedding"]["embedding"])[np.asarray(tokens)]
            + np.asarray(embedder["positions"]["position_table"])[:5]
            + np.asarray(embedder["token_type_embedding"]["embedding"])[np.asarray(token_types)]).astype(np.float64)
  normalised = (summed - summed.mean(-1, keepdims=True)) / np.sqrt(summed.var(-1, keepdims=True) + 1e-12)
  expected = normalised * np.asarray(embedder["embedding_norm"]["scale"]) + np.asarray(
      embedder["embedding_norm"]["bias"])
  np.testing.assert_allclose(encoder.apply({"params": params}, tokens, token_types), expected, atol=1e-5)
  # Token types default to 0.
  np.testing.assert_allclose(encoder.apply({"params": params}, tokens),
                             encoder.apply({"params": params}, tokens, jnp.zeros_like(tokens)), atol=0)


@pytest.mark.slow
def test_bert_fields_off_add_no_parameters_and_token_types_need_a_table():
  tokens = _tokens(12, 4)
  params = Encoder(CONFIG).init(jax.random.key(0), tokens)["params"]
  assert "embedder" not in params  # sinusoidal positions, no token types, no embedding norm
  with_bert_fields = Encoder(CONFIG.replace(num_token_types=2, embedding_norm=True)).init(
      jax.random.key(0), tokens)["params"]
  assert set(with_bert_fields["embedder"]) == {"token_type_embedding", "embedding_norm"}
  with pytest.raises(ValueError, match="num_token_types=0"):
    Encoder(CONFIG).init(jax.random.key(0), tokens, jnp.zeros_like(tokens))


def test_encoder_reads_continuous_inputs_through_a_projection_with_a_valid_mask():
  """A Dense layer in place of the token table (the forecasters' use): on one-hot rows with the table as
  its kernel it gives the token encoder's output, and ``valid`` hides positions as padding tokens do."""
  tokens = _tokens(0, 5, padding_from=3)
  params = Encoder(CONFIG).init(jax.random.key(0), tokens)["params"]
  encoded = Encoder(CONFIG).apply({"params": params}, tokens)

  projected = Encoder(CONFIG, nn.Dense(CONFIG.d_model))
  projected_params = dict(params, embedding={"kernel": params["embedding"]["embedding"],
                                             "bias": jnp.zeros(CONFIG.d_model)})
  one_hot = jax.nn.one_hot(tokens, CONFIG.vocab_size)  # [batch, length, vocab_size] continuous inputs
  valid = tokens != CONFIG.pad_id
  apply = lambda inputs, valid: projected.apply({"params": projected_params}, inputs, valid=valid)
  np.testing.assert_allclose(apply(one_hot, valid), encoded, atol=1e-5)
  # Hidden positions are not read, whatever they hold; shown to the encoder, they are.
  changed = one_hot.at[1, 3:].set(5.0)
  np.testing.assert_allclose(apply(changed, valid)[1, :3], encoded[1, :3], atol=1e-5)
  assert not np.allclose(apply(changed, jnp.ones_like(valid))[1, :3], encoded[1, :3], atol=1e-3)


@pytest.mark.slow
def test_kernels_auto_and_reference_give_the_same_model_and_cached_decoding():
  """The whole encoder-decoder (pre-LN, rotary): same teacher-forced logits and gradients with either
  setting, and the reference kernels' cached decoding equals their teacher forcing."""
  config = DECODING_CONFIG.replace(positional_encoding="rotary", norm_position="pre")
  source, targets = _tokens(2, 6, padding_from=4), _tokens(3, 5)
  params = EncoderDecoder(config).init(jax.random.key(0), source, targets)["params"]

  def logits_and_grads(kernels):
    model = EncoderDecoder(config.replace(kernels=kernels))
    loss = lambda params: (lambda logits: (jnp.sum(jnp.sin(logits)), logits))(
        model.apply({"params": params}, source, targets))
    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return logits, grads

  (auto_logits, auto_grads), (reference_logits, reference_grads) = (logits_and_grads("auto"),
                                                                    logits_and_grads("reference"))
  np.testing.assert_allclose(auto_logits, reference_logits, atol=1e-5, rtol=1e-5)
  for auto_grad, reference_grad in zip(jax.tree.leaves(auto_grads), jax.tree.leaves(reference_grads)):
    np.testing.assert_allclose(auto_grad, reference_grad, atol=1e-5, rtol=1e-5)

  decoding = EncoderDecoder(config.replace(decode=True, kernels="reference"))
  encoded = decoding.apply({"params": params}, source, method=EncoderDecoder.encode)
  cache = decoding.init(jax.random.key(0), encoded, source, jnp.zeros_like(targets),
                        method=EncoderDecoder.decode)["cache"]

  @jax.jit
  def step(cache, token):
    logits, variables = decoding.apply({"params": params, "cache": cache}, encoded, source, token,
                                       method=EncoderDecoder.decode, mutable=["cache"])
    return logits, variables["cache"]

  stepwise = _decode_step_by_step(step, cache, ops.shift_right(targets, config.bos_id))
  np.testing.assert_allclose(stepwise, reference_logits, atol=1e-5, rtol=1e-5)
