"""A task whose pip extra is not installed stops before anything is imported or prepared, with one line (a
``MissingDependencyError``) naming the extra and its install command; the extras' package lists are setup.cfg's."""
import configparser
import re
import sys

import pytest

from tests.train.conftest import REPO, load_experiment_config
from transformer import tasks
from transformer.errors import MissingDependencyError, UserError
from transformer.train.config import build_task

# Each experiment's tiny variant and the task it builds (synthetic needs no extra).
NEEDS_DATA = ("multi30k", "iwslt15_en_vi", "language_model", "disaster_tweets", "beijing_pm25")


def _setup_cfg_extra(name: str) -> set[str]:
  parser = configparser.ConfigParser()
  parser.read(f"{REPO}/setup.cfg")
  lines = parser["options.extras_require"][name].split("\n")
  return {re.split(r"[<>=!~ ;\[]", line.strip(), maxsplit=1)[0] for line in lines if line.strip()}


@pytest.mark.parametrize("extra", sorted(tasks.EXTRA_MODULES))
def test_the_extras_modules_are_the_packages_of_setup_cfg(extra):
  assert set(tasks.EXTRA_MODULES[extra].values()) == _setup_cfg_extra(extra)


def test_every_task_with_a_pip_extra_names_a_known_one():
  assert {extra for _, _, extra in tasks.TASKS.values()} <= {None, *tasks.EXTRA_MODULES}


def _block(monkeypatch, *modules):
  """As if ``modules`` were not installed: importing one raises ``ModuleNotFoundError``."""
  for module in modules:
    monkeypatch.setitem(sys.modules, module, None)


def test_a_package_the_task_imports_late_is_checked_up_front(monkeypatch):
  """Classification imports safetensors only when it loads a pretrained model: the check does not wait for it."""
  config = load_experiment_config("disaster_tweets", "tiny")
  _block(monkeypatch, "safetensors")
  with pytest.raises(MissingDependencyError) as raised:
    build_task(config)
  assert str(raised.value) == ("the 'classification' task needs the 'data' extra (safetensors not installed): "
                               "run pip install -e \".[data]\" in the repository.")
  assert isinstance(raised.value, UserError) and isinstance(raised.value, ImportError)


@pytest.mark.parametrize("experiment", NEEDS_DATA)
def test_every_tiny_variant_without_the_data_extra_names_it(monkeypatch, experiment):
  _block(monkeypatch, *tasks.EXTRA_MODULES["data"])
  with pytest.raises(MissingDependencyError, match=r"needs the 'data' extra \(tensorflow-datasets, sentencepiece, "
                     r"sacrebleu, tokenizers, safetensors not installed\): run pip install -e \"\.\[data\]\""):
    build_task(load_experiment_config(experiment, "tiny"))  # the config itself may be what stops


def test_the_synthetic_task_needs_no_extra(monkeypatch):
  _block(monkeypatch, *tasks.EXTRA_MODULES["data"])
  assert build_task(load_experiment_config("synthetic", "tiny")).model_config().vocab_size > 0
