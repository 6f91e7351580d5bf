"""The typed ``config.task`` of every task (``transformer/tasks/configs.py``): every experiment's section builds one
with the values it gives, a section lacking a field gets what the code took for it, and a misspelt or bad field
is a ``ConfigError`` at validation, naming the field. No data is read: only the dataclasses are built."""
import dataclasses
import importlib
import importlib.util
import inspect
import pathlib
import re

import pytest

from transformer.errors import ConfigError
from transformer.tasks import TASKS
from transformer.tasks.configs import (TASK_CONFIGS, ClassificationConfig, ForecastingConfig, SyntheticConfig,
                                       TranslationConfig, task_config)
from transformer.train.config import base_config, validate_config

REPO = pathlib.Path(__file__).resolve().parents[2]
# As launch.py lists them: every file under experiments/ with a get_config.
EXPERIMENTS = sorted(path for path in (REPO / "experiments").rglob("*.py")
                     if re.search(r"^def get_config", path.read_text(), re.MULTILINE))


def _module(path: pathlib.Path):
  spec = importlib.util.spec_from_file_location(f"_experiment_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _variants(module) -> list[str]:
  """Every variant of an experiment file: its ``VARIANTS`` (plus ``tiny``), or an ablation's cells on both bases."""
  if hasattr(module, "ABLATION"):
    cells = list(module.ABLATION.variants)
    return cells + [f"{cell},multi30k" for cell in cells] + ["tiny"]
  return list(dict.fromkeys([*module.VARIANTS, "tiny"]))


def test_every_variant_of_every_experiment_builds_its_task_config_with_the_values_it_sets():
  checked = set()
  for path in EXPERIMENTS:
    module = _module(path)
    for variant in _variants(module):
      section = module.get_config(variant).task
      typed = task_config(section)  # raises for a field the dataclass lacks or a bad value
      assert isinstance(typed, TASK_CONFIGS[section.name])
      for name, value in section.items():  # what a task read from config.task it now reads from the dataclass
        expected = tuple(value) if isinstance(value, (list, tuple)) else value
        assert getattr(typed, name) == expected, (path.name, variant, name)
      checked.add((path.relative_to(REPO / "experiments").as_posix(), variant))
  assert {("synthetic.py", "sort"), ("multi30k.py", "transformer_gpu"), ("iwslt15_en_vi.py", "tiny"),
          ("beijing_pm25.py", "patchtst"), ("disaster_tweets.py", "minilm_finetune"), ("language_model.py", "small"),
          ("ablations/heads.py", "8,multi30k")} <= checked
  assert {TASK_CONFIGS[task_config(_module(REPO / "experiments" / f"{name}.py").get_config("tiny").task).name]
          for name in ("synthetic", "multi30k", "beijing_pm25", "disaster_tweets", "language_model")} == set(
              TASK_CONFIGS.values())  # every task's config met at least one experiment


def test_every_task_has_its_config_class_and_a_docstring_per_field():
  assert set(TASK_CONFIGS) == set(TASKS)
  for name, (module_name, class_name, _) in TASKS.items():
    assert getattr(importlib.import_module(module_name), class_name).task_config_class is TASK_CONFIGS[name]
    assert TASK_CONFIGS[name]().name == name  # the defaults validate
  from transformer.data.beijing_pm25.features import HORIZONS
  assert ForecastingConfig().horizons == HORIZONS  # the dataset's, written out: validation imports no TFDS
  # Each field's comment is looked for in the source of the class that declares it (a base class where a
  # subclass only changes the default), not the whole module, where a same-named field of another class
  # would answer for it.
  for config_class in TASK_CONFIGS.values():
    for field in dataclasses.fields(config_class):
      if field.name == "name":
        continue
      declaring = [klass for klass in config_class.__mro__ if field.name in inspect.get_annotations(klass)]
      assert declaring, f"{config_class.__name__}.{field.name}"
      # a comment on its line, or on a line of its own just above (not the previous field's trailing one)
      pattern = rf"(?m)^[ \t]*#.*\n[ \t]+{field.name}: |^[ \t]+{field.name}: .*#"
      assert any(re.search(pattern, inspect.getsource(klass)) for klass in declaring), (
          f"{config_class.__name__}.{field.name} has no comment in "
          f"{', '.join(klass.__name__ for klass in declaring)}")


def test_a_section_saved_without_a_field_gets_what_the_code_took_for_it():
  """Runs saved before a field existed: the code read it with ``config.task.get(field, default)``."""
  assert ClassificationConfig.from_dict({"name": "classification"}).bucket_length_multiple == 0
  forecasting = ForecastingConfig.from_dict({"name": "forecasting", "dataset": "beijing_pm25", "horizons": [1, 6]})
  assert (forecasting.residual, forecasting.synthetic_hours, forecasting.data_dir, forecasting.source_dir,
          forecasting.horizons) == (False, 0, "", "", (1, 6))  # a saved run's JSON list becomes a tuple


def test_a_misspelt_task_field_fails_validation_with_did_you_mean():
  """From a config file or the Python API (the command line refuses a field the section lacks already)."""
  config = base_config("transformer")
  config.task.update({"name": "synthetic", "kind": "copy", "max_lenght": 64})
  with pytest.raises(ConfigError, match=r"^config\.task: SyntheticConfig has no field 'max_lenght'\. "
                                        r"Did you mean 'max_length'\?$"):
    validate_config(config)
  del config.task["max_lenght"]
  validate_config(config)


@pytest.mark.parametrize("section, message", [
    ({"name": "translation", "tokenizer_type": "wordpiece"},
     r"TranslationConfig\.tokenizer_type='wordpiece' is not supported; choose one of \['unigram', 'bpe'\]"),
    ({"name": "classification", "pretrained_init": "decoder"},
     r"ClassificationConfig\.pretrained_init='decoder' is not supported; choose one of \['none', 'embedding', "
     r"'encoder'\]"),
    ({"name": "forecasting", "loss": "huber"},
     r"ForecastingConfig\.loss='huber' is not supported; choose one of \['mae', 'mse'\]"),
    ({"name": "synthetic", "kind": "rotate"}, r"SyntheticConfig\.kind='rotate' is not supported; choose one of "
                                              r"\['copy', 'reverse', 'sort'\]"),
    ({"name": "synthetic", "min_length": 5, "max_length": 3}, r"SyntheticConfig\.min_length=5\b"),
    ({"name": "forecasting", "horizons": (0, 6)},
     r"ForecastingConfig\.horizons=\[0, 6\]"),
    ({"name": "forecasting", "dataset": "synthetic"},
     r"ForecastingConfig\.dataset='synthetic' generates synthetic_hours hours, got 0; set config\.task\.synthetic"),
    ({"name": "language_model", "vocab_size": 0}, r"LanguageModelConfig\.vocab_size\b"),
    ({"name": "translation", "num_eval_sentences": -1},
     r"TranslationConfig\.num_eval_sentences\b"),
])
def test_a_bad_value_names_the_field_and_the_allowed_values(section, message):
  config = base_config("transformer")
  config.task = section
  with pytest.raises(ConfigError, match=r"^config\.task: " + message):
    validate_config(config)


def test_an_unknown_task_name_lists_the_tasks():
  with pytest.raises(ConfigError, match=r"config\.task\.name='synthetc' is not a known task; choose one of "
                                        r"\['classification', .*'translation'\]\. Did you mean 'synthetic'\?"):
    task_config({"name": "synthetc"})


def test_the_typed_config_is_frozen_and_replace_checks_its_fields():
  config = SyntheticConfig()
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.kind = "sort"
  assert config.replace(kind="sort").kind == "sort"
  with pytest.raises(ConfigError, match="Did you mean 'num_symbols'"):
    config.replace(num_symbol=4)
  assert TranslationConfig.from_dict({"name": "translation", "length_penalty_candidates": [1, 0.6]}
                                     ).length_penalty_candidates == (1.0, 0.6)
