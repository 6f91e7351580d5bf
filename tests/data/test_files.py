"""Files written whole (``transformer/data/files.py``): the old content stays until the new one is all on disk."""
import errno
import os

import pytest

from transformer.data.files import read_table, replacing, write_atomically
from transformer.errors import InputFileError, WorkdirError


def test_an_error_midway_leaves_the_old_file_and_no_temporary_one(tmp_path):
  path = tmp_path / "forecasts.csv"
  path.write_text("old\n")
  with pytest.raises(KeyError):
    with replacing(str(path), newline="") as file:
      file.write("new, first row\n")
      raise KeyError("a bug while the rows are made")
  with pytest.raises(WorkdirError, match=r"to write forecasts.csv \(\S+, more than \d+ bytes; .* free\)"):
    with replacing(str(path)) as file:
      file.write("new, first row\n")
      file.flush()
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["forecasts.csv"]
  with replacing(str(path), encoding="utf-8") as file:
    file.write("neu, Größe\n")
  write_atomically(str(tmp_path / "b.txt"), "Größe")  # text is UTF-8 whatever the locale
  assert path.read_text(encoding="utf-8") == "neu, Größe\n"
  assert (tmp_path / "b.txt").read_bytes() == "Größe".encode()


def test_a_damaged_table_line_is_named_by_its_file_and_number(tmp_path):
  """What the outputs behind results pages are read with (synthetic outputs, LM log-probabilities): a line with
  a column lost or a cell that is no number was a ValueError from unpacking or int(), naming neither."""
  path = tmp_path / "table.tsv"
  parse = lambda cells: (int(cells[0]), float(cells[1]))  # noqa: E731
  path.write_text("n\tx\n1\t0.5\n2\t0.25\n")
  assert read_table(str(path), ("n", "x"), parse, "numbers") == [(1, 0.5), (2, 0.25)]
  for damaged, line in (("n\tx\n1\t0.5\n2\n", 3), ("n\tx\none\t0.5\n", 2), ("n\tx\n1\t0.5\t9\n", 2)):
    path.write_text(damaged)
    with pytest.raises(InputFileError, match=rf"^{path} line {line} is damaged: .* should be 2 tab-separated "
                                             r"columns \(n, x\); restore the file"):
      read_table(str(path), ("n", "x"), parse, "numbers")
  path.write_text("count\tx\n")
  with pytest.raises(InputFileError, match=rf"^{path} is not a file of numbers: its first line should be 'n\\tx'"):
    read_table(str(path), ("n", "x"), parse, "numbers")
