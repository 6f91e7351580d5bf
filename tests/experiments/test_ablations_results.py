"""The ablation grid: its cells, resuming a killed grid, per-seed results, their records and the page (into
tmp_path only); the committed pages regenerate from their records."""
import dataclasses
import importlib
import json
import os
import shutil

import numpy as np
import pytest

from experiments import ablations_results, ablations_scores, launching, record_store, stats, verify
from experiments.ablations import common
from transformer.errors import ConfigError, UserError
from transformer.train import run
from transformer.train.workdir import MetricsLog, RunDirectory, read_metrics


def test_the_grid_expands_to_every_variant_and_shares_identical_configs():
  cells = launching.expand_grid(list(launching.ABLATIONS), "synthetic", "/root")
  expected = [(name, variant) for name in launching.ABLATIONS
              for variant in importlib.import_module(f"experiments.ablations.{name}").ABLATION.variants]
  assert [(cell.ablation, cell.variant) for cell in cells] == expected
  by_name = {cell.name: cell for cell in cells}
  # The reference model is one run: 4 heads, sinusoidal, LayerNorm, no regularisation.
  for name in ("positions/sinusoidal", "norms/layer_norm", "regularization/none"):
    assert by_name[name].workdir == "/root/heads/4"
  assert by_name["heads/1"].workdir == "/root/scaling/scaled"  # d_k = 64: the scaling ablation's reference
  # Warmup is swept in one program: each norm position's two warmups share a run.
  assert by_name["norm_position/post_no_warmup"].workdir == "/root/norm_position/post_warmup+post_no_warmup"
  assert by_name["norm_position/post_no_warmup"].sweep == "optimizer.warmup_steps=50,0"
  # Variants that differ only in label smoothing train in one program, vmapped over variants and seeds.
  dropout, both = by_name["regularization/dropout"], by_name["regularization/both"]
  assert dropout.workdir == both.workdir == "/root/regularization/dropout+both"
  assert dropout.sweep == both.sweep == "label_smoothing=0.0,0.1"
  assert (dropout.replica_offset, both.replica_offset) == (0, common.NUM_SEEDS)
  assert both.config == "experiments/ablations/regularization.py:dropout"
  assert both.launch_flags == ("--config.sweep=label_smoothing=0.0,0.1",)
  assert not by_name["norms/rms_norm"].sweep  # a model field: its own program
  assert len({cell.workdir for cell in cells}) == len(cells) - 7
  assert all(cell.num_seeds == common.NUM_SEEDS for cell in cells)
  assert by_name["norm_position/pre_no_warmup"].num_train_steps < by_name["heads/2"].num_train_steps
  rnn = by_name["rnn_attention/none"]  # the RNN's seeds too are one vmapped program
  assert (rnn.workdir, rnn.launch_flags, rnn.num_seeds) == ("/root/rnn_attention/none", (), common.NUM_SEEDS)
  # Choosing ablations does not move a shared cell: heads/4 stays where a full grid puts it.
  assert [c.workdir for c in launching.expand_grid(["norms"], "synthetic", "/root")][0] == "/root/heads/4"


def test_each_variant_is_its_override_and_multi30k_variants_expand():
  heads = importlib.import_module("experiments.ablations.heads")
  assert heads.get_config("16").model.num_heads == 16
  scaling = importlib.import_module("experiments.ablations.scaling")
  assert scaling.get_config("unscaled").model.scale_attention is False
  rnn = importlib.import_module("experiments.ablations.rnn_attention")
  assert rnn.get_config("none").model.attention == "none"
  assert rnn.get_config("dot,multi30k").task.dataset == "multi30k"
  cells = launching.expand_grid(["heads"], "multi30k", "/root")
  assert [cell.config for cell in cells][0] == "experiments/ablations/heads.py:1,multi30k"
  with pytest.raises(ConfigError, match="unknown variant '3' of experiments/ablations/heads.py"):
    heads.get_config("3")


@pytest.fixture
def tiny_norms(monkeypatch):
  """The norms ablation with two variants on a 1+1-layer model of 4 steps and 2 seeds."""
  original = common.synthetic_base

  def tiny_base(model_name="transformer"):
    config = original(model_name)
    common.apply_overrides(config, {
        "model.d_model": 16, "model.num_heads": 2, "model.d_ff": 32, "model.num_encoder_layers": 1,
        "model.num_decoder_layers": 1, "model.max_length": 8, "task.max_length": 6, "task.num_eval_examples": 16,
        "batch_size": 8, "eval_batch_size": 16, "num_seeds": 2, "num_train_steps": 4, "log_every": 2,
        "eval_every": 4, "checkpoint_every": 2, "quiet": True, "async_checkpointing": False})
    return config

  monkeypatch.setattr(common, "synthetic_base", tiny_base)
  norms = importlib.import_module("experiments.ablations.norms")
  two = dataclasses.replace(norms.ABLATION, variants=dict(list(norms.ABLATION.variants.items())[:2]))
  monkeypatch.setattr(norms, "ABLATION", two)
  return norms


def train_in_process(calls, **overrides):
  """A ``gather`` trainer that runs ``transformer.train.run`` here (no subprocess), recording its calls."""
  def train(config_argument, workdir, launch_flags):
    path, _, variant = config_argument.partition(":")
    module = importlib.import_module("experiments.ablations." + os.path.basename(path)[:-3])
    config = launching.config_with_flags(module.get_config(variant), list(launch_flags), leave_out=("sweep",))
    config.update(overrides)
    for flag in launch_flags:  # the launch flag a grid adds to the config
      if flag.startswith("--config.sweep="):
        config.sweep = flag.partition("=")[2]
    calls.append(workdir)
    run(config, workdir)
  return train


@pytest.mark.slow
def test_variants_of_a_sweep_train_once_and_read_as_their_own_replicas(tiny_norms, tmp_path, monkeypatch):
  regularization = importlib.import_module("experiments.ablations.regularization")
  two = dataclasses.replace(regularization.ABLATION, variants={
      name: regularization.ABLATION.variants[name] for name in ("none", "label_smoothing")})
  monkeypatch.setattr(regularization, "ABLATION", two)
  cells = launching.expand_grid(["regularization"], "synthetic", str(tmp_path), ablations=("regularization",))
  assert {cell.workdir for cell in cells} == {str(tmp_path / "regularization" / "none+label_smoothing")}
  calls = []
  store = record_store.RecordStore(str(tmp_path / "page"))
  ablations_scores.gather(cells, store, train_in_process(calls))
  assert calls == [cells[0].workdir]  # one program for both variants
  assert store["regularization/label_smoothing"]["command"] == (
      "python launch.py --config=experiments/ablations/regularization.py:none --workdir=WORKDIR "
      "--config.sweep=label_smoothing=0.0,0.1")
  run_records = read_metrics(cells[0].workdir)
  final = MetricsLog(tuple(run_records)).evaluation_at(4)
  last_loss = [r for r in run_records if "train/loss" in r][-1]
  for cell, replicas in zip(cells, ([0, 1], [2, 3])):  # each cell's seeds are its own replicas of the run
    result = ablations_scores.cell_result(cell, run_records)
    np.testing.assert_allclose(result.per_seed["eval/exact_match"],
                               [final[f"eval/exact_match/seed_{r}"] for r in replicas])
    np.testing.assert_allclose(store[cell.name]["values"]["per_seed"]["eval/nll"],
                               [final[f"eval/nll/seed_{r}"] for r in replicas])
    assert result.train_loss[-1] == [4, [last_loss[f"train/loss/seed_{r}"] for r in replicas]]
  # Each variant's replicas got its own label smoothing: without it the loss is the NLL, with it it is not.
  for replica in (0, 1):
    assert final[f"eval/loss/seed_{replica}"] == pytest.approx(final[f"eval/nll/seed_{replica}"], rel=1e-6)
  for replica in (2, 3):
    assert abs(final[f"eval/loss/seed_{replica}"] - final[f"eval/nll/seed_{replica}"]) > 0.01


@pytest.mark.slow
def test_a_cells_run_log_is_kept_beside_the_page_and_verify_recomputes_its_record(tiny_norms, tmp_path, monkeypatch):
  """The two variants of one sweep share their run's log (``logs/<run>.jsonl``); ``verify`` gives back each cell's
  record from it, names a changed seed's metric, and lists the cells whose log is gone."""
  regularization = importlib.import_module("experiments.ablations.regularization")
  monkeypatch.setattr(regularization, "ABLATION", dataclasses.replace(regularization.ABLATION, variants={
      name: regularization.ABLATION.variants[name] for name in ("none", "label_smoothing")}))
  monkeypatch.setattr(launching, "ABLATIONS", ("regularization",))  # the grid verify expands
  cells = launching.expand_grid(["regularization"], "synthetic", str(tmp_path / "runs"), ablations=("regularization",))
  folder = tmp_path / "committed" / "ablations"
  store = record_store.RecordStore(str(folder))
  ablations_scores.gather(cells, store, train_in_process([]))
  store.save()
  log = folder / "logs" / "regularization" / "none+label_smoothing.jsonl"
  assert sorted(os.listdir(folder / "logs" / "regularization")) == [log.name]
  run_log = tmp_path / "runs" / "regularization" / "none+label_smoothing" / "metrics.jsonl"
  assert log.read_text() == run_log.read_text()

  monkeypatch.setattr(record_store, "COMMITTED", str(tmp_path / "committed"))
  page = "experiments/ablations/RESULTS.md"
  tally = verify.Tally()
  verify.check_ablation_logs(tally, page)
  assert tally.differences == [] and tally.not_verified == []
  assert tally.verified[page]["from committed training logs"] == 2 * 5  # steps, per-seed, diverged, wall, losses

  lines = log.read_text().splitlines()
  final = json.loads(lines[-1])
  final["eval/exact_match/seed_3"] += 0.25  # label_smoothing's second seed (replicas 2, 3)
  log.write_text("\n".join(lines[:-1] + [json.dumps(final)]) + "\n")
  tally = verify.Tally()
  verify.check_ablation_logs(tally, page)
  assert len(tally.differences) == 1 and "cell 'regularization/label_smoothing', per_seed" in tally.differences[0]
  log.unlink()
  tally = verify.Tally()
  verify.check_ablation_logs(tally, page)
  assert tally.verified[page]["from committed training logs"] == 0
  assert len(tally.not_verified) == 1 and "of all 2 cells" in tally.not_verified[0]


@pytest.mark.slow
def test_a_killed_grid_resumes_without_redoing_finished_cells(tiny_norms, tmp_path):
  cells = launching.expand_grid(["norms"], "synthetic", str(tmp_path), ablations=("norms",))
  assert [cell.variant for cell in cells] == ["layer_norm", "rms_norm"]
  finished, killed = cells
  calls = []
  ablations_scores.gather([finished], record_store.RecordStore(str(tmp_path / "first")), train_in_process(calls))
  # The killed cell: a checkpoint at step 2 of 4 and the metrics up to it, as a run stopped there leaves them.
  train_in_process(calls, num_train_steps=2, eval_every=2)("experiments/ablations/norms.py:rms_norm",
                                                         killed.workdir, ())
  assert RunDirectory(killed.workdir).metrics().evaluation_at(killed.num_train_steps) is None
  before = (tmp_path / "norms" / "layer_norm" / "metrics.jsonl").read_text()

  calls.clear()
  output = tmp_path / "page"
  store = record_store.RecordStore(str(output))
  ablations_scores.gather(cells, store, train_in_process(calls))
  assert calls == [killed.workdir]  # the finished cell is not run again
  assert (tmp_path / "norms" / "layer_norm" / "metrics.jsonl").read_text() == before
  steps = [record["step"] for record in read_metrics(killed.workdir) if "train/loss" in record]
  assert steps == [2, 4]  # resumed from step 2, not restarted
  assert store[killed.name]["command"] == "python launch.py --config=experiments/ablations/norms.py:rms_norm " \
                                          "--workdir=WORKDIR"
  assert {name: record["steps"] for name, record in store.items()} == {"norms/layer_norm": 4, "norms/rms_norm": 4}

  calls.clear()
  ablations_scores.gather(cells, store, train_in_process(calls))
  assert calls == []

  statistics = ablations_scores.attention_statistics(finished.workdir, replica=1)
  assert set(statistics) == {"encoder_self", "decoder_self", "cross"}
  for entropy, uniform, saturated in statistics.values():
    assert 0.0 <= entropy <= uniform + 1e-6 and 0.0 <= saturated <= 1.0  # no row is flatter than uniform
  for cell in cells:
    result = ablations_scores.cell_result(cell, read_metrics(cell.workdir))
    assert result.per_seed["eval/exact_match"].shape == (2,)  # per seed, from eval/exact_match/seed_i
    assert result.steps == 4 and result.diverged in (0, 1, 2)
  page = _page(output, cells, store)
  assert "## LayerNorm vs RMSNorm vs BatchNorm" in page
  assert "`python launch.py --config=experiments/ablations/norms.py:rms_norm --workdir=WORKDIR`" in page
  assert (output / "norms.png").stat().st_size > 0
  shorter = [dataclasses.replace(cell, num_train_steps=2) for cell in cells]
  with pytest.raises(UserError, match="row 'norms/layer_norm' records a run of 4 training steps"):
    ablations_scores.gather(shorter, store, train=pytest.fail)  # refused before anything trains


@pytest.mark.slow
def test_recorded_cells_stand_in_for_absent_runs_unless_their_config_changed(tiny_norms, tmp_path):
  cells = launching.expand_grid(["norms"], "synthetic", str(tmp_path / "first"), ablations=("norms",))
  calls = []
  elsewhere_hardware = "1 x NVIDIA H200, 16 cores"  # --hardware: the runs were copied back from a GPU machine
  known = record_store.RecordStore(str(tmp_path / "page"))
  ablations_scores.gather(cells, known, train_in_process(calls), hardware=elsewhere_hardware)
  assert calls == [cell.workdir for cell in cells]
  assert list(known) == ["norms/layer_norm", "norms/rms_norm"]
  assert {record["machine"] for _, record in known.items()} == {elsewhere_hardware}
  page = _page(tmp_path / "page", cells, known)
  assert page.count(f"| {elsewhere_hardware} |") == 2
  # Read again from the same runs without --hardware: the record of the same run says where it trained.
  ablations_scores.gather(cells, known, train=None)
  assert {record["machine"] for _, record in known.items()} == {elsewhere_hardware}
  here = record_store.RecordStore(str(tmp_path / "here"))
  ablations_scores.gather(cells, here, train=None)
  assert {record["machine"] for _, record in here.items()} == {record_store.hardware()}

  # Another machine: the same grid under an empty root is read from the records; nothing trains, same page.
  elsewhere = launching.expand_grid(["norms"], "synthetic", str(tmp_path / "second"), ablations=("norms",))
  calls.clear()
  before = json.dumps(known.records, sort_keys=True)
  ablations_scores.gather(elsewhere, known, train_in_process(calls))
  assert calls == []
  assert not any(os.path.exists(cell.workdir) for cell in elsewhere)
  assert json.dumps(known.records, sort_keys=True) == before
  assert _page(tmp_path / "page_again", elsewhere, known) == page

  # A record whose config disagrees on a field both have trains its cell; a field only the record has does not.
  known["norms/rms_norm"]["values"]["config"]["optimizer.learning_rate"] *= 2
  known["norms/layer_norm"]["values"]["config"]["a_field.since_removed"] = 1
  calls.clear()
  ablations_scores.gather(elsewhere, known, train_in_process(calls))
  assert calls == [elsewhere[1].workdir]
  calls.clear()  # --ignore_recorded: the unfinished cell trains, the finished one is read from its run
  ablations_scores.gather(elsewhere, known, train_in_process(calls), ignore_recorded=True)
  assert calls == [elsewhere[0].workdir]


@pytest.mark.slow
def test_a_launch_flag_is_part_of_each_cell_and_sets_its_step_target(tiny_norms, tmp_path):
  """Issue 57: ``--launch_flag=--config.num_train_steps=20`` trained nothing and showed the recorded 300-step
  numbers beside a 20-step command (with ``--ignore_recorded``: trained 20 steps, then wanted an evaluation at
  step 300). A --config flag is part of each cell's config: its step target follows the flag, and a record made
  without the flag does not stand in for the cell (nor one made with it for a cell without)."""
  plain = launching.expand_grid(["norms"], "synthetic", str(tmp_path / "first"), ablations=("norms",))
  calls = []
  committed = record_store.RecordStore(str(tmp_path / "committed"))
  ablations_scores.gather(plain, committed, train_in_process(calls))  # the committed rows: 4 steps
  committed.save()
  flags = ("--config.num_train_steps=2",)
  cells = launching.expand_grid(["norms"], "synthetic", str(tmp_path / "second"), ablations=("norms",),
                                launch_flags=flags)
  assert [(cell.num_train_steps, cell.flat_config["num_train_steps"]) for cell in cells] == [(2, 2), (2, 2)]
  assert [launching.find_record(cell, committed) for cell in cells] == [None, None]
  for ignore_recorded in (False, True):  # a page of one's own, from the committed rows
    store = record_store.RecordStore(str(tmp_path / f"mine_{ignore_recorded}"), start_from=str(tmp_path / "committed"),
                                     force=True)
    calls.clear()
    ablations_scores.gather(cells, store, train_in_process(calls), launch_flags=flags,
                            ignore_recorded=ignore_recorded)
    assert calls == ([cell.workdir for cell in cells] if not ignore_recorded else [])  # trained once, then finished
    for cell in cells:
      final = RunDirectory(cell.workdir).metrics().evaluation_at(2)
      record = store[cell.name]
      assert record["steps"] == 2 and record["command"].endswith("--workdir=WORKDIR --config.num_train_steps=2")
      assert record["values"]["per_seed"]["eval/nll"] == [final[f"eval/nll/seed_{i}"] for i in range(2)]
    results, unfinished = ablations_scores.recorded_results(cells, store)
    assert [result.steps for result in results["norms"]] == [2, 2] and unfinished == ()
    assert ablations_scores.recorded_results(plain, store) == ({}, tuple(cell.name for cell in plain))
  elsewhere = launching.expand_grid(["norms"], "synthetic", str(tmp_path / "third"), ablations=("norms",),
                                    launch_flags=flags)
  assert all(launching.find_record(cell, store) for cell in elsewhere)  # the same flag: it stands in
  # Where the data lives is no setting: such a flag leaves the cells (and which records stand in) as they are.
  moved = launching.expand_grid(["norms"], "synthetic", str(tmp_path / "first"), ablations=("norms",),
                                launch_flags=("--config.task.source_dir=/data/elsewhere",))
  assert [launching.find_record(cell, committed) for cell in moved] == [committed[c.name] for c in plain]
  with pytest.raises(UserError, match="--config.num_train_step=2: the config has no field 'num_train_step' "
                                      r"\(Did you mean \"num_train_steps\""):
    launching.expand_grid(["norms"], "synthetic", "/root", ablations=("norms",),
                          launch_flags=("--config.num_train_step=2",))


def _page(output, cells, store) -> str:
  """The page of ``cells`` from ``store`` (as main's render), drawn into ``output``."""
  os.makedirs(output, exist_ok=True)
  results, unfinished = ablations_scores.recorded_results(cells, store)
  return ablations_results.render_page(str(output), results, "python -m ...", "synthetic", unfinished)


@pytest.mark.slow
def test_without_training_the_page_holds_the_finished_cells_and_names_the_others(tiny_norms, tmp_path):
  cells = launching.expand_grid(["norms"], "synthetic", str(tmp_path / "a"), ablations=("norms",))
  reference, killed = cells
  calls = []
  ablations_scores.gather([reference], record_store.RecordStore(str(tmp_path / "trained")), train_in_process(calls))
  train_in_process(calls, num_train_steps=2, eval_every=2)("experiments/ablations/norms.py:rms_norm",
                                                         killed.workdir, ())
  calls.clear()
  store = record_store.RecordStore(str(tmp_path / "page"))
  ablations_scores.gather(cells, store, train=None)
  assert calls == [] and max(r["step"] for r in read_metrics(killed.workdir)) == 2  # nothing trained or resumed
  assert list(store) == [reference.name]
  page = _page(tmp_path / "page", cells, store)
  assert f"(`--notrain`), so left out with any table whose reference they are: {killed.name}." in page
  assert "| norms/layer_norm |" in page and "| norms/rms_norm |" not in page

  # Only a non-reference cell finished: it is recorded, but its ablation has no table to compare it in.
  cells = launching.expand_grid(["norms"], "synthetic", str(tmp_path / "b"), ablations=("norms",))
  ablations_scores.gather(cells[1:], record_store.RecordStore(str(tmp_path / "b_trained")), train_in_process(calls))
  store = record_store.RecordStore(str(tmp_path / "b_page"))
  ablations_scores.gather(cells, store, train=None)
  assert list(store) == [cells[1].name] and ablations_scores.recorded_results(cells, store)[0] == {}


def test_a_damaged_records_file_is_one_clear_error(tmp_path):
  (tmp_path / record_store.RECORDS_FILE).write_text('{"heads/4": {"run": ')
  with pytest.raises(SystemExit, match="records.json is not the JSON of a record store.*git checkout"):
    ablations_results.main([f"--output_dir={tmp_path}", "--from_records"])


def test_a_cell_sharing_a_run_finds_the_record_of_that_run():
  cells = {cell.name: cell for cell in launching.expand_grid(
      list(launching.ABLATIONS), "synthetic", "/root")}
  shared = cells["positions/sinusoidal"]
  assert shared.run == "heads/4" and cells["heads/4"].run == "heads/4"
  positions = importlib.import_module("experiments.ablations.positions")
  assert shared.flat_config == launching.flatten_config(positions.get_config("sinusoidal"))  # its own variant's
  store = record_store.RecordStore("/no/folder")
  store.add("heads/4", steps=shared.num_train_steps, command="c", machine="m", values={
      "run": "heads/4", "replica_offset": 0, "num_seeds": shared.num_seeds, "config": shared.flat_config})
  assert launching.find_record(shared, store) is store["heads/4"]
  assert launching.find_record(cells["heads/8"], store) is None
  store.add("heads/4", steps=1, command="c", machine="m", values=store["heads/4"]["values"], force=True)
  assert launching.find_record(shared, store) is None  # another number of steps: another run


def test_cell_result_counts_diverged_seeds_and_reports_mean_and_spread():
  cell = launching.Cell("norm_position", "post_no_warmup", "c", "w", 4, 3)
  records = [
      {"step": 2, "train/loss": 1.0, "train/loss/seed_0": 1.0, "train/loss/seed_1": float("nan"),
       "train/loss/seed_2": 1.0},
      {"step": 4, "train/loss": 1.0, "train/loss/seed_0": 0.5, "train/loss/seed_1": 0.5, "train/loss/seed_2": 2.3,
       "train/skipped_steps/seed_0": 0.0, "train/skipped_steps/seed_1": 0.0, "train/skipped_steps/seed_2": 0.0},
      {"step": 4, "wall_seconds": 9.0, "eval/exact_match": 0.5, "eval/exact_match/seed_0": 0.4,
       "eval/exact_match/seed_1": 0.5, "eval/exact_match/seed_2": 0.6},
  ]
  result = ablations_scores.cell_result(cell, records)
  assert result.diverged == 2  # seed 1 went non-finite, seed 2 ends above DIVERGED_LOSS
  np.testing.assert_allclose(result.per_seed["eval/exact_match"], [0.4, 0.5, 0.6])
  assert stats.mean_std(result.per_seed["eval/exact_match"]) == "0.500 ± 0.100"
  assert stats.mean_std(np.array([1.0, np.nan])) == "1.000 ± 0.000 (1 not finite)"
  other = dataclasses.replace(result, cell=dataclasses.replace(cell, variant="pre"),
                              per_seed={"eval/exact_match": np.array([0.9, 0.9, 0.9])})
  assert "+0.400 exact match against post_no_warmup" in ablations_results.comparison(other, result)
  assert "larger than the spread" in ablations_results.comparison(other, result)


def test_a_multi30k_cell_is_read_and_compared_in_bleu_with_its_own_divergence_threshold(tmp_path):
  """Multi30k cells report BLEU (first column, compared and plotted) and call a seed diverged above 5 nats,
  where a synthetic cell's 2-nat threshold would count every seed of a translation model."""
  cell = launching.Cell("scaling", "scaled", "c", "w", 4, 2, task="multi30k")
  records = [{"step": 4, "train/loss": 4.25, "train/loss/seed_0": 3.1, "train/loss/seed_1": 5.4},
             {"step": 4, "wall_seconds": 9.0, "eval/bleu": 22.0, "eval/bleu/seed_0": 20.0, "eval/bleu/seed_1": 24.0,
              "eval/nll": 2.25, "eval/nll/seed_0": 2.0, "eval/nll/seed_1": 2.5, "eval/exact_match": 0.1}]
  reference = ablations_scores.cell_result(cell, records)
  assert reference.diverged == 1  # 3.1 nats trains, 5.4 does not
  assert set(reference.per_seed) == {"eval/bleu", "eval/nll"}  # the task's metrics only
  other = dataclasses.replace(reference, cell=dataclasses.replace(cell, variant="unscaled"),
                              per_seed={"eval/bleu": np.array([10.0, 11.0])})
  assert ablations_results.comparison(other, reference).startswith(
      "unscaled: -11.50 BLEU against scaled (standard error 2.06; larger than the spread")
  page = ablations_results.render_page(str(tmp_path), {"scaling": [reference, other]}, "python -m ...", "multi30k")
  assert "| run | BLEU | token accuracy | NLL (nats/token) | diverged |" in page
  assert "| scaling/scaled | 22.00 ± 2.83 | n/a | 2.250 ± 0.354 | 1 of 2 |" in page
  assert "Against the reference (scaled), BLEU:" in page and "above 5.0 nats" in page
  assert "SentencePiece" not in page  # nothing recorded, one machine: nothing to say


def test_the_page_groups_cells_by_tokenizer_and_flags_tables_that_mix_them(tmp_path):
  """A run keeps its SentencePiece models in WORKDIR/tokenizers/: the record carries their fingerprint and a
  table whose cells tokenized differently (or may have: unrecorded runs on other hardware) says so."""
  cell = launching.Cell("scaling", "scaled", "c", str(tmp_path / "scaled"), 4, 1, task="multi30k")
  os.makedirs(tmp_path / "scaled" / "tokenizers")
  for name in ("source", "target"):
    (tmp_path / "scaled" / "tokenizers" / f"{name}.aaaa1111bbbb.model").write_bytes(b"x")
  records = [{"step": 4, "train/loss": 3.0}, {"step": 4, "wall_seconds": 9.0, "eval/bleu": 20.0}]
  reference = ablations_scores.cell_result(cell, records, hardware="1 x cpu, 2 cores")
  assert reference.tokenizers == "aaaa1111bbbb"
  record = {"steps": 4, "machine": "m", "values": ablations_scores.record_values(reference)}
  assert ablations_scores.recorded_result(cell, record).tokenizers == "aaaa1111bbbb"
  unscaled = dataclasses.replace(cell, variant="unscaled", workdir=str(tmp_path / "unscaled"))
  same = dataclasses.replace(reference, cell=unscaled)
  other = dataclasses.replace(same, tokenizers="cccc2222dddd")
  unknown_elsewhere = dataclasses.replace(same, tokenizers="", hardware="1 x NVIDIA H200, 16 cores")
  assert ablations_results.tokenizer_caveat([reference, same]) == ""
  assert "did not all tokenize" in ablations_results.tokenizer_caveat([reference, other])
  assert "may not all tokenize" in ablations_results.tokenizer_caveat([reference, unknown_elsewhere])
  assert ablations_results.tokenizer_caveat([reference, dataclasses.replace(same, tokenizers="")]) == ""
  os.makedirs(tmp_path / "page")
  page = ablations_results.render_page(str(tmp_path / "page"), {"scaling": [reference, unknown_elsewhere]},
                                       "python -m ...", "multi30k")
  assert "- aaaa1111bbbb: scaling/scaled (1 x cpu, 2 cores)\n" in page
  assert "- not recorded (the run predates WORKDIR/tokenizers/): scaling/unscaled (1 x NVIDIA H200, 16 cores)" in page
  assert "(scaled: aaaa1111bbbb; unscaled: not recorded)" in page



def test_attention_statistics_read_the_splits_first_pairs_whatever_the_batching():
  # Token batches: the shortest sentences first, filler rows (index -1, all padding) at the end of a batch.
  bucketed = [{"source": np.array([[7, 0], [8, 0], [0, 0]]), "target": np.array([[5, 0], [6, 0], [0, 0]]),
               "index": np.array([2, 0, -1])},
              {"source": np.array([[3, 4], [0, 0]]), "target": np.array([[9, 9], [0, 0]]), "index": np.array([1, -1])}]
  sources, targets = ablations_scores.first_pairs(bucketed, 2, pad=0)
  assert [s.tolist() for s in sources] == [[8], [3, 4]] and [t.tolist() for t in targets] == [[6], [9, 9]]
  # Fixed-size batches without an index: batch order.
  plain = [{"source": np.array([[1, 2], [3, 0]]), "target": np.array([[1, 0], [2, 0]])},
           {"source": np.array([[4, 4]]), "target": np.array([[3, 3]])}]
  assert [s.tolist() for s in ablations_scores.first_pairs(plain, 5, pad=0)[0]] == [[1, 2], [3], [4, 4]]


def test_each_comparison_gives_welchs_t_and_p_beside_the_screen():
  """The screen (difference > 2 standard errors) is |t| > 2; with 3 seeds a side that can still be p > 0.05,
  so the sentence carries Welch's t, its degrees of freedom and the p-value."""
  cell = launching.Cell("norms", "layer_norm", "c", "w", 4, 3)
  reference = ablations_scores.CellResult(cell, {"eval/exact_match": np.array([0.50, 0.52, 0.54])}, 0, 1.0, 4, [])
  other = dataclasses.replace(reference, cell=dataclasses.replace(cell, variant="rms_norm"),
                              per_seed={"eval/exact_match": np.array([0.54, 0.56, 0.58])})
  sentence = ablations_results.comparison(other, reference)
  t, df, p = stats.welch_t_test([0.54, 0.56, 0.58], [0.50, 0.52, 0.54])
  assert 2 < t < 3 and p > 0.05  # the screen's "larger", not significant at 5%
  assert "larger than the spread of seeds" in sentence
  assert f"Welch's t = {t:.2f}, {df:.1f} degrees of freedom, p = {p:.3f}" in sentence
  one_seed = dataclasses.replace(other, per_seed={"eval/exact_match": np.array([0.9])})
  assert "Welch" not in ablations_results.comparison(one_seed, reference)  # no variance: no test


def test_a_regularization_table_on_multi30k_says_how_its_cells_stand_against_the_base_model(tmp_path):
  """On Multi30k the base trains with dropout 0.3 and the regularization variants set dropout themselves, so
  that table's reference is not the other tables'; the page names the base's settings and score and the cell
  that differs from it in dropout alone."""
  cells = {cell.name: cell for cell in launching.expand_grid(
      ["positions", "regularization"], "multi30k", "/root")}

  def result(name, bleu):
    return ablations_scores.CellResult(cells[name], {"eval/bleu": np.array(bleu)}, 0, 1.0, 600, [[600, [2.0] * 3]])
  results = {"positions": [result("positions/sinusoidal", [22.0, 22.5, 22.0])],
             "regularization": [result("regularization/none", [28.0, 29.0, 29.5]),
                                result("regularization/both", [27.0, 27.5, 27.2])]}
  text = ablations_results.against_base(results["regularization"], results, "multi30k")
  assert "dropout 0.3, attention dropout 0.1, label smoothing 0.1, and scores 22.17 BLEU" in text
  assert "both, differs from the base only in model.dropout_rate 0.1 against 0.3: 27.23 against 22.17" in text
  assert "for its dropout 0.3 within a budget of 600 steps" in text
  assert ablations_results.against_base(results["positions"], results, "multi30k") == ""  # the base itself
  assert ablations_results.against_base(results["regularization"], {"regularization": results["regularization"]},
                                        "multi30k") == ""  # no table holds the base: nothing to compare with
  page = ablations_results.render_page(str(tmp_path), results, "python -m ...", "multi30k")
  assert text in page.split("## Label smoothing and dropout")[1]
  assert "pre-LN; dropout 0.3 on the residual sublayers, 0.1 on the attention weights, label smoothing 0.1" in page


def test_from_records_without_the_records_file_refuses_and_keeps_the_committed_page(tmp_path, monkeypatch):
  """Issue 57: ``--from_records --update_committed`` with records.json gone deleted the whole page (5,933 lines),
  exit 0; now one line naming the file, and the folder as it was."""
  shutil.copytree(os.path.join(record_store.COMMITTED, "ablations"), tmp_path / "ablations")
  (tmp_path / "ablations" / "records.json").unlink()
  before = {name: (tmp_path / "ablations" / name).read_bytes() for name in os.listdir(tmp_path / "ablations")
            if os.path.isfile(tmp_path / "ablations" / name)}
  monkeypatch.setattr(record_store, "COMMITTED", str(tmp_path))
  with pytest.raises(SystemExit) as exited:
    ablations_results.main(["--from_records", "--update_committed", f"--workdir_root={tmp_path / 'none'}"])
  assert str(exited.value).startswith(f"error: --from_records: there is no {tmp_path / 'ablations' / 'records.json'}")
  assert before == {name: (tmp_path / "ablations" / name).read_bytes() for name in before}
  assert not (tmp_path / "ablations" / "records.json").exists()


@pytest.mark.parametrize("task, arguments", [
    ("synthetic", []),
    ("multi30k", ["--task=multi30k", "--ablation=" + ",".join(launching.ABLATIONS)])])  # as its page says
def test_the_committed_page_is_regenerated_from_its_records_alone(task, arguments, tmp_path, monkeypatch):
  """``--from_records --update_committed`` (on a copy of the committed folder): no workdir is read, and the page
  is the committed one but for the line that says where and when it was written."""
  shutil.copytree(os.path.join(record_store.COMMITTED, "ablations"), tmp_path / "ablations")
  folder = tmp_path / "ablations" / ("" if task == "synthetic" else task)
  before = (folder / "RESULTS.md").read_text()
  (folder / "RESULTS.md").unlink()  # so that only a page written again from the records can match
  monkeypatch.setattr(record_store, "COMMITTED", str(tmp_path))
  ablations_results.main([*arguments, "--from_records", "--update_committed", f"--workdir_root={tmp_path / 'none'}"])
  stamp = lambda text: [line for line in text.splitlines() if not line.startswith("Page written on: ")]
  assert stamp((folder / "RESULTS.md").read_text()) == stamp(before)
