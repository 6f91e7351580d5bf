"""The training loop: compiles once, parallel modes agree, vmap over seeds, resume across device counts."""
import json
import os
import shutil
import traceback

import jax
import numpy as np
import pytest

from transformer.errors import ConfigError
from transformer.inference import load_params
from transformer.train import run
from transformer.train.workdir import read_metrics
from tests.train.conftest import REPO, tiny_config


def losses(workdir, name="train/loss"):
  return np.array([r[name] for r in read_metrics(workdir) if name in r])


def assert_params_close(actual, desired, rtol, atol):
  """Compare parameter trees, except key biases: softmax is invariant to them, so their true gradient is
  exactly zero and Adam turns the rounding noise in it into full-size steps that differ between programs."""
  flat_actual = jax.tree_util.tree_leaves_with_path(actual)
  flat_desired = jax.tree_util.tree_leaves(desired)
  for (path, a), d in zip(flat_actual, flat_desired):
    if "key_bias" not in jax.tree_util.keystr(path):
      np.testing.assert_allclose(np.asarray(a), np.asarray(d), rtol=rtol, atol=atol,
                                 err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The tiny run on one device with jit: the curve every other mode must follow."""
  from tests.train.conftest import tiny_config
  workdir = tmp_path_factory.mktemp("reference")
  return workdir, run(tiny_config(), str(workdir))


def test_train_step_compiles_exactly_once(make_config, tmp_path):
  output = run(make_config(num_train_steps=30), str(tmp_path))
  assert output.step == 30
  assert output.train_step_compilations == 1


def test_loss_decreases_and_files_are_written(make_config, tmp_path, capsys):
  run(make_config(num_train_steps=40, tensorboard=True, quiet=False), str(tmp_path))
  # stderr is no terminal here, so instead of a tqdm bar each logging step prints one line.
  progress = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
  assert len(progress) == 8 and progress[-1].startswith("step 40/40 (100%): loss ")
  curve = losses(tmp_path)
  assert len(curve) == 8
  assert curve[-1] < 0.8 * curve[0]
  assert json.loads((tmp_path / "config.json").read_text())["model"]["d_model"] == 32
  assert any((tmp_path / "tensorboard").iterdir())


@pytest.mark.slow
def test_a_best_metric_the_task_does_not_report_stops_at_the_first_evaluation_and_resumes(make_config, tmp_path):
  with pytest.raises(ConfigError, match=r"config.best_metric='eval/acuracy' is not a metric .*'eval/loss'.*step 10"):
    run(make_config(best_metric="eval/acuracy"), str(tmp_path))
  output = run(make_config(best_metric="eval/loss", best_mode="min"), str(tmp_path))  # same process: lock released
  assert output.step == 20
  assert [record["step"] for record in read_metrics(str(tmp_path)) if "eval/loss" in record] == [10, 20]


@pytest.mark.slow
@pytest.mark.parametrize("parallelism,fsdp,tensor_parallelism",
                         [("pmap", False, 1), ("mesh", False, 1), ("mesh", True, 1), ("mesh", True, 2)])
def test_parallel_modes_match_single_device(make_config, tmp_path, reference, parallelism, fsdp, tensor_parallelism):
  """Same seed and global batch: 8-device data parallel (and FSDP, and FSDP over a 4 x 2 mesh whose model axis
  splits heads and feed-forward width; the vocabulary of 13 kept whole) follows the 1-device loss curve,
  evaluations and checkpoints included."""
  assert jax.device_count() == 8
  reference_dir, reference_output = reference
  output = run(make_config(parallelism=parallelism, fsdp=fsdp, tensor_parallelism=tensor_parallelism,
                           axis_rules="vocab=none" if tensor_parallelism > 1 else ""), str(tmp_path))
  # Reductions are split differently over devices, so the match is to float rounding, not bitwise.
  np.testing.assert_allclose(losses(tmp_path), losses(reference_dir), rtol=2e-4)
  np.testing.assert_allclose(losses(tmp_path, "eval/loss"), losses(reference_dir, "eval/loss"), rtol=2e-4)
  assert_params_close(output.state.params, reference_output.state.params, rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_gradient_accumulation_matches_full_batch(make_config, tmp_path, reference):
  run(make_config(grad_accum_steps=4), str(tmp_path))
  np.testing.assert_allclose(losses(tmp_path), losses(reference[0]), rtol=2e-4)


@pytest.mark.slow
def test_vmap_over_seeds_equals_separate_runs(make_config, tmp_path):
  together = run(make_config(num_seeds=2, seed=3), str(tmp_path / "vmap"))
  for replica in range(2):
    alone = run(make_config(seed=3 + replica, data_seed=3), str(tmp_path / f"seed{replica}"))
    np.testing.assert_allclose(losses(tmp_path / "vmap", f"train/loss/seed_{replica}"),
                               losses(tmp_path / f"seed{replica}"), rtol=1e-5)
    replica_params = jax.tree.map(lambda x: np.asarray(x)[replica], together.state.params)
    assert_params_close(replica_params, alone.state.params, rtol=1e-4, atol=1e-6)
    # Evaluation per replica too: the loss metrics and the task's own (greedy decoding's exact match).
    for name in ("eval/token_accuracy", "eval/exact_match"):
      np.testing.assert_allclose(losses(tmp_path / "vmap", f"{name}/seed_{replica}"),
                                 losses(tmp_path / f"seed{replica}", name),
                                 rtol=1e-5)
  for record in (r for r in read_metrics(str(tmp_path / "vmap")) if "eval/exact_match" in r):
    seeds = [record[f"eval/exact_match/seed_{i}"] for i in range(2)]
    assert record["eval/exact_match"] == pytest.approx(np.mean(seeds))


@pytest.mark.slow
@pytest.mark.parametrize("tensor_parallelism", [1, 2])
def test_vmapped_seeds_inside_an_fsdp_mesh_of_8_devices_equal_those_on_one_device(make_config, tmp_path,
                                                                                  tensor_parallelism):
  """The replicas' axis lives inside the mesh: each seed's parameters split over the data axis as one run's (and
  with a model axis, each seed's activations laid out by the rules under vmap; the vocabulary of 13 kept whole)."""
  one = run(make_config(num_seeds=2), str(tmp_path / "one"))
  mesh = run(make_config(num_seeds=2, parallelism="mesh", fsdp=True, tensor_parallelism=tensor_parallelism,
                         axis_rules="vocab=none" if tensor_parallelism > 1 else ""), str(tmp_path / "mesh"))
  kernel = mesh.state.params["encoder"]["layer_0"]["feed_forward"]["kernel_in"]  # [seeds, d_model, d_ff]
  assert tuple(kernel.sharding.spec)[:2] == (None, "data")
  for replica in range(2):
    np.testing.assert_allclose(losses(tmp_path / "mesh", f"train/loss/seed_{replica}"),
                               losses(tmp_path / "one", f"train/loss/seed_{replica}"), rtol=2e-4)
  assert_params_close(mesh.state.params, one.state.params, rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_vmapped_rnn_seeds_equal_separate_runs(tmp_path):
  """The GRU encoder-decoder's seeds in one program follow the separate runs, training and greedy evaluation.
  The vmapped program runs on one CPU device, where a vmapped init of this model never finished (the
  replicas are initialised one after the other); the tests' 8 virtual devices hid that stall."""
  import os
  from experiments.ablations import rnn_attention
  from experiments.ablations.common import apply_overrides
  from tests.train.conftest import finish, start_launch

  settings = {"num_train_steps": 6, "log_every": 3, "eval_every": 6, "checkpoint_every": 6, "quiet": True,
              "async_checkpointing": False, "data_seed": 5, "task.num_eval_examples": 16}
  env = {name: value for name, value in os.environ.items() if name != "XLA_FLAGS"}
  together = tmp_path / "vmap"
  process = start_launch("--config=experiments/ablations/rnn_attention.py:additive", f"--workdir={together}",
                         "--config.num_seeds=2", "--config.seed=5",
                         *(f"--config.{name}={value}" for name, value in settings.items()), env=env)
  output, = finish(process, timeout=300)
  assert process.returncode == 0, output
  for replica in range(2):
    config = rnn_attention.get_config("additive")
    apply_overrides(config, {**settings, "seed": 5 + replica, "num_seeds": 1})
    alone = run(config, str(tmp_path / f"seed{replica}"))
    for name in ("train/loss", "eval/exact_match", "eval/token_accuracy"):
      np.testing.assert_allclose(losses(together, f"{name}/seed_{replica}"),
                                 losses(tmp_path / f"seed{replica}", name), rtol=1e-5)
    loaded = load_params(str(together), checkpoint="latest", replica=replica)
    assert_params_close(loaded.params, alone.state.params, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_vmap_over_swept_variants_equals_separate_runs(make_config, tmp_path):
  """config.sweep: 2 variants (learning rate, warmup and label smoothing zipped) x 2 seeds in one program;
  replica r is variant r // 2 with seed 3 + r % 2, and follows the separate run of that variant and seed."""
  sweep = "optimizer.learning_rate=0.002,0.0005;optimizer.warmup_steps=8,0;label_smoothing=0,0.1"
  together = run(make_config(num_seeds=2, seed=3, sweep=sweep), str(tmp_path / "vmap"))
  assert together.train_step_compilations == 1
  variants = [dict(optimizer__learning_rate=0.002, optimizer__warmup_steps=8, label_smoothing=0.0),
              dict(optimizer__learning_rate=0.0005, optimizer__warmup_steps=0, label_smoothing=0.1)]
  for replica in range(4):
    alone_dir = tmp_path / f"replica{replica}"
    alone = run(make_config(seed=3 + replica % 2, data_seed=3, **variants[replica // 2]), str(alone_dir))
    for name in ("train/loss", "train/learning_rate"):
      np.testing.assert_allclose(losses(tmp_path / "vmap", f"{name}/seed_{replica}"), losses(alone_dir, name),
                                 rtol=1e-5)
    replica_params = jax.tree.map(lambda x: np.asarray(x)[replica], together.state.params)
    assert_params_close(replica_params, alone.state.params, rtol=1e-4, atol=1e-6)
    for name in ("eval/loss", "eval/exact_match"):  # the eval loss is smoothed as the replica's training was
      np.testing.assert_allclose(losses(tmp_path / "vmap", f"{name}/seed_{replica}"), losses(alone_dir, name),
                                 rtol=1e-5)
    loaded = load_params(str(tmp_path / "vmap"), checkpoint="latest", replica=replica)
    assert_params_close(loaded.params, replica_params, rtol=0, atol=0)
  # Each variant's mean over its seeds, beside the mean over all replicas.
  for record in (r for r in read_metrics(str(tmp_path / "vmap")) if "eval/loss" in r):
    for variant in range(2):
      assert record[f"eval/loss/variant_{variant}"] == pytest.approx(
          np.mean([record[f"eval/loss/seed_{2 * variant + i}"] for i in range(2)]))
  # Interrupted at step 10 and resumed, the sweep ends where the uninterrupted one did (Adam's count, which
  # drives each variant's schedule, is in the checkpoint).
  shutil.copytree(tmp_path / "vmap", tmp_path / "resumed")
  shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "20")  # as if killed before the last save
  resumed = run(make_config(num_seeds=2, seed=3, sweep=sweep), str(tmp_path / "resumed"))
  assert resumed.step == 20
  np.testing.assert_allclose(losses(tmp_path / "resumed", "train/loss/seed_3"),
                             losses(tmp_path / "vmap", "train/loss/seed_3"), rtol=1e-6)
  assert_params_close(resumed.state.params, together.state.params, rtol=1e-6, atol=1e-7)
  # The variants differ: a run that ignored the sweep would give all four the first variant's curve.
  assert not np.allclose(losses(tmp_path / "vmap", "train/loss/seed_0"), losses(tmp_path / "vmap", "train/loss/seed_2"))


@pytest.mark.slow
def test_vmapped_seeds_resume_from_a_checkpoint_between_logging_steps(make_config, tmp_path):
  """A checkpoint between two logging steps (as a SIGTERM's) holds each seed's partial window of metrics;
  resumed from it, the next logged means are those of the uninterrupted run."""
  config = dict(num_seeds=2, seed=3, num_train_steps=10, log_every=5, checkpoint_every=3, eval_every=10,
                keep_checkpoints=5)
  run(make_config(**config), str(tmp_path / "whole"))
  shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
  for step in (tmp_path / "resumed" / "checkpoints").iterdir():
    if step.name.isdigit() and int(step.name) > 3:
      shutil.rmtree(step)  # as if killed after the save at step 3, two steps into the window that logs at 5
  resumed = run(make_config(**config), str(tmp_path / "resumed"))
  assert resumed.step == 10
  for replica in range(2):
    np.testing.assert_allclose(losses(tmp_path / "resumed", f"train/loss/seed_{replica}"),
                               losses(tmp_path / "whole", f"train/loss/seed_{replica}"), rtol=1e-6)


@pytest.mark.parametrize("sweep,message", [
    ("model.num_heads=2,4", r"'model.num_heads' cannot be swept in one program; choose from \['optimizer"),
    ("optimizer.learning_rate=1e-3,fast", r"must be numbers separated by commas"),
    ("optimizer.learning_rate=1e-3,2e-3;label_smoothing=0", r"as many values each; got \{'optimizer"),
    ("optimizer.learning_rate=1e-3,-1", r"every learning rate must be > 0, got -1"),
    ("optimizer.warmup_steps=10,2.5", r"warmup steps must be whole numbers >= 0, got 2.5"),
    ("label_smoothing=0,1.5", r"label_smoothing=1.5 is outside \[0, 1\)"),
])
def test_a_bad_sweep_is_one_clear_error(make_config, tmp_path, sweep, message):
  with pytest.raises(ConfigError, match=message):
    run(make_config(sweep=sweep), str(tmp_path))


def test_a_sweep_is_refused_under_pmap(make_config, tmp_path):
  with pytest.raises(ConfigError, match=r"vmap over variants\) needs config.parallelism 'jit' or 'mesh', not 'pmap'"):
    run(make_config(sweep="optimizer.learning_rate=1e-3,2e-3", parallelism="pmap"), str(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("first,second", [("mesh", "jit"), ("jit", "pmap")])
def test_resume_on_another_parallelism(make_config, tmp_path, reference, first, second):
  """Checkpoints hold the canonical state: saved under one layout (8 or 1 devices), resumed under another."""
  run(make_config(parallelism=first, num_train_steps=10), str(tmp_path))
  resumed = run(make_config(parallelism=second), str(tmp_path))
  assert resumed.step == 20
  np.testing.assert_allclose(losses(tmp_path), losses(reference[0]), rtol=2e-4)
  assert_params_close(resumed.state.params, reference[1].state.params, rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_bfloat16_compute_trains(make_config, tmp_path):
  output = run(make_config(num_train_steps=40, model__dtype="bfloat16"), str(tmp_path))
  curve = losses(tmp_path)
  assert curve[-1] < 0.8 * curve[0]
  assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(output.state.params))  # params stay float32


@pytest.mark.parametrize("text,lines", [
    ("", []),
    ("one\n", ["one"]),
    ("one", ["one"]),
    ("one\n\ntwo\n", ["one", "", "two"]),
    ("\n", [""]),
    ("a\u2028b\x0cc\x1cd\re\n", ["a\u2028b\x0cc\x1cd\re"]),  # str.splitlines would break this line 5 times
])
def test_translate_input_is_split_at_newlines_only(text, lines):
  from launch import split_input_lines
  assert split_input_lines(text) == lines


def test_translate_input_that_is_not_utf8_is_one_clear_error(tmp_path):
  from transformer.errors import InputFileError
  from launch import read_input_lines
  path = tmp_path / "input.txt"
  path.write_bytes("Straße\n".encode() + b"caf\xe9\n")
  with pytest.raises(InputFileError, match=r"is not UTF-8 text: byte b'\\xe9' at offset 11 \(line 2\).*iconv"):
    read_input_lines(str(path))
  path.write_bytes("Straße\n\n".encode())
  assert read_input_lines(str(path)) == ["Straße", ""]


def test_modes_are_separate_functions_behind_run(make_config, tmp_path, monkeypatch):
  """``run`` dispatches each mode to its own function (launch.py --mode=... calls run)."""
  from transformer.train import modes
  called = []
  for mode in modes.MODE_FUNCTIONS:
    monkeypatch.setitem(modes.MODE_FUNCTIONS, mode, lambda config, workdir, *lines, mode=mode: called.append(mode))
  for mode in ("train", "eval", "predict", "translate"):
    run(make_config(), str(tmp_path), mode)
  assert called == ["train", "eval", "predict", "translate"]
  with pytest.raises(ValueError, match="--mode='fly' is not supported"):
    run(make_config(), str(tmp_path), "fly")


@pytest.mark.slow
def test_the_eta_leaves_compilation_out(make_config, tmp_path, monkeypatch):
  """The first logging window holds the compiling call, made slow here: the log line's ETA is paced by the
  steps after it, not by a window whose first step took seconds."""
  import time

  from transformer.train import loop
  announce, paces = loop.Trainer._announce_compilation, []

  def slow_compilation(trainer, batch, stacked=0):
    if not trainer.seen_shapes:
      time.sleep(2.0)  # inside the first call, which compiles
    announce(trainer, batch, stacked)

  def recorded_line(step, total, metrics, seconds_per_step, window_steps=0):
    paces.append(seconds_per_step)
    return log_line(step, total, metrics, seconds_per_step, window_steps)

  log_line = loop.log_line
  monkeypatch.setattr(loop.Trainer, "_announce_compilation", slow_compilation)
  monkeypatch.setattr(loop, "log_line", recorded_line)
  run(make_config(num_train_steps=10, eval_every=10, checkpoint_every=10, quiet=False), str(tmp_path))
  assert len(paces) == 2 and paces[0] < 0.3, paces  # 2 s over 5 steps would be 0.4 s a step


def test_a_window_of_only_compiled_steps_gives_no_eta():
  from transformer.train.writers import log_line
  metrics = {"train/loss": 1.0, "train/tokens_per_second": 10.0, "train/steps_per_second": 0.5}
  assert log_line(1, 100, metrics, None) == "step 1/100 (1%): loss 1.0000, 10 tokens/s, 0.50 steps/s"
  assert log_line(40, 100, metrics, 60.0).endswith(", ETA 1h00m")


def test_a_replica_whose_every_step_was_skipped_logs_nan_not_a_loss_of_zero():
  from transformer.train.loop import _unmeasured_as_nan
  sums = {"loss": (np.array([0.0, 6.0]), np.array([0.0, 3.0])), "skipped_steps": (np.array([5.0, 2.0]), 0.0)}
  window = _unmeasured_as_nan(sums, steps=5)
  assert np.isnan(window["loss"][0][0]) and window["loss"][0][1] == 6.0  # replica 1 measured 3 of its 5 steps
  np.testing.assert_array_equal(window["loss"][1], [0.0, 3.0])
  np.testing.assert_array_equal(window["skipped_steps"][0], [5.0, 2.0])
  assert _unmeasured_as_nan({"loss": (np.array(1.0), np.array(1.0))}, steps=5)["loss"][0] == 1.0  # no skipping


def test_a_reader_follows_a_run_to_its_first_save_in_five_calls(tmp_path, monkeypatch):
  """``run -> run_train -> Trainer.train -> Trainer.checkpoint -> Checkpointer.save -> orbax``: the loop is one
  function, an action is the trainer's own method, and the checkpointer calls orbax itself (``launch.py`` adds
  its ``main`` and ``exit_on_user_error``: 7 frames of ours from the command to orbax)."""
  import orbax.checkpoint as ocp
  package, stacks, save = os.path.join(REPO, "transformer"), [], ocp.CheckpointManager.save
  def recorded(self, *args, **kwargs):
    stacks.append([frame.name for frame in traceback.extract_stack() if frame.filename.startswith(package)])
    return save(self, *args, **kwargs)
  monkeypatch.setattr(ocp.CheckpointManager, "save", recorded)
  run(tiny_config(num_train_steps=10, checkpoint_every=10, eval_every=10), str(tmp_path))
  assert stacks and stacks[0] == ["run", "run_train", "train", "checkpoint", "save"]
