"""Files written whole (``transformer/data/files.py``): the old content stays until the new one is all on disk."""
import errno
import os

import pytest

from transformer.data.files import replacing, write_atomically
from transformer.errors import WorkdirError


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
