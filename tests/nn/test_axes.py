"""Logical axis names: every parameter of every model family names each of its axes, so the run layer's rule
table lays out any layer (a new one without names fails here, not silently replicated on every device)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.nn import (ACTIVATION_AXES, LOGICAL_AXES, ClassifierConfig, EncoderClassifier, EncoderDecoder,
                            ModelConfig, RNNConfig, RNNEncoderDecoder, TransformerLM, make_forecaster, unboxed,
                            with_activation_axes, with_axes)
from transformer.nn.forecasters import ARCHITECTURES, ForecasterConfig

TRANSFORMER = ModelConfig(vocab_size=13, d_model=16, num_heads=4, num_kv_heads=2, d_ff=32, num_encoder_layers=1,
                          num_decoder_layers=1, positional_encoding="learned", max_length=8, deterministic=True)
RNN = RNNConfig(vocab_size=11, target_vocab_size=13, embedding_dim=8, hidden_dim=12, num_layers=2, deterministic=True)
TOKENS = jnp.ones((2, 5), jnp.int32)
SERIES = jnp.ones((2, 6, 3), jnp.float32)
FORECASTER = ForecasterConfig(num_features=3, input_length=6, num_horizons=4, d_model=8, num_layers=2, num_heads=2,
                              d_ff=16, patch_length=2, patch_stride=2, deterministic=True)

MODELS = {
    "encoder_decoder": lambda: (EncoderDecoder(TRANSFORMER), TOKENS, TOKENS),
    "untied_encoder_decoder": lambda: (EncoderDecoder(TRANSFORMER.replace(share_embeddings=False,
                                                                          tie_output_embedding=False)), TOKENS, TOKENS),
    "lm": lambda: (TransformerLM(TRANSFORMER), TOKENS),
    # Scanned stacks: each parameter gains a leading "layers" axis, which must carry its name too.
    "scanned_encoder_decoder": lambda: (EncoderDecoder(TRANSFORMER.replace(scan_layers=True, num_decoder_layers=2)),
                                        TOKENS, TOKENS),
    "scanned_lm": lambda: (TransformerLM(TRANSFORMER.replace(scan_layers=True, remat="dots",
                                                             deterministic=False)), TOKENS),
    "bert_classifier": lambda: (EncoderClassifier(ClassifierConfig.from_encoder(
        TRANSFORMER, num_token_types=2, embedding_norm=True, num_classes=3)), TOKENS),
    **{f"rnn_{cell}_{attention}": (lambda cell=cell, attention=attention: (
        RNNEncoderDecoder(RNN.replace(cell=cell, attention=attention)), TOKENS, TOKENS))
       for cell in ("gru", "lstm") for attention in ("bahdanau", "luong_general")},
    **{f"forecaster_{name}": (lambda name=name: (make_forecaster(FORECASTER.replace(architecture=name)), SERIES))
       for name in ARCHITECTURES},
}


@pytest.mark.parametrize("name", MODELS)
def test_every_parameter_names_each_of_its_axes(name):
  model, *inputs = MODELS[name]()
  boxed = jax.eval_shape(model.init, jax.random.key(0), *inputs)["params"]
  leaves = jax.tree_util.tree_flatten_with_path(boxed, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))[0]
  assert leaves
  for path, leaf in leaves:
    where = jax.tree_util.keystr(path)
    assert isinstance(leaf, nn.LogicallyPartitioned), f"{where} has no logical axis names"
    assert len(leaf.names) == len(leaf.value.shape), f"{where}: names {leaf.names} for shape {leaf.value.shape}"
    assert set(leaf.names) <= set(LOGICAL_AXES), f"{where}: {leaf.names}"
    assert len(set(leaf.names)) == len(leaf.names), f"{where}: a name twice, {leaf.names}"
    assert (leaf.names[0] == "layers") == ("['layers']" in where), f"{where}: {leaf.names}"  # stacked: layers first


def test_the_names_do_not_change_the_values_and_apply_takes_either_form():
  model = EncoderDecoder(TRANSFORMER)
  boxed = model.init(jax.random.key(0), TOKENS, TOKENS)["params"]
  plain = unboxed(boxed)
  assert jax.tree.structure(plain) == jax.tree.structure(jax.tree.map(np.asarray, plain))
  np.testing.assert_array_equal(model.apply({"params": boxed}, TOKENS, TOKENS), model.apply({"params": plain},
                                                                                             TOKENS, TOKENS))
  # The same initialiser with and without a box gives the same numbers.
  init = nn.initializers.xavier_uniform()
  np.testing.assert_array_equal(with_axes(init, "embed", "mlp")(jax.random.key(1), (4, 6)).value,
                                init(jax.random.key(1), (4, 6)))


def test_an_unknown_logical_name_is_refused_naming_the_known_ones():
  with pytest.raises(ValueError, match=r"unknown logical axis name\(s\) \['hidden'\]; use one of \['embed'"):
    with_axes(nn.initializers.zeros, "embed", "hidden")


# The activation rules of a data x model mesh, as the run layer's table has them (transformer.train.config).
ACTIVATION_RULES = (("activation_batch", "data"), ("activation_heads", "model"), ("activation_kv_heads", "model"),
                    ("activation_mlp", "model"), ("activation_vocab", "model"))


def test_activation_names_are_their_own_and_constrain_nothing_without_rules_and_a_mesh():
  """A plain ``model.apply`` (no rules, or rules without a mesh) runs as before: the constraints are no-ops."""
  assert not set(ACTIVATION_AXES) & set(LOGICAL_AXES)
  model = EncoderDecoder(TRANSFORMER)
  params = model.init(jax.random.key(0), TOKENS, TOKENS)["params"]
  plain = model.apply({"params": params}, TOKENS, TOKENS)
  with nn.logical_axis_rules(ACTIVATION_RULES):
    np.testing.assert_array_equal(model.apply({"params": params}, TOKENS, TOKENS), plain)
    assert "sharding_constraint" not in jax.jit(model.apply).lower({"params": params}, TOKENS, TOKENS).as_text()


def test_under_a_mesh_and_rules_the_activations_are_constrained_and_the_values_unchanged():
  model = TransformerLM(TRANSFORMER.replace(d_ff=64))
  params = unboxed(model.init(jax.random.key(0), TOKENS)["params"])
  tokens = jnp.tile(TOKENS, (2, 1))  # a batch of 4 over the data axis of 2
  mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                       devices=jax.devices()[:4])

  def apply(params, tokens):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(ACTIVATION_RULES):
      return model.apply({"params": params}, tokens)
  text = jax.jit(apply).lower(params, tokens).as_text()
  assert '<@mesh, [{"data"}, {}, {"model"}, {}]> : tensor<4x5x4x4xf32>' in text  # queries [batch, length, heads, d]
  assert '<@mesh, [{"data"}, {}, {"model"}]> : tensor<4x5x64xf32>' in text  # the feed-forward hidden
  assert '<@mesh, [{"data"}, {}, {}]> : tensor<4x5x16xf32>' in text  # the residual stream
  # Split over the model axis, the output projection sums its heads in another order: equal to float rounding.
  np.testing.assert_allclose(jax.jit(apply)(params, tokens), model.apply({"params": params}, tokens), rtol=1e-5,
                             atol=1e-6)


def test_an_activation_needs_a_known_name_or_none_for_each_axis():
  with pytest.raises(ValueError, match=r"one per axis, each None or one of \['activation_batch'"):
    with_activation_axes(jnp.ones((2, 3)), "activation_batch", "embed")
  with pytest.raises(ValueError, match="for shape \\(2, 3\\)"):
    with_activation_axes(jnp.ones((2, 3)), "activation_batch")
  assert with_activation_axes(jnp.ones((2, 3)), "activation_batch", None).shape == (2, 3)


@pytest.mark.parametrize("rows", [8, 6])  # 6: rows the 4 devices do not divide
def test_split_rows_splits_the_rows_where_a_rule_binds_them_and_returns_every_output_whole(rows):
  from jax.sharding import Mesh, PartitionSpec
  from transformer.nn import split_rows
  mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("hosts", "data"))
  double = jax.jit(lambda x: split_rows(lambda r: {"twice": r * 2, "sums": r.sum(-1)}, x))
  x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
  with jax.set_mesh(mesh), nn.logical_axis_rules((("activation_batch", ("hosts", "data")),)):
    compiled = double.lower(x).compile()
    out = compiled(x)
  assert "f32[2,3]" in compiled.as_text()  # each device doubles its own 2 rows, not all of them
  assert all(leaf.sharding.spec == PartitionSpec() for leaf in jax.tree.leaves(out))
  np.testing.assert_array_equal(out["twice"], x * 2)
  np.testing.assert_array_equal(out["sums"], x.sum(-1))
  alone = double(x)["twice"]  # no mesh bound: fn itself (the bound mesh is part of jit's cache key)
  assert isinstance(alone.sharding, jax.sharding.SingleDeviceSharding)
  np.testing.assert_array_equal(alone, x * 2)
