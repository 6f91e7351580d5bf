"""Device fingerprints of a checkpoint's arrays (train/checksums.py): independent of sharding, changed by any
flipped bit or moved value, NaN found; and checkpoints written with the older SHA-256 digests still verified."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer.errors import CheckpointRestoreError
from transformer.train.checkpoint import Checkpointer
from transformer.train.checkpoint import state_checksums, state_fingerprints


def _state(seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return {"kernel": jax.random.normal(keys[0], (8, 16)),
          "half": jax.random.normal(keys[1], (16,)).astype(jnp.bfloat16),
          "count": jnp.arange(5, dtype=jnp.int32), "mask": jnp.array([True, False, False, True]),
          "key": keys[2], "typed_key": jax.random.key(3), "empty": jnp.zeros((0, 4))}


def test_the_same_arrays_on_any_sharding_have_the_same_fingerprints():
  state = _state()
  fingerprints, non_finite = state_fingerprints(state)
  assert set(fingerprints) == {jax.tree_util.keystr((jax.tree_util.DictKey(name),)) for name in state}
  assert not non_finite
  assert fingerprints["['kernel']"].startswith("<f4(8, 16):") and fingerprints["['typed_key']"].startswith("key()")
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
  sharded = dict(state, kernel=jax.device_put(state["kernel"], NamedSharding(mesh, PartitionSpec("data", "model"))),
                 half=jax.device_put(state["half"], NamedSharding(mesh, PartitionSpec("data"))))
  assert len(sharded["kernel"].sharding.device_set) == 8
  assert state_fingerprints(sharded)[0] == fingerprints


@pytest.mark.parametrize("name", ["kernel", "half", "count", "mask"])
def test_one_flipped_bit_or_two_swapped_values_change_a_fingerprint(name):
  state = _state()
  before = state_fingerprints(state)[0]
  leaf = np.array(state[name])
  words = leaf.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[leaf.dtype.itemsize]).reshape(-1)
  flipped = words.copy()
  flipped[1] ^= 1  # the lowest bit of one element
  swapped = words.copy()
  swapped[[0, 2]] = swapped[[2, 0]]
  for changed in (flipped, swapped):
    if name == "mask" and changed is flipped:
      changed = changed & 1  # a bool stays 0 or 1
    altered = dict(state, **{name: jnp.asarray(changed.view(leaf.dtype).reshape(leaf.shape))})
    after = state_fingerprints(altered)[0]
    assert after[f"['{name}']"] != before[f"['{name}']"]
    assert {k: v for k, v in after.items() if k != f"['{name}']"} == {
        k: v for k, v in before.items() if k != f"['{name}']"}


def test_non_finite_leaves_are_named():
  state = dict(_state(), kernel=_state()["kernel"].at[2, 3].set(jnp.nan), half=jnp.array([1.0, jnp.inf]))
  assert sorted(state_fingerprints(state)[1]) == ["['half']", "['kernel']"]


def test_a_checkpoint_with_the_older_sha256_digests_is_still_verified(tmp_path):
  state = {"kernel": jnp.arange(12.0).reshape(3, 4), "step": jnp.array(7)}
  checkpointer = Checkpointer(str(tmp_path), asynchronous=False)
  checkpointer.save(5, state, extra={"position": 3})
  checkpointer.wait()
  metadata = tmp_path / "checkpoints" / "5" / "extra" / "metadata"  # run_directory.CHECKPOINTS
  extra = json.loads(metadata.read_text())
  assert set(extra["fingerprints"]) == {"['kernel']", "['step']"}
  del extra["fingerprints"]
  extra["checksums"] = state_checksums(state)[0]  # what checkpoints written before fingerprints hold
  metadata.write_text(json.dumps(extra))
  abstract = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), state)
  step, restored, restored_extra = Checkpointer(str(tmp_path), asynchronous=False).restore(abstract)
  assert step == 5 and restored_extra["position"] == 3
  np.testing.assert_array_equal(restored["kernel"], state["kernel"])
  extra["checksums"]["['kernel']"] = "0" * 64
  metadata.write_text(json.dumps(extra))
  with pytest.raises(CheckpointRestoreError, match="checksum mismatch"):
    Checkpointer(str(tmp_path), asynchronous=False).restore(abstract)
