"""The synthetic sequence tasks: what their data cannot support is refused with the fix."""
import jax
import pytest

from tests.train.conftest import load_experiment_config
from transformer.train.config import build_task


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


@pytest.mark.slow
def test_eval_writes_outputs_that_give_back_its_exact_match_and_token_accuracy(tmp_path):
  """``--mode=eval`` writes every held-out example's source, target, greedy prediction and teacher-forced token
  counts; ``outputs_metrics`` of the file read back is the evaluation's ``eval/exact_match`` and
  ``eval/token_accuracy`` (what the results page prints and ``experiments.verify`` recomputes)."""
  import json

  from tests.train.conftest import tiny_config
  from transformer.tasks.synthetic import OUTPUTS_FILE, outputs_metrics, read_outputs
  from transformer.train import run

  config = tiny_config(num_train_steps=60, eval_every=60, checkpoint_every=60, **{"optimizer.learning_rate": 5e-3})
  run(config, str(tmp_path))
  run(config, str(tmp_path), mode="eval")
  with open(tmp_path / "eval_results.json") as f:
    evaluated = json.load(f)
  rows = read_outputs(str(tmp_path / OUTPUTS_FILE))
  assert len(rows) == 32
  assert all(row["target"][-1] == 2 and len(row["prediction"]) == len(row["target"]) for row in rows)  # EOS last
  recomputed = outputs_metrics(rows)
  assert 0.0 < recomputed["token_accuracy"] < 1.0  # a model that is partly right: every count matters
  assert recomputed["exact_match"] == pytest.approx(evaluated["eval/exact_match"], abs=1e-6)
  assert recomputed["token_accuracy"] == pytest.approx(evaluated["eval/token_accuracy"], abs=1e-6)


def test_an_outputs_file_without_its_header_is_refused(tmp_path):
  from transformer.tasks.synthetic import read_outputs
  (tmp_path / "outputs.tsv").write_text("1 2\t1 2\t1 2\t2\t2\n")
  with pytest.raises(ValueError, match="is not a file of decoded outputs"):
    read_outputs(str(tmp_path / "outputs.tsv"))


def test_a_damaged_outputs_line_is_named_with_its_file_and_line(tmp_path):
  """Was: ``ValueError: not enough values to unpack`` from inside read_outputs, naming neither."""
  from transformer.errors import InputFileError
  from transformer.tasks.synthetic import OUTPUT_COLUMNS, read_outputs
  path = tmp_path / "outputs.tsv"
  path.write_text("\t".join(OUTPUT_COLUMNS) + "\n3 4\t3 4\t3 4\t2\t2\n3 4\t3 4\t2\n5\t5\t5\t1\tone\n")
  with pytest.raises(InputFileError, match=rf"{path} line 3 is damaged: '3 4\\t3 4\\t2' should be 5 tab-separated"):
    read_outputs(str(path))
  path.write_text("\t".join(OUTPUT_COLUMNS) + "\n5\t5\t5\t1\tone\n")
  with pytest.raises(InputFileError, match="line 2 is damaged"):
    read_outputs(str(path))
