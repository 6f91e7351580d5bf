"""``python -m transformer.export``: a trained run's scoring and decoding, deserialized in a fresh interpreter that
imports only JAX and numpy, give what ``transformer.load`` gives, on shapes other than the ones traced."""
import dataclasses
import os
import re
import subprocess
import sys
import textwrap
import types

import jax
import numpy as np
import pytest

from tests.data.data_fixtures import write_multi30k
from tests.test_load import trained  # noqa: F401  (the tiny copy run, a module fixture)
from tests.train.conftest import REPO, load_experiment_config
from transformer import load
from transformer.decode import DecodeSettings
from transformer.errors import UserError
from transformer.export import (ARTIFACT_EXTENSION, MANIFEST_FILE, PARAMS_FILE, export_functions, export_model,
                                flatten_params, unflatten_params)
from transformer.inference import Classifier, Forecaster
from transformer.tasks.decoding import continue_prompts
from transformer.train import run

# Runs in a fresh interpreter: reads the export and the inputs, calls each function, writes its outputs.
SERVE = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    export_dir, inputs_file, outputs_file = sys.argv[1:]
    manifest = json.load(open(f"{export_dir}/manifest.json"))
    params = dict(np.load(f"{export_dir}/{manifest['params']['file']}"))
    inputs, outputs = np.load(inputs_file), {}
    for key in sorted({key.split(":")[0] for key in inputs.files}):  # "greedy/1:source": call 1 of greedy
      name, call = key.split("/")
      function = manifest["functions"][name]
      exported = jax.export.deserialize(open(f"{export_dir}/{function['file']}", "rb").read())
      args = [inputs[f"{key}:{spec['name']}"] for spec in function["inputs"][1:]]
      results = exported.call(params, *args)
      for index, value in enumerate(results if isinstance(results, tuple) else (results,)):
        outputs[f"{key}:{index}"] = np.asarray(value)
    assert not any(module.split(".")[0] == "transformer" for module in sys.modules), "transformer was imported"
    np.savez(outputs_file, **outputs)
""")


def serve(export_dir, calls: dict[str, dict[str, np.ndarray]], tmp_path) -> dict[str, list[np.ndarray]]:
  """``{"greedy/0": {"source": ...}}`` -> ``{"greedy/0": [outputs]}``, computed by ``SERVE`` in a fresh
  interpreter outside the repository (nothing of the project on its path, nor imported)."""
  inputs, outputs = tmp_path / "inputs.npz", tmp_path / "outputs.npz"
  np.savez(inputs, **{f"{key}:{name}": value for key, args in calls.items() for name, value in args.items()})
  env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
  result = subprocess.run([sys.executable, "-c", SERVE, str(export_dir), str(inputs), str(outputs)],
                          cwd=tmp_path, env={**env, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr
  saved = np.load(outputs)
  return {key: [saved[f"{key}:{i}"] for i in range(sum(f.startswith(f"{key}:") for f in saved.files))]
          for key in calls}


def padded(sequences, length=None) -> np.ndarray:
  batch = np.zeros((len(sequences), length or max(map(len, sequences))), np.int32)
  for row, sequence in enumerate(sequences):
    batch[row, :len(sequence)] = sequence
  return batch


def until_eos(tokens, eos_id: int) -> list[int]:
  tokens = list(np.asarray(tokens))
  return tokens[:tokens.index(eos_id) + 1] if eos_id in tokens else tokens


@pytest.fixture(scope="module")
def exported_copy(trained, tmp_path_factory):  # noqa: F811
  workdir, _, _ = trained
  out = tmp_path_factory.mktemp("export") / "copy"
  return workdir, out, export_model(workdir, str(out), beam_size=3)


@pytest.mark.slow
def test_the_copy_models_export_scores_and_decodes_as_load_on_new_shapes(exported_copy, tmp_path):
  """Two batches, neither of the traced shape (all symbolic) nor of each other's, through one artifact each."""
  workdir, out, manifest = exported_copy
  model = load(workdir)
  eos = manifest["special_ids"]["eos_id"]
  assert manifest["special_ids"] == {"pad_id": 0, "bos_id": 1, "eos_id": 2} and manifest["tokenizers"] == {}
  assert sorted(os.listdir(out)) == sorted([MANIFEST_FILE, PARAMS_FILE] + [f"{name}{ARTIFACT_EXTENSION}" for name in
                                                                          ("score", "greedy", "beam")])
  batches = [[[3, 4, 5, 6, 7], [7, 3], [5, 5, 5, 9, 10, 11, 12], [8]],  # 4 x 7
             [[9, 4, 3], [6, 6, 10], [12, 3, 4], [4, 5, 6], [7, 8, 9], [3, 3, 3], [10, 11, 12]]]  # 7 x 3
  calls = {}
  for index, sources in enumerate(batches):
    targets = [s + [eos] if row % 2 else s[::-1] + [eos] for row, s in enumerate(sources)]  # copies and others
    calls[f"score/{index}"] = {"source": padded(sources), "target": padded(targets)}
    calls[f"greedy/{index}"] = calls[f"beam/{index}"] = {"source": padded(sources)}
  served = serve(out, calls, tmp_path)

  for index, sources in enumerate(batches):
    targets = [s + [eos] if row % 2 else s[::-1] + [eos] for row, s in enumerate(sources)]
    (log_probs,) = served[f"score/{index}"]
    assert log_probs.shape == (len(sources),) and log_probs.dtype == np.float32
    np.testing.assert_allclose(log_probs, model.score(sources, targets), rtol=1e-6, atol=1e-6)

    tokens, greedy_log_probs = served[f"greedy/{index}"]
    longest = max(map(len, sources))
    assert tokens.shape == (len(sources), longest + longest // 2 + 10)  # SequenceModel.decode's default length
    assert greedy_log_probs.shape == (len(sources),)
    expected = model.decode(sources)
    assert [until_eos(row, eos) for row in tokens] == [list(row) for row in expected]
    assert sum(row == list(source) + [eos] for row, source in zip(map(list, expected), sources)) >= len(sources) // 2

    beams, scores = served[f"beam/{index}"]
    assert beams.shape == (len(sources), 3, tokens.shape[1]) and scores.shape == (len(sources), 3)
    assert np.all(np.diff(scores, axis=1) <= 0)  # best first
    assert [until_eos(row, eos) for row in beams[:, 0]] == [list(row) for row in model.decode(sources, beam_size=3)]


def test_the_parameters_are_keyed_by_their_path_and_come_back_whole():
  params = {"encoder": {"layer_0": {"kernel": np.ones((2, 3)), "bias": np.zeros(3)}}, "embed": np.arange(4.0)}
  flat = flatten_params(params)
  assert sorted(flat) == ["embed", "encoder/layer_0/bias", "encoder/layer_0/kernel"]
  assert jax.tree.structure(unflatten_params(flat)) == jax.tree.structure(params)
  with pytest.raises(ValueError, match="has '/' in a name"):
    flatten_params({"a/b": np.zeros(1)})


@pytest.mark.parametrize("kind, task", [(Classifier, "classification"), (Forecaster, "forecasting")])
def test_other_tasks_are_refused_naming_what_is_supported(kind, task):
  model = kind.__new__(kind)
  model.workdir, model.run_config = "runs/x", types.SimpleNamespace(task=types.SimpleNamespace(name=task))
  with pytest.raises(UserError, match=rf"^cannot export the run in 'runs/x': it trained config.task.name='{task}' "
                                      rf"\(a {kind.__name__}\); export supports sequence-to-sequence runs "
                                      r"\(config.task.name 'synthetic', 'translation'\) and language models "
                                      r"\('language_model'\)\.$"):
    export_functions(model, beam_size=0, max_new_tokens=None)


@pytest.mark.slow
def test_bad_input_is_one_line_without_a_traceback(exported_copy, tmp_path):
  workdir, out, _ = exported_copy
  (tmp_path / "empty").mkdir()
  cases = [([str(tmp_path / "nowhere"), "--out", str(tmp_path / "a")], r"'.*nowhere' does not exist"),
           ([str(tmp_path / "empty"), "--out", str(tmp_path / "b")], r"holds no config.json"),
           ([workdir, "--out", str(out)], r"--out '.*copy' exists and is not an empty folder; give a new folder")]
  for args, message in cases:
    result = subprocess.run([sys.executable, "-m", "transformer.export", *args], cwd=REPO, capture_output=True,
                            text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(message, lines[0]), lines[0]
  assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.fixture(scope="module")
def trained_lm(tmp_path_factory):
  """The tiny language model trained 20 steps on a made-up Multi30k-format corpus (its 40-piece vocabulary)."""
  raw = write_multi30k(tmp_path_factory.mktemp("raw") / "multi30k",
                       sizes={"train": 300, "val": 20, "test_2016_flickr": 2, "test_2017_flickr": 2,
                              "test_2017_mscoco": 2, "test_2018_flickr": 2})
  config = load_experiment_config("language_model", "tiny")
  config.task.source_dir, config.task.data_dir = str(raw), str(tmp_path_factory.mktemp("tfds"))
  config.task.vocab_size = 40
  config.quiet, config.tensorboard = True, False
  workdir = str(tmp_path_factory.mktemp("lm") / "run")
  run(config, workdir)
  return workdir


@pytest.mark.slow
def test_the_language_models_export_gives_loads_logits_and_continuations(trained_lm, tmp_path):
  out = tmp_path / "export"
  manifest = export_model(trained_lm, str(out), max_new_tokens=12)
  assert set(manifest["functions"]) == {"logits", "greedy", "beam"} and manifest["tokenizers"] == {
      "text": "tokenizers/text.model"}
  model = load(trained_lm)
  tokenizer = model.task.tokenizer("text")
  with open(tokenizer.path, "rb") as recorded, open(out / "tokenizers" / "text.model", "rb") as copied:
    assert recorded.read() == copied.read()

  prompts = ["a dog runs", "the", "two small cats sit near the water"]
  encoded = tokenizer.encode_batch(prompts, add_eos=False)
  prompt, lengths = padded(encoded), np.array([len(ids) for ids in encoded], np.int32)
  tokens = padded([ids + [manifest["special_ids"]["eos_id"]] for ids in encoded])
  served = serve(out, {"logits/0": {"tokens": tokens}, "greedy/0": {"prompt": prompt, "prompt_lengths": lengths},
                       "beam/0": {"prompt": prompt, "prompt_lengths": lengths}}, tmp_path)

  network = model.task.build_model(model.model_config.replace(deterministic=True))
  (logits,) = served["logits/0"]
  np.testing.assert_allclose(logits, network.apply({"params": model.params}, tokens), rtol=1e-6, atol=1e-6)

  continuations, _ = served["greedy/0"]
  assert continuations.shape == (len(prompts), 12)
  assert [tokenizer.decode(row) for row in continuations] == model.continue_texts(prompts, max_new_tokens=12)
  config = model.model_config.replace(deterministic=True)
  beam = dataclasses.replace(model.task.settings.decode, method="beam")
  for name, settings in (("greedy", DecodeSettings("greedy")), ("beam", beam)):  # token for token the task's search
    expected, expected_scores = map(np.asarray, continue_prompts(config, model.params, prompt, lengths, 12, settings))
    if name == "greedy":
      expected, expected_scores = expected[:, 0], expected_scores[:, 0]
    sequences, scores = served[f"{name}/0"]
    np.testing.assert_array_equal(sequences, expected)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-6, atol=1e-6)
