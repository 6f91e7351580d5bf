"""Rematerialisation (ModelConfig.remat): the same function, parameters and gradients under every policy, and less
memory planned for the backward pass."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops
from transformer.errors import ConfigError
from transformer.nn import EncoderDecoder, ModelConfig, TransformerLM
from transformer.nn.config import REMAT_POLICIES

# Dropout on: the recomputed forward pass must draw the same masks as the first one.
CONFIG = ModelConfig(vocab_size=17, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
                     dropout_rate=0.2, attention_dropout_rate=0.2, max_length=16)


def _tokens(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).integers(3, CONFIG.vocab_size, shape), jnp.int32)


def _loss_and_gradients(model, params, inputs, targets):
  def loss(params):
    logits = model.apply({"params": params}, *inputs, rngs={"dropout": jax.random.key(7)})
    return ops.softmax_cross_entropy(logits, targets).mean()
  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("model_class", [pytest.param(EncoderDecoder, id="encoder-decoder", marks=pytest.mark.slow),
                                         pytest.param(TransformerLM, id="language-model")])
def test_every_policy_gives_the_same_parameters_loss_and_gradients(model_class):
  source, target = _tokens(0, (3, 7)), _tokens(1, (3, 6))
  inputs = (source, target) if model_class is EncoderDecoder else (target,)
  results = {}
  for policy in REMAT_POLICIES:
    model = model_class(CONFIG.replace(remat=policy))
    params = model.init(jax.random.key(0), *inputs)["params"]
    if results:  # the same names and initial values: checkpoints move between policies
      reference_params = results["none"][0]
      assert jax.tree.structure(params) == jax.tree.structure(reference_params)
      jax.tree.map(np.testing.assert_array_equal, params, reference_params)
    results[policy] = (params, *_loss_and_gradients(model, params, inputs, target))
  _, loss, gradients = results["none"]
  for policy in ("dots", "full"):
    _, policy_loss, policy_gradients = results[policy]
    np.testing.assert_allclose(policy_loss, loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), policy_gradients, gradients)


def test_policies_recompute_what_they_do_not_keep():
  """The gradient's program (StableHLO, before XLA) holds each matmul the backward pass needs, plus the forward
  ones a policy recomputes: "full" recomputes every forward matmul, "dots" only those with batch dimensions
  (attention's scores and weighted values), "none" none. (What that saves is measured on a GPU by
  benchmarks/remat.py: XLA:CPU's memory plan does not shrink with rematerialisation.)"""
  source, target = _tokens(2, (2, 8)), _tokens(3, (2, 8))
  dots = {}
  for policy in REMAT_POLICIES:
    model = EncoderDecoder(CONFIG.replace(remat=policy))
    params = model.init(jax.random.key(0), source, target)["params"]

    def loss(params):
      logits = model.apply({"params": params}, source, target, rngs={"dropout": jax.random.key(7)})
      return ops.softmax_cross_entropy(logits, target).mean()
    dots[policy] = jax.jit(jax.grad(loss)).lower(params).as_text().count("stablehlo.dot_general")
  # Per layer: encoder self attention 2 batched + 6 projections and feed-forward matmuls; decoder 4 + 10.
  layers = CONFIG.num_encoder_layers
  assert dots["dots"] - dots["none"] == layers * (2 + 4), dots
  assert dots["full"] - dots["none"] == layers * (8 + 14), dots


def test_evaluation_and_decoding_are_not_rematerialised():
  from transformer.nn.layers import EncoderLayer
  from transformer.nn.models import training_layer
  config = CONFIG.replace(remat="full")
  assert training_layer(EncoderLayer, config) is not EncoderLayer
  assert training_layer(EncoderLayer, config.replace(deterministic=True)) is EncoderLayer
  assert training_layer(EncoderLayer, config.replace(decode=True)) is EncoderLayer


def test_an_unknown_policy_is_refused_naming_the_choices():
  with pytest.raises(ConfigError, match="remat='dot'.*'none', 'dots', 'full'"):
    ModelConfig(remat="dot")
