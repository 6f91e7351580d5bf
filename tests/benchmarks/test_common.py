"""A benchmark run's section of RESULTS.md (its own replaced, the others kept, in question order; a section per
backend and per core count), the line fit, and a flag check."""
import os
import re

import jax
import numpy as np
import pytest

from benchmarks import common
from benchmarks.sequence_length import growth_share
from experiments.record_store import host_description, usable_cores


def test_growth_share_is_the_time_above_the_shortest_length():
  shares = growth_share([256, 64, 1024], [2.0, 1.0, 4.0])
  assert shares == [pytest.approx(0.5), 0.0, pytest.approx(0.75)]
  assert growth_share([], []) == []  # no dense step fitted in memory


def test_update_results_replaces_own_section_and_keeps_others_in_question_order(tmp_path):
  path = str(tmp_path / "RESULTS.md")

  def report(script, value):
    return common.Report(script, f"{script} title", ["name", "value"], rows=[["x", value]])

  common.update_results(report("train_step", 1.5), ["--a"], "machine", path)
  common.update_results(report("attention", 2.5), [], "machine", path)
  common.update_results(report("train_step", 3.5), ["--b"], "machine", path)
  text = open(path).read()
  assert text.startswith(common.RESULTS_HEADER)
  assert text.index("attention title") < text.index("train_step title")  # SCRIPTS order
  assert "| x | 3.50 |" in text and "| x | 1.50 |" not in text and "| x | 2.50 |" in text
  assert "`python -m benchmarks.train_step --b`" in text and text.count("<!-- benchmarks.train_step -->") == 1


def test_a_mode_of_a_script_writes_its_own_section_after_the_scripts(tmp_path):
  """remat.py --fit_search (``Report.section``) keeps remat.py's timings: a section each, the mode's after, both
  with the script's command."""
  path = str(tmp_path / "RESULTS.md")
  mode = common.Report("remat", "fit title", ["name", "value"], rows=[["x", 1.5]], section="remat_fit")
  common.update_results(mode, ["--fit_search"], "machine", path)
  for script in ("remat", "activation_layout"):
    common.update_results(common.Report(script, f"{script} title", ["name"], rows=[["x"]]), [], "machine", path)
  text = open(path).read()
  assert list(common.read_sections(path)) == ["remat", "remat_fit", "activation_layout"]
  assert "`python -m benchmarks.remat --fit_search`" in text


def test_a_run_narrowed_to_fewer_cores_writes_its_own_section(tmp_path, monkeypatch):
  path = str(tmp_path / "RESULTS.md")
  report = lambda value: common.Report("train_step", "train_step title", ["name", "value"], rows=[["x", value]])
  monkeypatch.setattr(os, "cpu_count", lambda: 2)
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
  common.update_results(report(1.5), [], "all cores", path)
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)  # as under `taskset -c 0`
  assert usable_cores() == 1 and "1 of its 2 cores (taskset)" in host_description(load_average=True)
  common.update_results(report(2.5), [], "one core", path)
  text = open(path).read()
  assert "| x | 1.50 |" in text and "| x | 2.50 |" in text
  assert "<!-- benchmarks.train_step.1core -->" in text and "## train_step title on 1 of 2 CPU cores" in text


def test_accelerator_run_writes_its_own_section_beside_the_cpu_one(tmp_path, monkeypatch):
  path = str(tmp_path / "RESULTS.md")

  def report(script, value):
    return common.Report(script, f"{script} title", ["name", "value"], rows=[["x", value]])

  common.update_results(report("train_step", 1.5), [], "cpu machine", path)
  common.update_results(report("decoding", 4.5), [], "cpu machine", path)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  common.update_results(report("train_step", 2.5), ["--dtype=bfloat16"], "gpu machine", path)
  common.update_results(report("attention", 3.5), [], "gpu machine", path)
  common.update_results(report("train_step", 5.5), ["--dtype=bfloat16"], "gpu machine", path)
  text = open(path).read()
  assert "| x | 1.50 |" in text and "| x | 2.50 |" not in text and "| x | 5.50 |" in text  # GPU replaced GPU only
  assert text.count("<!-- benchmarks.train_step.gpu -->") == 1 and "## train_step title on GPU" in text
  # Question order, each script's accelerator section right after its CPU one.
  starts = [text.index(f"<!-- benchmarks.{name} -->") for name in ("attention.gpu", "train_step", "train_step.gpu",
                                                                    "decoding")]
  assert starts == sorted(starts)


def test_train_step_rejects_a_batch_size_below_one(capsys):
  from benchmarks import train_step

  with pytest.raises(SystemExit):
    train_step.main(["--smoke", "--batch", "0"])
  assert "argument --batch: must be an integer >= 1, got 0" in capsys.readouterr().err


def test_rewriting_the_committed_page_from_its_sections_changes_no_byte(tmp_path):
  """What a rerun relies on: the page writer (header, section order, separators) reproduces the committed page,
  so a run that replaces its own section leaves every other section of benchmarks/RESULTS.md byte-identical."""
  copy = str(tmp_path / "RESULTS.md")
  common.write_sections(common.read_sections(common.RESULTS_PATH), copy)
  assert open(copy).read() == open(common.RESULTS_PATH).read()


# A section's head as the committed page has it: name, title, command, machine, versions, date, then its table.
SECTION_HEAD = re.compile(r"<!-- benchmarks\.(?P<name>[\w.]+) -->\n## [^\n]+\n\n- Command: `python -m "
                          r"benchmarks\.(?P<script>\w+)[^`\n]*`\n- Machine: [^\n]+\n- Versions: JAX [^\n]+\n"
                          r"- Date: \d{4}-\d\d-\d\d\n\n\| ")


def test_a_section_written_now_has_the_committed_sections_layout():
  committed = common.read_sections(common.RESULTS_PATH)
  assert committed and all(SECTION_HEAD.match(text) for text in committed.values())
  report = common.Report("decoding", "decoding title", ["name", "value"], rows=[["x", 1.5]], notes=["a note"])
  text = common.section(report, ["--repeats", "3", "--output_dir", "/tmp/o"], host_description(load_average=True))
  match = SECTION_HEAD.match(text)
  assert match and match["name"] == common.section_name("decoding") and match["script"] == "decoding"
  assert "`python -m benchmarks.decoding --repeats 3`\n" in text and text.endswith(
      "| x | 1.50 |\n\n- a note\n<!-- /benchmarks.decoding -->\n")


def test_the_command_leaves_out_where_the_page_goes_and_cells_read_alike():
  argv = ["--update_committed", "--a", "--output_dir=/o", "--b", "--output_dir", "/p", "--c=1"]
  assert common.command("decoding", argv) == "python -m benchmarks.decoding --a --b --c=1"
  cells = [None, "text", 1234, np.int64(5), 1234.5678, float("nan"), np.float32("inf")]
  assert [common.fmt(cell) for cell in cells] == ["-", "text", "1,234", "5", "1,234.57", "-", "-"]


def test_the_committed_folder_as_output_dir_is_refused_without_a_rule_of_longer_runs(capsys):
  """Every run replaces its section: the refusal points to --update_committed and names no rule of rows."""
  with pytest.raises(SystemExit):
    common.parse_args("x", ["--output_dir", common.BENCHMARKS_DIR])
  error = capsys.readouterr().err
  assert "is the committed page; give --update_committed to write there, or another folder" in error
  assert "at least as long" not in error
