"""Every experiment has a ``tiny`` variant: a run of minutes on 2 CPU cores through train, eval and translate
(or predict), for a newcomer's first try and for the tests."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.shared_data import shared_path
from transformer.train.config import validate_config

REPO = pathlib.Path(__file__).resolve().parents[2]
# As launch.py lists them: every file under experiments/ with a get_config.
EXPERIMENTS = sorted(path for path in (REPO / "experiments").rglob("*.py")
                     if re.search(r"^def get_config", path.read_text(), re.MULTILINE))


def _get_config(path: pathlib.Path, variant: str):
  spec = importlib.util.spec_from_file_location(f"_experiment_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


def test_the_experiments_are_found():
  assert {"synthetic", "multi30k", "iwslt15_en_vi", "beijing_pm25", "disaster_tweets"} <= {
      path.stem for path in EXPERIMENTS}


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda path: str(path.relative_to(REPO / "experiments")))
def test_every_experiment_has_a_tiny_variant_that_validates(path, tmp_path):
  config = _get_config(path, "tiny")
  validate_config(config, str(tmp_path), "train")
  assert config.num_train_steps <= 100, "a tiny variant trains in minutes on 2 CPU cores"
  assert config.eval_every <= config.num_train_steps  # it evaluates, too


def _launch(*args, env):
  return subprocess.run([sys.executable, "launch.py", *args], cwd=REPO, capture_output=True, text=True, env=env,
                        timeout=900)


@pytest.mark.slow
def test_multi30k_tiny_trains_evaluates_predicts_and_translates_with_a_clean_log(tmp_path):
  """End to end from the raw files as a newcomer runs it, output to files: no terminal escape codes, the
  config's path and not its lines, a line per compiled batch shape, a summary, a table, hypotheses files."""
  env = dict(os.environ, TRANSFORMER_DATA_DIR=str(shared_path("data")))
  config = ["--config=experiments/multi30k.py:tiny", f"--workdir={tmp_path / 'run'}",
            f"--config.task.data_dir={tmp_path / 'tfds'}"]
  train = _launch(*config, env=env)
  assert train.returncode == 0, train.stderr[-3000:]
  log = train.stdout + train.stderr
  assert "\x1b" not in log and "\r" not in log  # TFDS's progress bars are off when stderr is a file
  assert f"config: {tmp_path / 'run' / 'config.json'}" in log and "num_train_steps" not in log
  assert "compiling the train step for batch shape 1/" in log and "Unable to initialize backend" not in log
  assert "done: step 40 of 40" in log and f"python -m transformer.plot {tmp_path / 'run'}" in log

  evaluated = _launch(*config, "--mode=eval", env=env)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert "training pairs" not in evaluated.stderr and "training batches" not in evaluated.stderr
  assert re.search(r"metric +eval +validation +test_2016_flickr", evaluated.stdout)  # validation: the alpha's
  assert len((tmp_path / "run" / "test_2016_flickr.hyp.de").read_text().splitlines()) == 1000

  predicted = _launch(*config, "--mode=predict", env=env)
  assert predicted.returncode == 0, predicted.stderr[-3000:]
  assert len((tmp_path / "run" / "validation.hyp.de").read_text().splitlines()) == 1014

  (tmp_path / "in.en").write_text("A man rides a bike .\n\nTwo dogs play .\n")
  translated = _launch(*config, "--mode=translate", f"--config.translate_input={tmp_path / 'in.en'}", env=env)
  assert translated.returncode == 0, translated.stderr[-3000:]
  lines = translated.stdout.split("\n")
  assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # one line per input line
  assert "translated 3 lines with the checkpoint of step 40" in translated.stderr
