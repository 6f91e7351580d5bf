"""launch.py's --config and translate-path mistakes: one line each naming the problem and the experiments there
are, and --help lists the experiments with their variants (was: tracebacks for a module without get_config,
ablations/common.py and a trailing colon; a directory as translate_input "does not exist", as translate_output an
error after decoding); --print_config prints the resolved config without a run or a workdir."""
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
  # synthetic.py's smoke variant lives outside its VARIANTS (the rows of its RESULTS page); the ablations' in
  # their Ablation: both were left out.
  assert "experiments/synthetic.py (copy, reverse, sort, tiny)" in listed
  assert "experiments/ablations/heads.py (1, 2, 4, 8, 16, NAME,multi30k, tiny)" in listed
  assert "--print_config lists every field" in listed  # how to see the --config.* fields


def test_print_config_prints_the_overridden_config_and_exits_without_a_workdir(tmp_path):
  workdir = tmp_path / "never_made"
  for where in ([], [f"--workdir={workdir}"]):
    result = launch("--config=experiments/synthetic.py:tiny", "--config.batch_size=7", "--config.model.num_heads=2",
                    "--print_config", *where)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "batch_size: 7" in lines and "num_train_steps: 40" in lines  # the override, and the variant's value
    assert "  num_heads: 2" in lines  # config.model's fields, indented under model:
  assert not workdir.exists()


def test_print_config_checks_the_config_and_a_run_still_needs_a_workdir():
  result = launch("--config=experiments/synthetic.py", "--config.batch_size=0", "--print_config")
  assert result.returncode == 1 and result.stdout == "", result.stdout
  assert result.stderr.strip() == "error: config.batch_size must be a positive integer, got 0."
  result = launch("--config=experiments/synthetic.py")
  assert result.returncode == 1 and "Traceback" not in result.stderr
  assert "--workdir is required" in result.stderr and "unless --print_config" in result.stderr


@pytest.mark.parametrize("field", ["translate_input", "translate_output"])
def test_translate_refuses_a_directory_before_decoding(tmp_path, field):
  result = launch("--config=experiments/synthetic.py:copy", f"--workdir={tmp_path / 'never_trained'}",
                  "--mode=translate", f"--config.{field}={tmp_path}")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  assert f"error: config.{field}='{tmp_path}' is a directory" in result.stderr
