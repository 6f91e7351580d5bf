"""Checkpoints hold parameters per layer whatever config.model.scan_layers says: a state saved with the layers
unrolled restores onto a scanned model and the reverse, optimizer moments included, each array placed by the
target's sharding (FSDP and tensor parallelism on the 8 test devices)."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from transformer.nn import ModelConfig, TransformerLM, stack_layers, unstack_layers
from transformer.train.checkpoint import Checkpointer, SavedParams
from transformer.train.config import logical_axis_rules
from transformer.train.mesh import MeshStrategy
from transformer.train import run
from transformer.train.state import create_train_state, load_params

CONFIG = ModelConfig(vocab_size=18, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=0, num_decoder_layers=3,
                     dropout_rate=0.0, attention_dropout_rate=0.0, max_length=16)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(3, CONFIG.vocab_size, (8, 6)), jnp.int32)


def _state_and_target(scan_layers: bool):
  """A trained-once state of the 3-layer language model under FSDP x tensor parallelism, and its restore target."""
  model, optimizer = TransformerLM(CONFIG.replace(scan_layers=scan_layers)), optax.adam(1e-2)
  strategy = MeshStrategy(tensor_parallelism=2, rules=logical_axis_rules(fsdp=True))

  def create(key):
    return create_train_state(model, optimizer, (TOKENS,), key)
  target = strategy.abstract_canonical(jax.eval_shape(create, jax.random.key(0)))
  state = strategy.create_state(create, jax.random.key(0))
  gradients = jax.tree.map(jnp.ones_like, state.params)  # non-zero moments, so that a mix-up shows
  updates, opt_state = optimizer.update(gradients, state.opt_state, state.params)
  return state.replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state), target


@pytest.mark.parametrize("saved_scanned", [False, True], ids=["unrolled-to-scanned", "scanned-to-unrolled"])
def test_a_state_saved_in_one_layout_restores_in_the_other(tmp_path, saved_scanned):
  saved, _ = _state_and_target(saved_scanned)
  _, target = _state_and_target(not saved_scanned)
  checkpointer = Checkpointer(str(tmp_path), asynchronous=False)
  checkpointer.save(1, saved, extra={"position": 0})
  checkpointer.wait()
  on_disk = ocp.StandardCheckpointer().restore(os.path.join(tmp_path, "checkpoints", "1", "state"))
  assert {"layer_0", "layer_1", "layer_2"} <= set(on_disk["params"]["decoder"])  # per layer on disk
  assert "layers" not in on_disk["params"]["decoder"] and "layer_2" in on_disk["opt_state"][0]["mu"]["decoder"]

  step, restored, extra = Checkpointer(str(tmp_path), asynchronous=False).restore(target)
  assert step == 1 and extra["position"] == 0
  expected = stack_layers(unstack_layers(saved), target)  # the saved values in the target's layout
  assert jax.tree.structure(restored) == jax.tree.structure(target)
  jax.tree.map(np.testing.assert_array_equal, (restored.step, restored.params, restored.opt_state),
               (expected.step, expected.params, expected.opt_state))
  for leaf, like in zip(jax.tree.leaves(restored), jax.tree.leaves(target)):
    assert leaf.sharding.is_equivalent_to(like.sharding, leaf.ndim), (leaf.sharding, like.sharding)
  assert ("layer_1" if saved_scanned else "layers") in restored.params["decoder"]

  # The parameters alone, as transformer.load reads them (the optimizer state stays on disk).
  _, params_only, _ = Checkpointer(str(tmp_path), asynchronous=False).restore(SavedParams(target.params))
  jax.tree.map(np.testing.assert_array_equal, params_only.params, expected.params)


@pytest.mark.slow
def test_a_run_trained_unrolled_resumes_scanned_and_loads_either_way(make_config, tmp_path):
  """Two steps unrolled, then two more scanned in the same workdir, equal a run of four unrolled steps (dropout
  off: the scanned stack draws its dropout keys per layer otherwise); its parameters load in either layout."""
  def config(steps, scan_layers):
    return make_config(num_train_steps=steps, checkpoint_every=2, eval_every=2, log_every=2,
                       model__num_encoder_layers=2, model__num_decoder_layers=2, model__dropout_rate=0.0,
                       model__attention_dropout_rate=0.0, model__scan_layers=scan_layers)
  reference = run(config(4, False), str(tmp_path / "reference"))
  run(config(2, False), str(tmp_path / "switched"))
  switched = run(config(4, True), str(tmp_path / "switched"))
  assert switched.step == 4 and "layers" in switched.state.params["decoder"]
  np.testing.assert_allclose(switched.metrics["eval/loss"], reference.metrics["eval/loss"], rtol=1e-5)
  _assert_close(unstack_layers(switched.state.params), reference.state.params)
  loaded = load_params(str(tmp_path / "switched"), config=config(4, False))  # as an unrolled model
  assert "layer_1" in loaded.params["encoder"]
  _assert_close(loaded.params, reference.state.params)
  loaded = load_params(str(tmp_path / "switched"), config=config(4, True))  # as a scanned one
  _assert_close(unstack_layers(loaded.params), reference.state.params)


def _assert_close(actual, expected):
  # Adam turns float rounding in a near-zero gradient into steps of up to the learning rate: atol covers a few;
  # a layout mix-up moves parameters by their own scale (~0.1).
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=5e-5),
               actual, expected)
