"""The suite's dispatch (parts chosen, one failing or timing out does not stop the others) and where benchmark
runs write (never the committed benchmarks/RESULTS.md unless asked)."""
import subprocess
import sys

import pytest

from benchmarks import common, suite
from experiments import record_store


def _committed_page():
  with open(common.RESULTS_PATH) as f:
    return f.read()


# ------------------------------------------------------------------------------------------------ dispatch

def test_parts_are_chosen_by_name_in_the_suites_order():
  assert [part.name for part in suite.chosen_parts("attention,train_step", "")] == ["train_step", "attention"]
  assert "decoding" not in [part.name for part in suite.chosen_parts(",".join(suite.DEFAULT_PARTS), "decoding")]
  with pytest.raises(ValueError, match="unknown part.*attentoin.*choose from time_to_bleu, train_step, attention"):
    suite.chosen_parts("attentoin", "")


def test_the_parts_run_by_name_only_are_not_in_the_default_and_one_script_runs_once_a_call():
  """``train_step_big`` and ``remat_fit`` each take about one call of device time; two parts of one script would
  write its one section of the page, so they are refused together."""
  assert {"train_step_big", "remat_fit"} <= set(suite.PART_NAMES) - set(suite.DEFAULT_PARTS)
  assert [part.script for part in suite.chosen_parts("remat_fit,train_step_big", "")] == ["train_step", "remat"]
  with pytest.raises(ValueError, match="parts train_step and train_step_big both run train_step.py"):
    suite.chosen_parts("train_step,train_step_big", "")


def test_a_failing_and_a_timed_out_part_are_reported_and_the_next_parts_run(tmp_path):
  python = sys.executable

  def command(code):
    return lambda limit: [python, "-c", code]

  planned = [
      ("raises", 0.25, command("raise RuntimeError('boom')")),
      ("exits", 0.25, command("import sys; print('partial'); sys.exit(3)")),
      ("hangs", 0.25, command("import time; time.sleep(60)")),
      ("fine", 0.25, command("print('done')")),
  ]
  # 8 s: each part's limit is 2 s plus what the ones before left; the sleeper is killed at its limit.
  results = suite.run_parts(planned, budget_s=8.0, log_dir=str(tmp_path))
  status = {result.name: result.status for result in results}
  assert status["raises"] == "failed (exit 1)" and status["exits"] == "failed (exit 3)"
  assert status["hangs"].startswith("timed out") and status["fine"] == "ok"
  hangs = next(result for result in results if result.name == "hangs")
  assert hangs.limit_s > 2.0  # the quick failures before it left it their unused time
  assert hangs.seconds < hangs.limit_s + suite.KILL_GRACE_S + 5
  assert "RuntimeError: boom" in (tmp_path / "raises.log").read_text()
  assert "partial" in (tmp_path / "exits.log").read_text()
  assert all(result.host for result in results)  # the host and its load, per part


def test_a_part_with_no_time_left_is_skipped(tmp_path):
  planned = [("slow", 0.9, lambda limit: [sys.executable, "-c", "import time; time.sleep(60)"]),
             ("late", 0.1, lambda limit: [sys.executable, "-c", "pass"])]
  results = suite.run_parts(planned, budget_s=4.0, log_dir=str(tmp_path))  # "slow" leaves under a second
  assert results[0].status.startswith("timed out") and results[1].status.startswith("skipped")


def test_part_command_gives_each_script_its_budget_and_where_to_write():
  args = common.parse_args("suite", ["--output_dir", "/tmp/x"], suite.add_arguments)
  train_step = next(part for part in suite.PARTS if part.name == "train_step")
  command = suite.part_command(train_step, args, "/tmp/x", 100.0)
  assert command[1:3] == ["-m", "benchmarks.train_step"] and "--torch_compile" in command
  assert command[command.index("--time_budget_s") + 1] == f"{suite.SOFT_SHARE * 100:.0f}"
  assert command[-2:] == ["--output_dir", "/tmp/x"] and "--update_committed" not in command
  committed = common.parse_args("suite", ["--update_committed"], suite.add_arguments)
  assert suite.part_command(train_step, committed, None, 100.0)[-1] == "--update_committed"


@pytest.mark.slow
def test_suite_smoke_writes_its_own_folder_and_leaves_the_committed_page(tmp_path):
  before = _committed_page()
  """What CI runs: every part at --smoke size, each in its own process (time_to_bleu only with --data_dir)."""
  result = subprocess.run([sys.executable, "-m", "benchmarks.suite", "--smoke", f"--output_dir={tmp_path}"],
                          cwd=record_store.REPO, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  page = (tmp_path / "RESULTS.md").read_text()
  for section in ("suite", "attention", "train_step", "step_profile", "decoding"):
    assert f"<!-- benchmarks.{section} -->" in page
    assert f"| {section} | ok |" in page or section == "suite"
  assert "| time_to_bleu | skipped (--smoke without --data_dir) |" in page
  assert (tmp_path / "attention.log").exists()
  assert _committed_page() == before


@pytest.mark.slow
def test_time_to_bleu_smoke_scores_test_2016_from_an_empty_workdir(tmp_path):
  from tests.data.data_fixtures import write_multi30k
  sizes = {"train": 200, "val": 8, "test_2016_flickr": 4, "test_2017_flickr": 2, "test_2017_mscoco": 2,
           "test_2018_flickr": 2}
  raw = write_multi30k(tmp_path / "raw", sizes=sizes)
  from benchmarks import time_to_bleu
  report = time_to_bleu.main(["--smoke", f"--data_dir={raw}", f"--output_dir={tmp_path / 'out'}"])
  assert report.rows[0][3] == "4 of 4"
  assert 0.0 <= report.ratios["test_2016_flickr BLEU"] <= 100.0
  assert "<!-- benchmarks.time_to_bleu -->" in (tmp_path / "out" / "RESULTS.md").read_text()


def test_time_to_bleu_without_data_is_one_line(tmp_path, monkeypatch):
  from benchmarks import time_to_bleu
  from transformer.errors import MissingDataError
  monkeypatch.delenv("TRANSFORMER_DATA_DIR", raising=False)
  monkeypatch.setattr(time_to_bleu, "GIT_IGNORED_DATA", str(tmp_path / "absent"))
  with pytest.raises(MissingDataError, match="--data_dir=FOLDER"):
    time_to_bleu.find_data_dir("")
  (tmp_path / "data" / "multi30k").mkdir(parents=True)
  assert time_to_bleu.find_data_dir(str(tmp_path / "data")) == str(tmp_path / "data" / "multi30k")


# ---------------------------------------------------------------------------------------- where it writes

def test_a_full_run_writes_a_new_folder_not_the_committed_page(tmp_path, monkeypatch):
  monkeypatch.setattr(record_store, "REPO", str(tmp_path))  # the library's, which places runs/
  args = common.parse_args("x", [])
  assert args.results_path.startswith(str(tmp_path / "runs" / "benchmarks-"))
  assert args.results_path != common.RESULTS_PATH
  assert common.parse_args("x", ["--smoke"]).results_path is None  # a bare smoke run writes nothing
  assert common.parse_args("x", ["--update_committed"]).results_path == common.RESULTS_PATH
  assert common.parse_args("x", ["--output_dir", str(tmp_path / "o")]).results_path == str(tmp_path / "o" /
                                                                                          "RESULTS.md")


@pytest.mark.parametrize("argv, message", [
    (["--update_committed", "--output_dir", "/tmp/o"], "not both"),
    (["--output_dir", common.BENCHMARKS_DIR], "is the committed page"),
    (["--smoke", "--update_committed"], "never writes the committed"),
])
def test_writing_the_committed_page_by_accident_is_refused(argv, message, capsys):
  with pytest.raises(SystemExit):
    common.parse_args("x", argv)
  assert message in capsys.readouterr().err


def test_a_run_writes_its_section_into_the_output_dir_only(tmp_path):
  before = _committed_page()
  args = common.parse_args("x", ["--output_dir", str(tmp_path)])
  report = common.Report("decoding", "decoding title", ["name", "value"], rows=[["x", 1.5]])
  common.finish(report, args, ["--output_dir", str(tmp_path), "--repeats", "3"], "machine")
  page = (tmp_path / "RESULTS.md").read_text()
  assert "| x | 1.50 |" in page and "`python -m benchmarks.decoding --repeats 3`" in page  # no --output_dir
  assert _committed_page() == before
