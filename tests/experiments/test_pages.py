"""experiments/pages.py: the one main of a results script (make_page) and its flags, its refusals (no rows to write
from, a damaged store, a folder it cannot write) and its atomic writes; the pieces of a page (linked plots, the note
of runs not kept, where a page goes, the template of its prose)."""
import argparse
import builtins
import errno
import os

import pytest

from experiments import pages, record_store
from transformer.data import files
from transformer.errors import UserError


def test_the_output_flags_keep_their_names_and_benchmarks_have_no_force():
  parser = pages.results_parser("doc", "a folder of the script's", default_root="/tmp/root", hardware=True)
  args = parser.parse_args(["--output_dir=o", "--update_committed", "--force", "--from_records"])
  assert (args.output_dir, args.update_committed, args.force, args.from_records) == ("o", True, True, True)
  assert (args.workdir_root, args.hardware) == ("/tmp/root", "")
  benchmarks = argparse.ArgumentParser()  # sections replaced by every run: no rows to force
  pages.add_output_arguments(benchmarks, "runs/benchmarks-<time>/", force=False)
  assert "--force" not in benchmarks.format_help() and "a run of at least" not in benchmarks.format_help()
  boolean = argparse.ArgumentParser()
  pages.add_boolean_argument(boolean, "train", True, "Train.")  # absl's --notrain, as the READMEs write it
  assert boolean.parse_args([]).train and not boolean.parse_args(["--notrain"]).train
  assert pages.comma_list("a, b,") == ["a", "b"]


def test_a_plot_is_linked_only_where_it_was_drawn_and_pages_take_any_name(tmp_path):
  assert "not drawn here" in pages.image(str(tmp_path), "curves.png", "curves")
  (tmp_path / "curves.png").write_bytes(b"png")
  assert pages.image(str(tmp_path), "curves.png", "curves") == "![curves](curves.png)"
  record_store.write_text(str(tmp_path / "new"), "text", name="page.md")  # the folder is made
  assert record_store.read_text(str(tmp_path / "new"), name="page.md") == "text"
  assert record_store.read_text(str(tmp_path)) == ""
  assert pages.runs_not_kept(str(tmp_path)) == ""  # no hand-written note
  (tmp_path / pages.NOT_KEPT_NOTE).write_text("- lr 1e-3: diverged\n")
  assert pages.runs_not_kept(str(tmp_path)).startswith("\n## Runs not kept\n") and "- lr 1e-3: diverged\n" in (
      pages.runs_not_kept(str(tmp_path)))
  committed = str(tmp_path)
  with pytest.raises(UserError, match="at least as long"):
    pages.choose_results_folder(committed, False, False, committed, "d")
  with pytest.raises(UserError) as benchmarks:  # sections every run replaces: no rule of rows to name
    pages.choose_results_folder(committed, False, False, committed, "d", keeps_rows=False)
  assert "at least as long" not in str(benchmarks.value)


def test_a_template_is_read_as_named_pieces_of_prose_with_placeholders(tmp_path):
  template = tmp_path / "page_template.md"
  template.write_text("<!-- A note to the template's reader, in no piece. -->\n\n<!-- page -->\n# $title\n\n"
                      "It costs $$5.\n\n\n<!-- caption -->\nRows of ${name}s\n")
  pieces = pages.read_template(str(template))  # an absolute path; a relative one is under experiments/
  assert list(pieces) == ["page", "caption"]
  assert pieces["page"].substitute(title="T") == "# T\n\nIt costs $5."  # the newlines before a piece: no piece's
  assert pieces["caption"].substitute(name="run") == "Rows of runs"
  with pytest.raises(KeyError, match="name"):  # never a "$name" left on a page
    pieces["caption"].substitute()


def _page_script(tmp_path, argv, collected=None):
  """A results script of the one-main shape: a row per --row=NAME:STEPS, the page a table of the records;
  ``collected`` (returned) lists the rows collected, as far as the script got."""
  parser = pages.results_parser("doc", "default")
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
    return pages.markdown_table(["row", "steps", "score"],
                                [[name, record["steps"], record["values"]["score"]] for name, record in store.items()])

  committed = str(tmp_path / "committed")
  return pages.make_page(args, committed, str(tmp_path / "default"), collect, render), collected


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
  for module in (record_store, files):  # the module that writes, whichever it is, looks open up there first
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
  record_store.RecordStore(str(tmp_path / "empty")).save()  # a store of no rows makes no file to refuse later
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
    monkeypatch.setattr(pages.tempfile, "mkstemp", read_only_mount)
    if destination == "own, not made yet":
      monkeypatch.setattr(pages.os, "makedirs", read_only_mount)
  collected = []
  try:
    with pytest.raises(SystemExit) as exited:
      _page_script(tmp_path, [*argv, "--row=b:10"], collected)
  finally:
    read_only.chmod(0o755)
  message = one_line_error(exited)
  assert f"cannot write the page into {folder}" in message and "--output_dir" in message
  assert collected == [] and file_bytes(read_only) == before
