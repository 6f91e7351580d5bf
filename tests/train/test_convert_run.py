"""Saved runs carry their format (``run_format``); a run of an older one is refused in one line naming the
converter, ``python -m transformer.train.convert_run``, after which it loads with the same parameters. ``load``
reads the parameters alone (the optimizer state stays on disk), checking their checksums."""
import json
import os
import shutil

import jax
import numpy as np
import pytest

from tests.train.conftest import tiny_config
from transformer import load
from transformer.errors import ConfigError, WorkdirError
from transformer.train import read_run_config, run
from transformer.train.config import base_config
from transformer.train.convert_run import main, upgrade_config, upgrade_model_config
from transformer.train.workdir import FORMAT, RunDirectory
from transformer.train.workdir import FORMAT_VERSION, read_format
from transformer.train.workdir import check_workdir_model

COMMAND = "python -m transformer.train.convert_run"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """``(workdir, parameters of its latest checkpoint)`` of a finished tiny run (20 steps, checkpoints 10, 20)."""
  workdir = str(tmp_path_factory.mktemp("trained"))
  run(tiny_config(), workdir)
  return workdir, load(workdir, checkpoint="latest").params


def _copy(trained, tmp_path) -> str:
  workdir = str(tmp_path / "run")
  shutil.copytree(trained[0], workdir, ignore=shutil.ignore_patterns("train.lock"))
  return workdir


def _read(workdir, name):
  with open(os.path.join(workdir, name)) as f:
    return json.load(f)


def _write(workdir, name, value):
  with open(os.path.join(workdir, name), "w") as f:
    json.dump(value, f)


def _assert_same_params(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def _refused_naming_the_converter(workdir):
  with pytest.raises(WorkdirError) as error:
    load(workdir, checkpoint="latest")
  message = str(error.value)
  assert "\n" not in message and message.endswith(f"{COMMAND} {workdir}")
  return message


@pytest.mark.slow
def test_a_run_saved_before_the_marker_is_refused_then_converted_loads_the_same_parameters(trained, tmp_path,
                                                                                             capsys):
  assert read_format(trained[0]) == FORMAT_VERSION  # a run records its format when it starts
  workdir = _copy(trained, tmp_path)
  model_config = load(workdir, checkpoint="latest").model_config
  # Format 1: today's config.json, no marker; Transformer runs saved the classifier's fields in model_config.json.
  os.remove(os.path.join(workdir, FORMAT))
  config_json, model_config_json = _read(workdir, "config.json"), _read(workdir, "model_config.json")
  _write(workdir, "model_config.json", {**model_config_json, "num_classes": 2, "pooling": "mean"})
  assert "older run format (no run_format.json)" in _refused_naming_the_converter(workdir)
  with pytest.raises(WorkdirError, match=COMMAND):
    read_run_config(workdir)
  with pytest.raises(WorkdirError, match=COMMAND):  # resuming is refused before the record is compared
    check_workdir_model(workdir, model_config, has_checkpoints=True, write=False)

  main([workdir])
  said = capsys.readouterr().out
  assert said.startswith(f"{workdir}: format 1 -> {FORMAT_VERSION}; model_config.json: removed num_classes, pooling "
                         "(was kept as model_config.json.v1); wrote run_format.json")
  _assert_same_params(load(workdir, checkpoint="latest").params, trained[1])
  check_workdir_model(workdir, model_config, has_checkpoints=True, write=False)  # resumes
  assert _read(workdir, "config.json") == config_json and _read(workdir, "model_config.json") == model_config_json
  assert "num_classes" in _read(workdir, "model_config.json.v1")
  assert not os.path.exists(os.path.join(workdir, "config.json.v1"))  # unchanged: no backup

  main([workdir])  # idempotent
  assert capsys.readouterr().out == f"{workdir}: already format {FORMAT_VERSION}, nothing to convert\n"


@pytest.mark.slow
def test_a_format_0_run_is_converted_to_todays_config_and_loads(trained, tmp_path, capsys):
  workdir = _copy(trained, tmp_path)
  today = _read(workdir, "config.json")
  assert today["decode"] == base_config().decode.to_dict()  # so the old shape below, without decode, means it
  # Before model_name: architecture chose between the model (Transformer) and rnn sections; no decode section.
  old = {name: value for name, value in today.items() if name not in ("model_name", "decode")}
  old.update(architecture="transformer", model={**today["model"], "num_classes": 2, "pooling": "mean"},
             rnn={"cell": "lstm", "hidden_dim": 256})
  _write(workdir, "config.json", old)
  os.remove(os.path.join(workdir, FORMAT))
  assert _refused_naming_the_converter(workdir)

  main([workdir])
  said = capsys.readouterr().out
  assert said.startswith(f"{workdir}: format 0 -> {FORMAT_VERSION}; config.json: removed architecture, "
                         "model.num_classes, model.pooling, rnn.*; added decode.*, model_name (was kept as "
                         "config.json.v0)")
  assert _read(workdir, "config.json") == today and _read(workdir, "config.json.v0") == old
  _assert_same_params(load(workdir, checkpoint="latest").params, trained[1])


@pytest.mark.slow
def test_the_converter_names_a_workdir_without_a_run_and_one_of_a_newer_format(trained, tmp_path):
  with pytest.raises(SystemExit, match="holds no config.json"):
    main([str(tmp_path)])
  workdir = _copy(trained, tmp_path)
  _write(workdir, FORMAT, {"format_version": FORMAT_VERSION + 1})
  with pytest.raises(SystemExit, match=f"run format {FORMAT_VERSION + 1}, newer than this code's"):
    main([workdir])
  with pytest.raises(WorkdirError, match="newer than this code's .*update the code"):
    load(workdir)


@pytest.mark.slow
def test_load_reads_and_verifies_only_the_parameters(trained, tmp_path):
  """A changed checksum of a parameter makes load fall back to the checkpoint before; one of the optimizer
  state is never looked at (that state is not read)."""
  workdir = _copy(trained, tmp_path)
  metadata = os.path.join(workdir, "checkpoints", "20", "extra", "metadata")
  extra = _read(workdir, metadata)
  optimizer_entry = next(name for name in extra["fingerprints"] if name.startswith(".opt_state"))
  _write(workdir, metadata, {**extra, "fingerprints": {**extra["fingerprints"], optimizer_entry: "0" * 32}})
  restored = load(workdir, checkpoint="latest")
  assert restored.step == 20
  _assert_same_params(restored.params, trained[1])

  param_entry = next(name for name in extra["fingerprints"] if name.startswith(".params"))
  _write(workdir, metadata, {**extra, "fingerprints": {**extra["fingerprints"], param_entry: "0" * 32}})
  assert load(workdir, checkpoint="latest").step == 10  # step 20 is damaged: the one before


@pytest.mark.slow
def test_load_with_a_model_the_checkpoint_does_not_hold_is_named(trained):
  """A parameter the checkpoint lacks is an error, not left unread (orbax's partial restore would hand back
  its abstract leaf); one of another shape too."""
  deeper = RunDirectory(trained[0]).config_dict()
  deeper.model.num_encoder_layers = 2
  with pytest.raises(ConfigError, match=r"holds no \.params\['encoder'\]\['layer_1'\].*Does the configuration match"):
    load(trained[0], config=deeper)
  wider = RunDirectory(trained[0]).config_dict()
  wider.model.d_ff = 128
  with pytest.raises(ConfigError, match="not compatible with the stored shape.*Does the configuration match"):
    load(trained[0], config=wider)


def test_upgrade_config_maps_the_old_sections_to_the_chosen_models_section():
  transformer = {"d_model": 128, "num_heads": 4, "num_classes": 2, "pooling": "mean"}
  rnn = {"cell": "lstm", "hidden_dim": 256}
  old_rnn_run = {"architecture": "rnn", "model": transformer, "rnn": rnn, "seed": 3, "task": {"name": "t"}}
  assert upgrade_config(old_rnn_run) == {"model_name": "rnn", "model": rnn, "seed": 3, "task": {"name": "t"},
                                         "decode": base_config().decode.to_dict()}
  # Before RNNs there was no architecture field: a Transformer, less the fields moved to ClassifierConfig.
  assert upgrade_config({"model": transformer, "seed": 3}) == {
      "model_name": "transformer", "model": {"d_model": 128, "num_heads": 4}, "seed": 3}
  new_shape = upgrade_config(old_rnn_run)
  again = upgrade_config(new_shape)
  assert again == new_shape and again is not new_shape
  again["model"]["cell"] = "gru"  # a copy: the argument stays as it was
  assert new_shape["model"]["cell"] == "lstm" and old_rnn_run["rnn"]["cell"] == "lstm"
  assert upgrade_config({"num_train_steps": 4}) == {"num_train_steps": 4}  # no model section: nothing to map


def test_upgrade_config_moves_the_old_beam_settings_into_decode():
  old = {"model_name": "transformer", "task": {"name": "translation", "beam_size": 5, "length_penalty": 1.0}}
  upgraded = upgrade_config(old)
  assert upgraded["task"] == {"name": "translation"}
  assert upgraded["decode"] == {**base_config().decode.to_dict(), "method": "beam", "beam_size": 5, "length_penalty": 1.0}
  assert upgrade_config({"task": {"name": "t", "beam_size": 1}})["decode"]["method"] == "greedy"


def test_upgrade_model_config_drops_only_the_fields_that_moved_to_the_classifier():
  saved = {"d_model": 8, "num_classes": 2, "pooling": "first", "gone": 1}
  assert upgrade_model_config(saved, "transformer") == {"d_model": 8, "gone": 1}  # "gone": resuming names it
  assert upgrade_model_config(saved, "encoder_classifier") == saved


def _save_format_2_checkpoints(workdir: str, periodic: list[int], best: dict[int, float]) -> None:
  """What format 2 wrote: ``checkpoints/<step>`` without metrics, ``best/<step>`` with its ``eval/loss``."""
  import orbax.checkpoint as ocp
  for folder, steps in (("checkpoints", {step: None for step in periodic}), ("best", best)):
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False, best_mode="min",
                                           best_fn=(lambda metrics: metrics["eval/loss"]) if folder == "best" else None)
    manager = ocp.CheckpointManager(os.path.join(workdir, folder), item_names=("state", "extra"), options=options)
    for step, loss in steps.items():
      manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"w": np.full(3, float(step))}),
                                                 extra=ocp.args.JsonSave({})),
                   metrics=None if loss is None else {"eval/loss": loss})
    manager.close()


@pytest.mark.parametrize("best_step", [7, 9], ids=["only-in-best", "in-both"])
def test_a_format_2_runs_best_checkpoint_moves_into_the_one_checkpoint_folder(tmp_path, capsys, best_step):
  """Format 2 kept the best checkpoint in ``best/`` (a second orbax manager); format 3 keeps every step in
  ``checkpoints/``: the best step moves over (or, when both held it, its metric does), and the one manager
  finds it as the best."""
  from transformer.train.checkpoint import Checkpointer
  workdir = str(tmp_path)
  _write(workdir, "config.json", json.loads(base_config().to_json()))
  _write(workdir, FORMAT, {"format_version": 2})
  _save_format_2_checkpoints(workdir, periodic=[8, 9], best={best_step: 0.5})
  main([workdir])
  assert f"format 2 -> {FORMAT_VERSION}; best/: step {best_step} into checkpoints/" in capsys.readouterr().out
  assert not os.path.exists(os.path.join(workdir, "best")) and os.path.isdir(os.path.join(workdir, "best.v2"))
  checkpointer = Checkpointer(workdir, asynchronous=False, best_metric="eval/loss", best_mode="min")
  assert checkpointer.steps() == sorted({7, 8, 9} if best_step == 7 else {8, 9})
  assert checkpointer.best_step() == best_step
  step, state, _ = checkpointer.restore(jax.eval_shape(lambda: {"w": np.zeros(3)}), best=True)
  assert step == best_step and float(state["w"][0]) == best_step
  checkpointer.close()
