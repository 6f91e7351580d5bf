"""``transformer.tasks.progress.Progress``: a bar on a terminal, log lines every few seconds in a log file."""
import io
import logging
import sys

from transformer.tasks.progress import Progress


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def _messages(caplog):
  return [record.getMessage() for record in caplog.records if record.name == "transformer.tasks.progress"]


def test_in_a_log_file_progress_is_a_line_per_interval_and_a_last_line(caplog, monkeypatch):
  monkeypatch.setattr(sys, "stderr", io.StringIO())
  caplog.set_level(logging.INFO, "transformer.tasks.progress")
  progress = Progress("decoding test", 10, interval_seconds=0)
  for _ in range(5):
    progress.update(2)
  progress.close()
  assert _messages(caplog) == [f"decoding test: {done}/10 sentences ({10 * done}%)" for done in (2, 4, 6, 8, 10)]
  assert sys.stderr.getvalue() == ""  # no bar, no escape codes


def test_a_last_line_says_when_a_loop_that_logged_ends(caplog, monkeypatch):
  monkeypatch.setattr(sys, "stderr", io.StringIO())
  caplog.set_level(logging.INFO, "transformer.tasks.progress")
  progress = Progress("decoding test", 10, interval_seconds=0)
  progress.update(4)
  progress._interval = 3600  # the rest comes sooner than the next line is due
  progress.update(6)
  progress.close()
  assert _messages(caplog) == ["decoding test: 4/10 sentences (40%)", "decoding test: 10/10 sentences (100%)"]


def test_a_loop_shorter_than_the_interval_logs_nothing(caplog, monkeypatch):
  monkeypatch.setattr(sys, "stderr", io.StringIO())
  caplog.set_level(logging.INFO, "transformer.tasks.progress")
  progress = Progress("decoding validation", 10, interval_seconds=3600)
  progress.update(10)
  progress.close()
  assert _messages(caplog) == []


def test_on_a_terminal_progress_is_a_bar_and_quiet_shows_nothing(caplog, monkeypatch):
  terminal = _Terminal()
  monkeypatch.setattr(sys, "stderr", terminal)
  caplog.set_level(logging.INFO, "transformer.tasks.progress")
  progress = Progress("decoding test", 4, interval_seconds=0)
  progress.update(4)
  progress.close()
  assert "\rdecoding test:" in terminal.getvalue() and terminal.getvalue().endswith("\r")  # drawn, then erased
  assert _messages(caplog) == []
  terminal.truncate(0)
  quiet = Progress("decoding quiet", 4, quiet=True, interval_seconds=0)
  quiet.update(4)
  quiet.close()
  assert "decoding quiet" not in terminal.getvalue() and _messages(caplog) == []
