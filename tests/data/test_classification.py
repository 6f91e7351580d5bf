"""Classification batches (``transformer.data.classification``): every example once per epoch, exact resume."""
import numpy as np
import pytest

from transformer.data.classification import ShuffledBatches


@pytest.mark.parametrize("length_multiple", [0, 4])
def test_an_epoch_of_batches_holds_every_example_once_and_resumes_exactly(length_multiple):
  rng = np.random.default_rng(0)
  lengths = rng.integers(2, 13, size=103)
  tokens = np.where(np.arange(12)[None] < lengths[:, None], rng.integers(1, 50, size=(103, 12)), 0).astype(np.int32)
  labels = np.arange(103, dtype=np.int32)  # the label names the row
  batches = ShuffledBatches(tokens, labels, 8, seed=5, length_multiple=length_multiple)
  epoch = [next(batches) for _ in range(103 // 8)]
  seen = np.concatenate([batch["label"] for batch in epoch])
  assert len(set(seen.tolist())) == len(seen) == 96  # 12 full batches, no row twice
  for batch in epoch:
    width = batch["tokens"].shape[1]
    np.testing.assert_array_equal(batch["tokens"], tokens[batch["label"]][:, :width])  # only padding cut
    assert np.all(tokens[batch["label"]][:, width:] == 0)
    if length_multiple:
      assert width % length_multiple == 0 and width - lengths[batch["label"]].max() < length_multiple
  if length_multiple:  # similar lengths together: less padding than one batch shape for all
    assert sum(batch["tokens"].size for batch in epoch) < 0.8 * 96 * 12
  state = batches.get_state()
  following = [next(batches) for _ in range(3)]
  resumed = ShuffledBatches(tokens, labels, 8, seed=5, length_multiple=length_multiple)
  resumed.set_state(state)
  for expected in following:
    got = next(resumed)
    for name in expected:
      np.testing.assert_array_equal(got[name], expected[name])
