"""launch.py's --config mistakes: one line each naming the file and the experiments there are, and --help lists
the experiments with their variants (was: tracebacks for a module without get_config, ablations/common.py and a
trailing colon)."""
import importlib.util
import os

import pytest

from tests.train.conftest import REPO


@pytest.fixture(scope="module")
def launch():
  spec = importlib.util.spec_from_file_location("launch_under_test", os.path.join(REPO, "launch.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("value,named", [
    ("experiments/translation.py", "no experiment config"),  # helpers of experiments, not experiments
    ("experiments/plot.py", "no experiment config"),
    ("experiments/ablations/common.py", "no experiment config"),
    ("experiments/synthetic.py:", "names no variant"),
    ("experiments/nope.py", "does not exist"),
])
def test_a_config_that_is_no_experiment_is_one_line_listing_the_experiments(launch, monkeypatch, value, named):
  monkeypatch.chdir(REPO)
  with pytest.raises(SystemExit) as stop:
    launch._check_config_argument(["launch.py", f"--config={value}", "--workdir=/tmp/unused"])
  message = str(stop.value.code)
  assert message.startswith("error: ") and named in message and "\n" not in message
  assert "experiments/synthetic.py" in message.split("Experiments: ")[1]


def test_help_lists_the_experiments_with_their_variants(launch, monkeypatch, capsys):
  monkeypatch.chdir(REPO)
  launch._check_config_argument(["launch.py", "--help"])
  listed = capsys.readouterr().out
  assert "experiments/language_model.py (small, tiny)" in listed
  assert "experiments/translation.py" not in listed and "experiments/ablations/common.py" not in listed


@pytest.mark.parametrize("field", ["translate_input", "translate_output"])
def test_translate_refuses_a_directory_before_decoding(launch, tmp_path, field):
  """A directory as the input was reported as "does not exist", as the output it failed after decoding."""
  import types
  from transformer.errors import InputFileError
  settings = types.SimpleNamespace(**{"translate_input": "", "translate_output": "", field: str(tmp_path)})

  def no_decoding(*args, **kwargs):
    raise AssertionError("nothing is decoded before the files are checked")
  with pytest.raises(InputFileError, match=f"config.{field}=.* is a directory"):
    launch.translate_files(settings, str(tmp_path), no_decoding)
