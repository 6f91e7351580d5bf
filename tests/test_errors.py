"""transformer/errors.py: the user-caused error types stay ValueErrors, and the data readers raise them."""
import gzip

import pytest

from transformer import errors
from transformer.data import parallel_text


def test_every_user_error_is_a_value_error_and_missing_data_a_file_not_found_error():
  for error_type in (errors.ConfigError, errors.MissingDataError, errors.InputFileError):
    assert issubclass(error_type, errors.UserError) and issubclass(error_type, ValueError)
  assert issubclass(errors.MissingDataError, FileNotFoundError)
  assert parallel_text.MissingDataError is errors.MissingDataError  # the old import keeps working


def test_a_file_that_is_not_utf8_names_the_file_and_the_byte(tmp_path):
  path = tmp_path / "train.en"
  path.write_bytes("a dog\n".encode() + "ein Hund läuft\n".encode("latin-1"))
  with pytest.raises(errors.InputFileError, match=r"train\.en is not UTF-8 text \(line 2, byte 16: .*iconv"):
    parallel_text.read_lines(path)


def test_a_truncated_gzip_file_names_the_file(tmp_path):
  path = tmp_path / "train.en.gz"
  path.write_bytes(gzip.compress("a dog runs\n".encode() * 100)[:-12])  # the end (checksum, size) cut off
  with pytest.raises(errors.InputFileError, match=r"train\.en\.gz is a truncated or damaged gzip file"):
    parallel_text.read_lines(path)
  path.write_bytes(gzip.compress(b"a dog runs\n"))
  assert parallel_text.read_lines(path) == ["a dog runs"]
