"""The synthetic sequence tasks: what their data cannot support is refused with the fix."""
import jax
import pytest

from tests.train.conftest import load_experiment_config
from transformer.train.run_config import build_task


def test_word_dropout_is_refused_where_the_vocabulary_has_no_unknown_token():
  config = load_experiment_config("synthetic", "copy")
  config.source_token_dropout = 0.1
  task = build_task(config)
  batch = next(task.train_iterator(batch_size=4, seed=0))
  with pytest.raises(ValueError, match="no unknown-token id for word dropout; set config.source_token_dropout"):
    task.drop_tokens(batch, jax.random.key(0), task.model_config())


def test_a_full_disk_while_predictions_are_written_keeps_the_old_file_whole(tmp_path, monkeypatch):
  """``--mode=predict`` on a full disk once replaced the old ``predictions.txt`` with the lines written before
  ``OSError: [Errno 28]``; the new file is written beside it and renamed over it only once whole."""
  import builtins
  import errno
  import os

  from tests.train.conftest import tiny_config
  from transformer.errors import WorkdirError

  task = build_task(tiny_config(**{"task.num_eval_examples": 48}))
  model_config = task.model_config()
  params = task.build_model(model_config).init(jax.random.key(0), *task.placeholder_inputs())["params"]
  path = task.write_predictions(model_config, params, str(tmp_path))
  old = open(path, "rb").read()
  assert old.count(b"\n") == 48

  class FillsUp:
    """A file that takes one write, then finds the disk full."""

    def __init__(self, file):
      self.file, self.writes = file, 0

    def write(self, text):
      self.writes += 1
      if self.writes > 1:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      return self.file.write(text)

    def __enter__(self):
      return self

    def __exit__(self, *exception):
      self.file.close()

  real_open = builtins.open

  def filling_open(file, mode="r", *args, **kwargs):  # only the files written in tmp_path find the disk full
    opened = real_open(file, mode, *args, **kwargs)
    return FillsUp(opened) if "w" in mode and str(file).startswith(str(tmp_path)) else opened

  monkeypatch.setattr(builtins, "open", filling_open)
  with pytest.raises(WorkdirError, match=rf"no space left on the disk of {tmp_path} to write predictions.txt"):
    task.write_predictions(model_config, params, str(tmp_path))
  monkeypatch.undo()
  assert open(path, "rb").read() == old  # the old predictions, whole
  assert sorted(os.listdir(tmp_path)) == ["predictions.txt"]  # no temporary file left
