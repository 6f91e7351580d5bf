"""experiments/report.py, the results library: Welch's t-test of two runs' seeds (the Student t p-value from the
regularized incomplete beta function) checked against closed forms and published values; the record
store and its replace-only-longer rule; the one main of a results script (make_page) and its flags, its refusals
(no rows to write from, a damaged store, a folder it cannot write) and its atomic writes; the block bootstrap of
a paired MAE difference."""
import argparse
import builtins
import errno
import json
import math
import os

import numpy as np
import pytest

from experiments import report
from transformer.data import files


@pytest.mark.parametrize("t, df, expected", [
    (2.0, 4, 0.1161165235),  # t tables: P(|T| >= 2) with 4 degrees of freedom
    (3.0, 2, 1 - 3 / math.sqrt(3 ** 2 + 2)),  # df 2 closed form: 1 - |t| / sqrt(t^2 + 2) = 0.0955
    (-3.0, 2, 1 - 3 / math.sqrt(3 ** 2 + 2)),  # two-sided: the sign does not matter
    (1.7, 1, 1 - 2 / math.pi * math.atan(1.7)),  # df 1 is the Cauchy distribution
    (12.0, 1, 1 - 2 / math.pi * math.atan(12.0)),  # far in the tail
    (1.959963985, 1e7, 0.05),  # many degrees of freedom: the normal's 97.5% quantile
    (0.0, 3.3, 1.0),
])
def test_the_two_sided_p_value_matches_closed_forms_and_tables(t, df, expected):
  assert report.student_t_two_sided_p(t, df) == pytest.approx(expected, rel=1e-6)


def test_welch_t_test_by_hand_and_its_degenerate_samples():
  # mean 2 (variance 1) against mean 5.5 (variance 3.25): standard error sqrt(1/3 + 3.25/3) = 1.190238.
  t, df, p = report.welch_t_test([1.0, 2.0, 3.0], [4.0, 5.0, 7.5])
  assert t == pytest.approx(-3.5 / math.sqrt(4.25 / 3))
  assert df == pytest.approx((4.25 / 3) ** 2 / ((1 / 3) ** 2 / 2 + (3.25 / 3) ** 2 / 2))  # 3.1243
  assert p == pytest.approx(0.0575221433, rel=1e-7)  # scipy.stats.ttest_ind(..., equal_var=False)
  assert report.welch_t_test([1.0, 2.0, 3.0], [4.0, 5.0, 7.5])[2] == report.welch_t_test([4.0, 5.0, 7.5],
                                                                                        [1.0, 2.0, 3.0])[2]
  assert report.welch_t_test([1.0, 1.0], [2.0, 2.0])[::2] == (-math.inf, 0.0)  # constant, different means
  t, df, p = report.welch_t_test([1.0, 1.0], [1.0, 1.0])
  assert math.isnan(t) and math.isnan(df) and p == 1.0
  with pytest.raises(ValueError, match="at least 2 values"):
    report.welch_t_test([1.0], [1.0, 2.0])
  with pytest.raises(ValueError, match="all finite"):
    report.welch_t_test([1.0, float("nan")], [1.0, 2.0])
  assert report.format_p_value(0.0912) == "p = 0.091" and report.format_p_value(0.0004) == "p < 0.001"


def test_the_output_flags_keep_their_names_and_benchmarks_have_no_force():
  parser = report.results_parser("doc", "a folder of the script's", default_root="/tmp/root", hardware=True)
  args = parser.parse_args(["--output_dir=o", "--update_committed", "--force", "--from_records"])
  assert (args.output_dir, args.update_committed, args.force, args.from_records) == ("o", True, True, True)
  assert (args.workdir_root, args.hardware) == ("/tmp/root", "")
  benchmarks = argparse.ArgumentParser()  # sections replaced by every run: no rows to force
  report.add_output_arguments(benchmarks, "runs/benchmarks-<time>/", force=False)
  assert "--force" not in benchmarks.format_help() and "a run of at least" not in benchmarks.format_help()
  boolean = argparse.ArgumentParser()
  report.add_boolean_argument(boolean, "train", True, "Train.")  # absl's --notrain, as the READMEs write it
  assert boolean.parse_args([]).train and not boolean.parse_args(["--notrain"]).train
  assert report.comma_list("a, b,") == ["a", "b"]


def test_a_record_is_replaced_only_by_a_run_at_least_as_long_unless_forced(tmp_path):
  store = report.RecordStore(str(tmp_path))
  store.add("a", steps=300, command="python launch.py", machine="CPU", values={"bleu": 1.5})
  store.add("a", steps=300, command="python launch.py --again", machine="CPU", values={"bleu": 2.0})  # as long
  with pytest.raises(report.UserError, match=r"row 'a' records a run of 300 training steps, the new one trained "
                     r"200.*--force"):
    store.add("a", steps=200, command="c", machine="m", values={})
  with pytest.raises(report.UserError, match="row 'a'"):  # before any work: the script checks all its rows
    store.check({"a": 100, "new": 5})
  assert store["a"]["values"] == {"bleu": 2.0}  # the refused record changed nothing
  store.add("a", steps=200, command="c", machine="m", values={"bleu": 0.5}, force=True)
  assert store["a"]["steps"] == 200
  report.RecordStore(str(tmp_path), force=True).check({"a": 1})  # a forced store refuses nothing


def test_records_round_trip_sorted_and_a_new_folder_starts_from_the_committed_ones(tmp_path):
  committed, mine = tmp_path / "committed", tmp_path / "mine"
  store = report.RecordStore(str(committed))
  store.add("b", steps=2, command="c2", machine="m", values={"x": [1, 2], "nan": float("nan")})
  store.add("a", steps=1, command="c1", machine="m", values={})
  store.save()
  text = (committed / "records.json").read_text()
  assert text.index('"a"') < text.index('"b"') and text.endswith("\n")  # sorted: small diffs in git
  again = report.RecordStore(str(committed))
  assert dict(again.items())["b"]["values"]["x"] == [1, 2] and math.isnan(again["b"]["values"]["nan"])
  assert list(again) == ["b", "a"]  # the order rows were added in (a table's), not the file's sorted keys
  again.rename("b", "b (committed)")
  again.add("c", steps=1, command="c3", machine="m", values={})
  assert list(again) == ["b (committed)", "a", "c"]
  assert list(report.RecordStore(str(mine), start_from=str(committed))) == ["b", "a"]
  assert len(report.RecordStore(str(mine))) == 0  # nothing saved there yet
  (committed / "records.json").write_text("{not json")
  with pytest.raises(report.UserError, match="records.json is not the JSON"):
    report.RecordStore(str(committed))


def test_a_row_of_a_file_without_places_is_replaced_and_machines_are_listed_once(tmp_path):
  (tmp_path / "records.json").write_text(json.dumps({  # written by hand or before rows kept their place
      "a": {"steps": 5, "command": "c", "machine": "CPU", "values": {"root": "/tmp/a"}},
      "b": {"steps": 5, "command": "c", "machine": "GPU", "values": {}}}))
  store = report.RecordStore(str(tmp_path))
  store.add("a", steps=5, command="c", machine="CPU", values={"root": "/tmp/b"})
  store.add("c", steps=1, command="c", machine="CPU", values={"root": "/tmp/b"})
  assert list(store) == ["a", "c", "b"]  # placed rows first, in their order; the rest as the file has them
  assert store.distinct(["a", "b", "c"]) == ["CPU", "GPU"]
  assert store.distinct(["a", "b", "c"], "root") == ["/tmp/b"]  # a value's field, rows without it left out


def test_a_plot_is_linked_only_where_it_was_drawn_and_pages_take_any_name(tmp_path):
  assert "not drawn here" in report.image(str(tmp_path), "curves.png", "curves")
  (tmp_path / "curves.png").write_bytes(b"png")
  assert report.image(str(tmp_path), "curves.png", "curves") == "![curves](curves.png)"
  report.write_page(str(tmp_path / "new"), "text", name="page.md")  # the folder is made
  assert report.read_page(str(tmp_path / "new"), name="page.md") == "text" and report.read_page(str(tmp_path)) == ""
  assert report.runs_not_kept(str(tmp_path)) == ""  # no hand-written note
  (tmp_path / report.NOT_KEPT_NOTE).write_text("- lr 1e-3: diverged\n")
  assert report.runs_not_kept(str(tmp_path)).startswith("\n## Runs not kept\n") and "- lr 1e-3: diverged\n" in (
      report.runs_not_kept(str(tmp_path)))
  committed = str(tmp_path)
  with pytest.raises(report.UserError, match="at least as long"):
    report.choose_results_folder(committed, False, False, committed, "d")
  with pytest.raises(report.UserError) as benchmarks:  # sections every run replaces: no rule of rows to name
    report.choose_results_folder(committed, False, False, committed, "d", keeps_rows=False)
  assert "at least as long" not in str(benchmarks.value)


def _page_script(tmp_path, argv, collected=None):
  """A results script of the one-main shape: a row per --row=NAME:STEPS, the page a table of the records;
  ``collected`` (returned) lists the rows collected, as far as the script got."""
  parser = report.results_parser("doc", "default")
  parser.add_argument("--row", action="append", default=[])
  args = parser.parse_args(argv)
  collected = [] if collected is None else collected

  def collect(store, folder):
    rows = dict(spec.split(":") for spec in args.row)
    store.check({name: int(steps) for name, steps in rows.items()})
    for name, steps in rows.items():
      collected.append(name)
      store.add(name, steps=int(steps), command=f"train {name}", machine="here", values={"score": int(steps) / 10})

  def render(store, folder):
    return report.markdown_table(["row", "steps", "score"],
                                 [[name, record["steps"], record["values"]["score"]] for name, record in store.items()])

  committed = str(tmp_path / "committed")
  return report.make_page(args, committed, str(tmp_path / "default"), collect, render), collected


def test_a_page_is_written_from_its_records_and_regenerated_without_runs(tmp_path, capsys):
  first, _ = _page_script(tmp_path, ["--update_committed", "--row=a:300"])
  assert "| a | 300 | 30.0 |" in first
  again, collected = _page_script(tmp_path, ["--update_committed", "--from_records", "--row=b:1"])
  assert again == first and collected == []  # --from_records: no run is read
  with pytest.raises(SystemExit, match="row 'a' records a run of 300"):
    _page_script(tmp_path, ["--update_committed", "--row=a:100"])
  assert (tmp_path / "committed" / "RESULTS.md").read_text() == first  # the refused run wrote nothing
  mine, _ = _page_script(tmp_path, ["--row=a:100"])  # a page of one's own: any run replaces, from committed rows
  assert "| a | 100 | 10.0 |" in mine and (tmp_path / "default" / "records.json").exists()
  assert "(the committed page" in capsys.readouterr().out


def file_bytes(folder) -> dict:
  """Every file under ``folder`` (relative path -> bytes); {} when it does not exist."""
  return {os.path.relpath(os.path.join(parent, name), folder): open(os.path.join(parent, name), "rb").read()
          for parent, _, names in os.walk(folder) for name in names}


def one_line_error(exited) -> str:
  message = str(exited.value)
  assert message.startswith("error: ") and "\n" not in message, message
  return message


@pytest.mark.parametrize("records", [None, "{}\n"])
def test_from_records_without_rows_refuses_and_writes_nothing(tmp_path, records):
  """``--from_records`` with no records.json (or a store of no rows) used to write a page of no rows over the
  committed one, exit 0; it names the file and writes nothing, into the committed folder or a folder of one's own."""
  _page_script(tmp_path, ["--update_committed", "--row=a:300"])
  committed = tmp_path / "committed"
  (committed / "records.json").unlink()
  if records is not None:
    (committed / "records.json").write_text(records)
  before = file_bytes(committed)
  with pytest.raises(SystemExit) as exited:
    _page_script(tmp_path, ["--update_committed", "--from_records"])
  message = one_line_error(exited)
  assert f"--from_records: {'there is no ' if records is None else ''}{committed / 'records.json'}" in message
  assert "nothing was written" in message and file_bytes(committed) == before
  mine = tmp_path / "mine"
  with pytest.raises(SystemExit) as exited:
    _page_script(tmp_path, [f"--output_dir={mine}", "--from_records"])
  if records is None:  # a new folder starts from the committed records: both named
    assert f"there is no {mine / 'records.json'} nor {committed / 'records.json'}" in one_line_error(exited)
  assert not mine.exists()


@pytest.mark.parametrize("text, problem", [
    ("", "is empty (0 bytes), not a record store"),
    ("[]", "holds a list, not a record store"),
    ('{"a": null}', "row 'a' is null, not an object of steps, command, machine, values"),
    ('{"a": {"steps": 300, "command": "c", "machine": "m"}}', "row 'a' has no 'values'"),
    ('{"a": {"steps": "300", "command": "c", "machine": "m", "values": {}}}',
     "row 'a' has \"300\" as 'steps', not a whole number"),
])
def test_a_damaged_store_is_one_line_naming_the_file_and_the_row(tmp_path, text, problem):
  """An empty file (a write cut short by something other than this code), a list, a null row, a row without
  values: each used to be a traceback (or, for the empty file, a JSON parser's message)."""
  committed = tmp_path / "committed"
  committed.mkdir()
  (committed / "records.json").write_text(text)
  for arguments in (["--from_records"], ["--row=b:1"]):
    collected = []
    with pytest.raises(SystemExit) as exited:
      _page_script(tmp_path, ["--update_committed", *arguments], collected)
    message = one_line_error(exited)
    assert f"{committed / 'records.json'}: {problem}" in message or (
        f"{committed / 'records.json'} {problem}" in message), message
    assert "git checkout --" in message and "delete it" in message and collected == []
  assert (committed / "records.json").read_text() == text and sorted(os.listdir(committed)) == ["records.json"]


class Killed(BaseException):
  """A process killed mid-write (kill -9): nothing after the write runs, no exception handler sees it."""


def cut_writes(monkeypatch, make_error):
  """Every file the results library opens for writing stops after half of its first write and raises
  ``make_error()``: a kill -9, or a disk that fills, in the middle of writing a page or a store."""
  real_open = builtins.open

  class CutFile:
    def __init__(self, file):
      self.file = file

    def write(self, data):
      self.file.write(data[:len(data) // 2])
      self.file.flush()
      raise make_error()

    def __enter__(self):
      return self

    def __exit__(self, *exception):
      self.file.close()

    def __getattr__(self, name):
      return getattr(self.file, name)

  def cut_open(file, mode="r", *args, **kwargs):
    opened = real_open(file, mode, *args, **kwargs)
    return CutFile(opened) if "w" in mode else opened
  for module in (report, files):  # the module that writes, whichever it is, looks open up there first
    monkeypatch.setattr(module, "open", cut_open, raising=False)


def test_a_write_killed_midway_leaves_the_page_and_its_store_whole(tmp_path, monkeypatch):
  """kill -9 while RESULTS.md or records.json was written used to leave it cut (0 bytes at worst), and the next
  run then refused the store as not JSON; both are written to a temporary file and renamed over the old one."""
  _page_script(tmp_path, ["--update_committed", "--row=a:300"])
  committed = tmp_path / "committed"
  before = file_bytes(committed)
  with monkeypatch.context() as patch:
    cut_writes(patch, Killed)
    with pytest.raises(Killed):
      _page_script(tmp_path, ["--update_committed", "--row=a:400"])
  after = file_bytes(committed)
  assert {name: after[name] for name in before} == before  # what was committed is whole
  assert set(after) <= set(before) | {"records.json.tmp", "RESULTS.md.tmp"}  # a killed write's leftover at most
  again, _ = _page_script(tmp_path, ["--update_committed", "--row=a:400"])  # the next run reads and replaces
  assert "| a | 400 | 40.0 |" in again and not set(file_bytes(committed)) - {"records.json", "RESULTS.md"}


def test_a_full_disk_while_writing_is_one_line_and_leaves_no_empty_store(tmp_path, monkeypatch):
  """Disk full while a results folder was first written used to leave a 0-byte records.json (which blocked the
  next run) and a traceback; now one line naming the file and the free space, and no file at all."""
  mine = tmp_path / "mine"
  with monkeypatch.context() as patch:
    cut_writes(patch, lambda: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    with pytest.raises(SystemExit) as exited:
      _page_script(tmp_path, [f"--output_dir={mine}", "--row=a:300"])
  message = one_line_error(exited)
  assert f"no space left on the disk of {mine} to write records.json" in message
  assert file_bytes(mine) == {}  # no empty store, no temporary file
  text, _ = _page_script(tmp_path, [f"--output_dir={mine}", "--row=a:300"])  # space freed: the same command
  assert "| a | 300 | 30.0 |" in text
  report.RecordStore(str(tmp_path / "empty")).save()  # a store of no rows makes no file to refuse later
  assert not (tmp_path / "empty").exists()


@pytest.mark.parametrize("destination", ["committed", "own", "own, not made yet"])
def test_a_folder_that_cannot_be_written_is_refused_before_any_run_is_read(tmp_path, monkeypatch, destination):
  """A read-only output folder used to fail with a PermissionError traceback at the very end, after the runs
  were trained or decoded; now one line naming the folder, before ``collect``."""
  _page_script(tmp_path, ["--update_committed", "--row=a:300"])
  read_only = tmp_path / ("committed" if destination == "committed" else "locked")
  read_only.mkdir(exist_ok=True)
  folder = read_only / "page" if destination == "own, not made yet" else read_only
  argv = ["--update_committed"] if destination == "committed" else [f"--output_dir={folder}"]
  before = file_bytes(read_only)
  read_only.chmod(0o555)
  if os.geteuid() == 0:  # root writes through file permissions: what stops it is a read-only mount
    def read_only_mount(*args, **kwargs):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(folder))
    monkeypatch.setattr(report.tempfile, "mkstemp", read_only_mount)
    if destination == "own, not made yet":
      monkeypatch.setattr(report.os, "makedirs", read_only_mount)
  collected = []
  try:
    with pytest.raises(SystemExit) as exited:
      _page_script(tmp_path, [*argv, "--row=b:10"], collected)
  finally:
    read_only.chmod(0o755)
  message = one_line_error(exited)
  assert f"cannot write the page into {folder}" in message and "--output_dir" in message
  assert collected == [] and file_bytes(read_only) == before


def test_the_cpu_is_named_from_proc_cpuinfo_else_by_platform(monkeypatch):
  monkeypatch.setattr(report, "read_cpuinfo", lambda: {"model name": "Some CPU"})
  assert report.cpu_name() == "Some CPU"
  monkeypatch.setattr(report, "read_cpuinfo", dict)  # unreadable (another OS, a container without /proc)
  monkeypatch.setattr(report.platform, "processor", lambda: "")
  assert report.cpu_name() == report.platform.machine()


def test_launch_config_parses_a_command_as_launch_py_does():
  config = report.launch_config(["--config=experiments/multi30k.py:gru_bahdanau", "--workdir=W",
                                 "--config.num_train_steps=7", "--config.task.length_penalty_candidates=(1.0,2.0)"])
  assert (config.num_train_steps, tuple(config.task.length_penalty_candidates)) == (7, (1.0, 2.0))
  assert config.model.cell == "gru"  # the variant's own settings
  assert report.launch_config(["--config=experiments/multi30k.py:gru_bahdanau"]).num_train_steps != 7  # no leak


def test_block_bootstrap_shift_is_exact_and_dependence_widens_the_interval():
  rng = np.random.default_rng(0)
  mask = np.ones((2000, 1), bool)
  base = np.abs(rng.normal(size=(2000, 1)))
  shifted = report.block_bootstrap_difference(base + 2.0, base, mask, block_length=24)
  np.testing.assert_allclose([shifted["difference"][0], shifted["low"][0], shifted["high"][0]], 2.0, atol=1e-12)
  # Errors that drift slowly (AR(1), 0.98 per step): resampling single windows understates the uncertainty.
  drift = np.zeros(2000)
  for hour in range(1, 2000):
    drift[hour] = 0.98 * drift[hour - 1] + rng.normal()
  single = report.block_bootstrap_difference(drift[:, None], np.zeros((2000, 1)), mask, block_length=1)
  weekly = report.block_bootstrap_difference(drift[:, None], np.zeros((2000, 1)), mask, block_length=168)
  np.testing.assert_allclose(single["difference"], weekly["difference"], rtol=1e-12)
  assert (weekly["high"] - weekly["low"])[0] > 3 * (single["high"] - single["low"])[0]
  # Unmeasured targets count in neither sum.
  masked = report.block_bootstrap_difference(np.array([[1.0], [0.0]]), np.zeros((2, 1)), np.array([[True], [False]]),
                                              block_length=1)
  assert masked["difference"][0] == 1.0


def test_a_folder_without_metrics_and_a_negative_count_are_one_line_errors(tmp_path):
  with pytest.raises(report.UserError, match=f"{tmp_path} holds no metrics.jsonl: give the workdir of a training run"):
    report.run_metrics(str(tmp_path))
  (tmp_path / "metrics.jsonl").write_text('{"step": 10, "train/loss": 1.5}\n')
  assert report.run_metrics(str(tmp_path)) == [{"step": 10, "train/loss": 1.5}]
  assert report.non_negative_int("0") == 0 and report.non_negative_int("5") == 5
  for bad in ("-3", "2.5", "x"):
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be an integer >= 0, got {bad}"):
      report.non_negative_int(bad)
