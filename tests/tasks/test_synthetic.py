"""The synthetic sequence tasks: what their data cannot support is refused with the fix."""
import jax
import pytest

from tests.train.conftest import load_experiment_config
from transformer.tasks import build_task


def test_word_dropout_is_refused_where_the_vocabulary_has_no_unknown_token():
  config = load_experiment_config("synthetic", "copy")
  config.source_token_dropout = 0.1
  task = build_task(config)
  batch = next(task.train_iterator(batch_size=4, seed=0))
  with pytest.raises(ValueError, match="no unknown-token id for word dropout; set config.source_token_dropout"):
    task.drop_tokens(batch, jax.random.key(0), task.model_config())
