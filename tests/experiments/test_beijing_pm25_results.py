"""The PM2.5 results page: windows chosen on validation, test metrics of a run's seeds and of persistence on the
common windows recomputed independently, the paired comparison, the committed forecasts, the validation errors
giving back the logged validation MAE, the block bootstrap; a recorded run is only replaced by one at least as long,
and the page is rewritten from records.json and the forecasts alone."""
import json
import os
import shutil

import numpy as np
import pytest

from experiments import beijing_pm25_forecasts as forecasts_file
from experiments import beijing_pm25_results as results
from experiments import beijing_pm25_scores as scores
from tests.tasks.test_forecasting import INPUT_LENGTH, numpy_metrics, small_config
from experiments import output_pages, record_store
from experiments.beijing_pm25 import get_config
from transformer import load
from transformer.errors import UserError
from transformer.train import run

LONG = 2 * INPUT_LENGTH  # a second window for the GRU: the common test windows are this one's


def _train(root, name, hours, architecture, suffix="", **overrides):
  config = small_config(num_seeds=2, num_train_steps=6, eval_every=3, checkpoint_every=3, **overrides)
  config.model.architecture = architecture
  config.model.input_length = hours
  config.model.patch_length, config.model.patch_stride, config.model.moving_average = 8, 4, 5
  config.task.residual = architecture == "gru"
  run(config, str(root / f"{name}-{hours}h{suffix}"), "train")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
  root = tmp_path_factory.mktemp("runs")
  _train(root, "gru", INPUT_LENGTH, "gru")
  _train(root, "gru", LONG, "gru", optimizer__learning_rate=3e-2)
  _train(root, "patchtst", INPUT_LENGTH, "patchtst")
  _train(root, "dlinear", INPUT_LENGTH, "dlinear")
  _train(root, "dlinear", INPUT_LENGTH, "dlinear", "-all_inputs", model__input_features="all")
  output = root / "out"
  with pytest.MonkeyPatch.context() as patch:  # no committed page to start from
    patch.setattr(results, "COMMITTED_DIR", str(root / "no_committed_page"))
    return root, output, results.main([f"--workdir_root={root}", f"--output_dir={output}"])


def _best_eval(workdir):
  """The training log's record of the best ``eval/mae`` (``eval/mae/seed_i`` each seed's)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return min((record for record in map(json.loads, f) if "eval/mae" in record), key=lambda r: r["eval/mae"])


def _best_validation_mae(workdir):
  return _best_eval(workdir)["eval/mae"]


def _kept_gru(root):
  by_window = {hours: _best_validation_mae(root / f"gru-{hours}h") for hours in (INPUT_LENGTH, LONG)}
  return min(by_window, key=by_window.get), by_window


def _common(metrics, origins):
  rows = np.isin(metrics["origins"], origins)
  errors = np.abs(metrics["forecasts"][rows] - np.nan_to_num(metrics["actual"][rows]))
  errors = np.where(metrics["mask"][rows], errors, 0)
  return errors.sum(0) / metrics["mask"][rows].sum(0)


def test_beyond_the_interval_is_said_only_where_every_resampling_seed_says_so():
  row = {"better": "gru", "better_by_seed": ["gru"] * 5}
  assert results.beyond_cell(row) == "**gru better**"
  assert results.beyond_cell({"better": None, "better_by_seed": [None] * 5}) == "no"
  split = {"better": None, "better_by_seed": ["gru", "gru", None, "gru", None]}
  assert results.beyond_cell(split) == "gru better at 3 of 5 resampling seeds"


@pytest.mark.slow
def test_each_model_keeps_its_best_validation_window_and_is_scored_on_the_common_windows(page):
  root, output, text = page
  kept, _ = _kept_gru(root)
  recomputed = scores.recomputed_validation_maes(str(output / forecasts_file.VALIDATION_FILE))
  assert f"**{recomputed[f'gru-{kept}h']:.2f}**" in text.split("## Input window", 1)[1]
  common_origins = load(str(root / f"gru-{LONG}h")).task.windows("test").origins
  per_seed = []
  for replica in range(2):
    model = load(str(root / f"gru-{kept}h"), replica=replica)
    per_seed.append(_common(numpy_metrics(model.task, model.params, "test"), common_origins))
  mae_1h = np.array([m[0] for m in per_seed])
  assert f"| gru | {kept} | {mae_1h.mean():.1f} ± {mae_1h.std(ddof=1):.1f} |" in text
  assert f"of the {len(common_origins):,} test windows" in text

  # Persistence: the last measured pm2.5 at or before each common origin, by a plain loop.
  series = load(str(root / f"gru-{LONG}h")).task.series
  start = series.split_bounds["test"][0]
  errors = []
  for origin in common_origins:
    last = next(series.pm25[h] for h in range(origin, start - 1, -1) if not np.isnan(series.pm25[h]))
    if series.target_mask[origin + 1]:
      errors.append(abs(last - series.pm25[origin + 1]))
  assert f"| persistence | - | {np.mean(errors):.1f} |" in text


@pytest.mark.slow
def test_the_paired_comparison_and_verdict_name_the_families_best_and_the_seed_mean_difference(page):
  root, output, text = page
  kept, _ = _kept_gru(root)
  assert "Best by validation MAE: patchtst of the Transformer family" in text and "gru of the recurrent" in text
  assert "**On 2014, the best Transformer-family model (patchtst)" in text
  saved = np.load(output / results.FORECASTS_FILE)
  measured, actual = saved["actual"] >= 0, saved["actual"] / 10
  mae = {name: (np.abs(saved[name] / 10 - actual) * measured).sum(1) / measured.sum(0) for name in
         ("patchtst", "gru", "dlinear", "persistence")}
  assert mae["patchtst"].shape == (2, 7) and mae["persistence"].shape == (1, 7)
  comparison = text.split("## Verdict", 1)[1].split("## MAE", 1)[0]
  # Row 1 h: both MAEs and the difference, recomputed from the committed forecasts (tenths: within 0.05).
  row = next(line for line in comparison.splitlines() if line.startswith("| 1 h |"))
  cells = [cell.strip() for cell in row.split("|")[1:-1]]
  assert abs(float(cells[1]) - mae["patchtst"][:, 0].mean()) <= 0.051
  assert abs(float(cells[2]) - mae["gru"][:, 0].mean()) <= 0.051
  assert abs(float(cells[3]) - (mae["patchtst"][:, 0].mean() - mae["gru"][:, 0].mean())) <= 0.11
  assert "DLinear, the linear reference, against patchtst" in comparison
  for name in ("RESULTS.md", "error_by_horizon.png", "forecasts_6h_48h.png", results.FORECASTS_FILE):
    assert os.path.getsize(output / name) > 0
  assert "transformer-72h: `TRANSFORMER_DATA_DIR=../shared/data python launch.py " \
         "--config=experiments/beijing_pm25.py:transformer --workdir=WORKDIR`" in text


@pytest.mark.slow
def test_the_validation_errors_give_back_each_runs_logged_validation_mae_on_its_own_windows(page):
  root, output, text = page
  data = forecasts_file.load_validation_errors(str(output / forecasts_file.VALIDATION_FILE))
  recomputed = scores.recomputed_validation_maes(str(output / forecasts_file.VALIDATION_FILE))
  rows = [f"gru-{INPUT_LENGTH}h", f"gru-{LONG}h", f"patchtst-{INPUT_LENGTH}h", f"dlinear-{INPUT_LENGTH}h",
          f"dlinear-{INPUT_LENGTH}h-all_inputs"]
  assert sorted(data["errors"]) == sorted(rows) and len(data["origin_time"]) == len(
      load(str(root / f"gru-{INPUT_LENGTH}h")).task.windows("validation"))  # the union: the shortest input's
  for row in rows:
    windows = load(str(root / row)).task.windows("validation")
    own = np.isfinite(data["errors"][row]).all(axis=0)  # [windows]: the row's own, the last ones
    assert own.sum() == len(windows) and own[-len(windows):].all(), row
    best = _best_eval(root / row)
    # The unrounded forecasts of every seed: the logged float32 metric, each seed's and their mean.
    seeds, split, _ = forecasts_file.predict_seeds(str(root / row), "validation")
    errors = np.abs(seeds - np.nan_to_num(split["actual"]))  # [seeds, windows, H]
    assert np.allclose(errors[:, split["mask"]].mean(1), [best[f"eval/mae/seed_{i}"] for i in range(2)],
                       rtol=1e-5), row
    # The file: per seed and window the errors of the measured horizons summed, in tenths.
    np.testing.assert_array_equal(data["measured"][own], split["mask"].sum(1))
    np.testing.assert_allclose(data["errors"][row][:, own], (errors * split["mask"]).sum(2), atol=0.05 + 1e-6)
    assert recomputed[row] == pytest.approx(best["eval/mae"], abs=1e-3), row
  window_row = next(line for line in text.split("## Input window", 1)[1].splitlines() if line.startswith("| gru |"))
  assert f"{recomputed[f'gru-{LONG}h']:.2f}" in window_row and f"{recomputed[f'gru-{INPUT_LENGTH}h']:.2f}" in window_row
  assert "where the file lacks a run" not in text  # every row's validation errors are in it


@pytest.mark.slow
def test_each_row_keeps_its_training_log_whose_values_are_the_records(page):
  root, output, _ = page
  store = record_store.RecordStore(str(output))
  for row in store:
    with open(root / row / "metrics.jsonl") as source, open(output / "logs" / f"{row}.jsonl") as kept:
      assert source.read() == kept.read(), row
    from_log = scores.log_values(output_pages.read_log(str(output), row))
    assert from_log.pop("steps") == store[row]["steps"] == 6
    assert repr(from_log) == repr({key: store[row]["values"][key] for key in from_log}), row  # nan: a short run
    assert from_log["validation_mae"] == _best_validation_mae(root / row)


@pytest.mark.slow
def test_a_row_recorded_again_replaces_its_validation_errors_and_the_others_keep_theirs(page, tmp_path):
  root, output, _ = page
  long_row, short_row = f"gru-{LONG}h", f"dlinear-{INPUT_LENGTH}h"
  workdirs = {row: str(root / row) for row in (long_row, short_row)}
  earlier, path = str(tmp_path / "earlier.npz"), str(tmp_path / "validation.npz")
  forecasts_file.write_validation_errors({long_row: workdirs[long_row]}, earlier, str(tmp_path / "none.npz"))
  saved = dict(np.load(earlier))
  saved[long_row] = saved[long_row] + 7  # an earlier run of the row: 0.7 µg/m³ more error per window
  np.savez(earlier, **saved)
  page_file = forecasts_file.load_validation_errors(str(output / forecasts_file.VALIDATION_FILE))

  forecasts_file.write_validation_errors(workdirs, path, earlier)  # both rows recorded
  recorded = forecasts_file.load_validation_errors(path)
  assert len(recorded["origin_time"]) > len(saved["origin_time"])  # the shorter input's windows start earlier
  for row in workdirs:
    np.testing.assert_array_equal(recorded["errors"][row], page_file["errors"][row])

  forecasts_file.write_validation_errors({short_row: workdirs[short_row]}, path, earlier)  # its workdir gone
  kept = forecasts_file.load_validation_errors(path)
  np.testing.assert_allclose(kept["errors"][long_row][:, -len(saved["origin_time"]):], saved[long_row] / 10)
  assert np.isnan(kept["errors"][long_row][:, :-len(saved["origin_time"])]).all()
  np.testing.assert_array_equal(kept["measured"], recorded["measured"])


@pytest.mark.slow
def test_a_root_holding_only_some_kept_runs_is_refused_before_a_test_forecasts_file_drops_the_others(
    page, tmp_path, monkeypatch):
  root, output, _ = page
  kept, _ = _kept_gru(root)
  partial = tmp_path / "partial"
  partial.mkdir()
  (partial / f"gru-{kept}h").symlink_to(root / f"gru-{kept}h")  # the other models' kept runs are elsewhere
  before = {name: (output / name).read_bytes() for name in os.listdir(output) if name.endswith(".npz")}
  monkeypatch.setattr(results, "COMMITTED_DIR", str(root / "no_committed_page"))
  with pytest.raises(SystemExit) as refused:
    results.main([f"--workdir_root={partial}", f"--output_dir={output}"])
  message = str(refused.value)
  assert "forecasts_2014.npz holds the test forecasts of" in message and f"dlinear-{INPUT_LENGTH}h" in message
  assert f"have no workdir under {partial}" in message and f"gru-{kept}h," not in message.split("but")[1]
  assert {name: (output / name).read_bytes() for name in before} == before


@pytest.mark.slow
def test_a_run_on_other_inputs_is_a_row_of_its_own_compared_on_the_same_windows_and_never_kept(page):
  root, output, text = page
  row = f"dlinear-{INPUT_LENGTH}h-all_inputs"
  runs_table = text.split("## Runs", 1)[1]
  assert "--config.model.input_features=all" in next(line for line in runs_table.splitlines() if row in line)
  assert "Best by validation MAE: patchtst" in text  # dlinear is never a candidate, nor its all-input run
  saved, equal = np.load(output / results.FORECASTS_FILE), np.load(output / results.EQUAL_INPUTS_FILE)
  assert sorted(equal.files) == [row, "origin_time"] and np.array_equal(equal["origin_time"], saved["origin_time"])
  measured, actual = saved["actual"] >= 0, saved["actual"] / 10
  mae = ((np.abs(equal[row] / 10 - actual) * measured).sum(1) / measured.sum(0)).mean(0)
  section = text.split("## Equal inputs", 1)[1].split("## Input window", 1)[0]
  assert f"| {row} | all 18 features | {mae[0]:.1f} ± " in section
  assert f"**{row} against dlinear-{INPUT_LENGTH}h**" in section


@pytest.mark.slow
def test_a_rerun_recorded_from_another_root_says_on_the_page_what_it_changed(page, tmp_path, monkeypatch):
  root, output, _ = page
  monkeypatch.setattr(results, "COMMITTED_DIR", str(root / "no_committed_page"))
  page_copy, rerun_root = tmp_path / "page", tmp_path / "rerun"
  shutil.copytree(output, page_copy)
  records = json.loads((page_copy / "records.json").read_text())
  rerun_row = f"dlinear-{INPUT_LENGTH}h"
  records[rerun_row]["values"]["validation_mae"] = 99.0  # as if its earlier run had scored worse
  (page_copy / "records.json").write_text(json.dumps(records))
  rerun_root.mkdir()
  for row in records:  # the same runs under another root: to the page, each row's run is a rerun
    (rerun_root / row).symlink_to(root / row)
  text = results.main([f"--workdir_root={rerun_root}", f"--output_dir={page_copy}"])
  lines = text.split("## Reruns", 1)[1].split("\n## ", 1)[0]
  now = f"{_best_validation_mae(root / rerun_row):.2f}"
  assert f"- `{rerun_row}`: rerun on " in lines and f"validation MAE (training log) was 99.00, now {now}" in lines
  assert f"- `gru-{LONG}h`: rerun on " in lines  # unchanged cells are named the same
  assert "the same validation MAE (training log), best step" in lines.split(f"`gru-{LONG}h`")[1].split("\n")[0]


@pytest.mark.slow
def test_the_page_is_rewritten_from_its_records_and_forecasts_alone(page, tmp_path, monkeypatch):
  root, output, text = page
  monkeypatch.setattr(results, "COMMITTED_DIR", str(root / "no_committed_page"))
  copy = tmp_path / "copy"
  shutil.copytree(output, copy)
  assert results.main(["--from_records", f"--output_dir={copy}", f"--workdir_root={tmp_path / 'none'}"]) == text


def test_the_committed_page_is_rewritten_from_its_records_and_forecasts_alone(tmp_path, monkeypatch):
  copy = tmp_path / "beijing_pm25"
  shutil.copytree(results.COMMITTED_DIR, copy)
  monkeypatch.setattr(results, "COMMITTED_DIR", str(copy))
  before = {name: (copy / name).read_bytes() for name in ("RESULTS.md", results.FORECASTS_FILE,
                                                          results.EQUAL_INPUTS_FILE, results.VALIDATION_FILE)}
  (copy / "RESULTS.md").unlink()  # so that only a page written again can match (the forecasts are its input)
  results.main(["--from_records", "--update_committed", f"--workdir_root={tmp_path / 'none'}"])
  assert {name: (copy / name).read_bytes() for name in before} == before


@pytest.mark.slow
def test_a_committed_row_is_only_replaced_by_a_run_at_least_as_long(page, monkeypatch):
  root, output, _ = page
  monkeypatch.setattr(results, "COMMITTED_DIR", str(output))
  name = f"gru-{INPUT_LENGTH}h"
  records = json.loads((output / "records.json").read_text())
  longer = {**records, name: {**records[name], "steps": 600}}
  (output / "records.json").write_text(json.dumps(longer))
  page_before = (output / "RESULTS.md").read_bytes()
  try:
    with pytest.raises(SystemExit) as exited:
      results.main([f"--workdir_root={root}", "--update_committed"])
    assert f"row '{name}' records a run of 600 training steps, the new one trained 6" in str(exited.value)
    assert "--force" in str(exited.value)
    assert (output / "RESULTS.md").read_bytes() == page_before
    assert record_store.RecordStore(str(output))[name]["steps"] == 600
  finally:
    (output / "records.json").write_text(json.dumps(records))


def test_the_test_year_ranking_is_only_a_robustness_check_from_24_hours(monkeypatch):
  data = {"horizons": [1, 24, 96]}
  metrics = {"patchtst": {"mae": np.array([[9.0, 60.0, 70.0]])}, "transformer": {"mae": np.array([[30.0, 58.0, 69.0]])},
             "gru": {"mae": np.array([[10.0, 57.0, 66.0]])}}
  compared = []

  def paired_comparison(data, metrics, first, second):  # its numbers are not what this test is about
    compared.append((first, second))
    return [{"horizon": h, "first": 0.0, "second": 0.0, "difference": d, "low": d - 1, "high": d + 1,
             "better": "gru" if d > 1 else None, "better_by_seed": ["gru" if d > 1 else None], "seed_spread": 0.0,
             "welch": "-", "ensemble": [d, d - 1, d + 1]}
            for h, d in zip(data["horizons"], (20.0, 1.0, 3.0))]
  monkeypatch.setattr(results, "paired_comparison", paired_comparison)
  section = results.comparison_section(data, metrics, "patchtst", "gru")
  # Validation chose patchtst; the test year's mean MAE from 24 h (1 h left out) ranks transformer first.
  assert compared == [("patchtst", "gru"), ("transformer", "gru")]
  line = section.split("Chosen on the test year instead", 1)[1]
  assert "transformer against gru: 24 h +1.0 (+0.0 to +2.0); 96 h +3.0 (+2.0 to +4.0)" in line and "1 h" not in line
  assert "transformer better beyond the interval at none of these horizons" in line
  assert results.best_of(("rnn", "lstm"), {"gru": 1.0}) is None


def test_the_published_ranking_is_stated_per_horizon():
  metrics = {name: {"mae": np.array([values])} for name, values in
             {"rnn": [11.0, 60.0], "gru": [12.0, 57.0], "transformer": [10.0, 61.0]}.items()}
  text = results.published_ranking(metrics, [1, 24])
  assert "their ranking holds at 1 h" in text
  assert "1 h transformer 1 of 3; 24 h transformer 3 of 3 (gru best)" in text


def test_a_run_name_says_its_inputs_and_such_runs_are_never_kept():
  assert scores.inputs_name("gru", "auto") == scores.inputs_name("gru", "all") == ""
  assert scores.inputs_name("gru", "target") == "pm25_only"
  assert scores.inputs_name("patchtst", "auto") == scores.inputs_name("patchtst", "target") == ""
  assert scores.inputs_name("dlinear", "all") == "all_inputs"
  config = get_config("gru")
  config.model.input_features = "target"
  assert scores.run_values("gru-168h-pm25_only", "W", config) == {"model": "gru", "hours": 168, "inputs": "pm25_only"}
  with pytest.raises(UserError, match="rename the workdir gru-168h-pm25_only"):
    scores.run_values("gru-168h", "W", config)
  store = record_store.RecordStore(results.COMMITTED_DIR)
  # The equal-input rows are in the store, but a model's kept window is chosen among its published-input runs.
  assert store["gru-168h-pm25_only"]["values"]["validation_mae"] > store["gru-168h"]["values"]["validation_mae"]
  assert all(name in scores.validation_maes(store)["gru"] for name in (72, 168))
  assert "-pm25_only" not in str(scores.validation_maes(store)) and scores.kept_windows(store)["patchtst"] == 336


def test_the_equal_input_section_is_the_committed_forecasts_mae():
  text = (record_store.read_text(results.COMMITTED_DIR))
  section = text.split("## Equal inputs", 1)[1].split("## Input window", 1)[0]
  main, equal = (np.load(os.path.join(results.COMMITTED_DIR, name))
                 for name in (results.FORECASTS_FILE, results.EQUAL_INPUTS_FILE))
  assert np.array_equal(main["origin_time"], equal["origin_time"])
  measured, actual = main["actual"] >= 0, main["actual"] / 10
  mae = {}
  for row, forecasts in (("gru-168h", main["gru"]), ("gru-168h-pm25_only", equal["gru-168h-pm25_only"]),
                         ("dlinear-336h-all_inputs", equal["dlinear-336h-all_inputs"])):
    mae[row] = ((np.abs(forecasts / 10 - actual) * measured).sum(1) / measured.sum(0)).mean(0)  # [horizons]
    line = next(line for line in section.splitlines() if line.startswith(f"| {row} |"))
    printed = [float(cell.split(" ± ")[0]) for cell in line.split("|")[3:10]]
    assert np.allclose(printed, mae[row], atol=0.051), row
  # The paired comparisons: weather against none per model, then the families on the same inputs and window.
  titles = [line.split("**")[1] for line in section.splitlines() if line.startswith("**")]
  assert titles == ["gru-168h against gru-168h-pm25_only", "patchtst-168h-all_inputs against patchtst-168h",
                    "patchtst-336h-all_inputs against patchtst-336h", "dlinear-336h-all_inputs against dlinear-336h",
                    "patchtst-168h against gru-168h-pm25_only", "patchtst-168h-all_inputs against gru-168h"]
  weather = section.split("**gru-168h against gru-168h-pm25_only**", 1)[1]
  row = next(line for line in weather.splitlines() if line.startswith("| 12 h |"))
  difference = mae["gru-168h"][2] - mae["gru-168h-pm25_only"][2]
  assert abs(float(row.split("|")[4]) - difference) <= 0.11
