"""The dead-peer watch at many processes: its requests to the coordination service grow as N, not N^2 (a fake
service of 512 processes; the real one, with 2 processes and a kill, is in test_multihost.py)."""
import time

import pytest

from transformer.train import multihost

PROCESSES = 512


class FakeService:
  """The coordination service's key-value calls the watch makes; every peer but ``silent`` beats on each read."""

  def __init__(self, silent=None):
    self.calls = {"key_value_set": 0, "key_value_dir_get": 0, "key_value_try_get": 0}
    self.silent = silent
    self.beat = 0

  def key_value_set(self, key, value, allow_overwrite=False):
    self.calls["key_value_set"] += 1

  def key_value_dir_get(self, directory):
    self.calls["key_value_dir_get"] += 1
    self.beat += 1
    return [(f"{directory}/{peer}", "0" if peer == self.silent else str(self.beat)) for peer in range(1, PROCESSES)]

  def key_value_try_get(self, key):
    self.calls["key_value_try_get"] += 1
    raise AssertionError("the watch reads each peer's key: O(N^2) requests over the job")


def _watch(monkeypatch, service, timeout):
  monkeypatch.setattr(multihost, "_client", lambda: service)
  monkeypatch.setattr(multihost.jax, "process_count", lambda: PROCESSES)
  monkeypatch.setattr(multihost.jax, "process_index", lambda: 0)
  lost = []
  watch = multihost.PeerWatch(timeout, lost=lambda peer, why: lost.append((peer, why)))
  return watch, lost


def test_each_beat_is_one_write_and_one_read_of_every_mark(monkeypatch):
  service = FakeService()
  watch, lost = _watch(monkeypatch, service, timeout=2.0)
  watch.start()
  time.sleep(1.1)
  watch.finish()
  beats = service.calls["key_value_dir_get"]
  assert beats >= 3 and not lost
  assert service.calls["key_value_set"] in (beats + 2, beats + 3)  # the first mark, one per beat, the last mark
  assert service.calls["key_value_try_get"] == 0


@pytest.mark.parametrize("silent", [1, PROCESSES - 1])
def test_a_silent_peer_among_many_is_named(monkeypatch, silent):
  watch, lost = _watch(monkeypatch, FakeService(silent=silent), timeout=1.0)
  watch.start()
  deadline = time.monotonic() + 5
  while not lost and time.monotonic() < deadline:
    time.sleep(0.05)
  watch.finish()
  assert lost and lost[0][0] == silent and "has not answered" in lost[0][1]
