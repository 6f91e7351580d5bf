"""launch.py's --config and translate-path mistakes: one line each naming the problem and the experiments there
are, and --help lists the experiments with their variants (was: tracebacks for a module without get_config,
ablations/common.py and a trailing colon; a directory as translate_input "does not exist", as translate_output an
error after decoding)."""
import subprocess
import sys

import pytest

from tests.train.conftest import REPO

pytestmark = pytest.mark.slow  # each case starts launch.py


def launch(*args):
  return subprocess.run([sys.executable, "launch.py", *args], cwd=REPO, capture_output=True, text=True,
                        timeout=300)


@pytest.mark.parametrize("value,named", [
    ("experiments/translation.py", "no experiment config"),  # helpers of experiments, not experiments
    ("experiments/pages.py", "no experiment config"),
    ("experiments/ablations/common.py", "no experiment config"),
    ("experiments/synthetic.py:", "names no variant"),
    ("experiments/nope.py", "does not exist"),
])
def test_a_config_that_is_no_experiment_is_one_line_listing_the_experiments(tmp_path, value, named):
  result = launch(f"--config={value}", f"--workdir={tmp_path}")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  message = result.stderr.strip()
  assert message.startswith("error: ") and named in message and "\n" not in message
  assert "experiments/synthetic.py" in message.split("Experiments: ")[1].split(", ")


def test_help_lists_the_experiments_with_their_variants():
  listed = launch("--help").stdout
  assert "experiments/language_model.py (small, tiny)" in listed
  assert "experiments/translation.py" not in listed and "experiments/ablations/common.py" not in listed


@pytest.mark.parametrize("field", ["translate_input", "translate_output"])
def test_translate_refuses_a_directory_before_decoding(tmp_path, field):
  result = launch("--config=experiments/synthetic.py:copy", f"--workdir={tmp_path / 'never_trained'}",
                  "--mode=translate", f"--config.{field}={tmp_path}")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  assert f"error: config.{field}='{tmp_path}' is a directory" in result.stderr
