"""Goodput over a whole job: the phases of every launch, the launch before each session (imports, the join), and
the time between launches, with waits after a finished run left out."""
import subprocess
import sys
import time

import pytest

from tests.train.conftest import REPO
from transformer.train.loop import Goodput
from transformer.train.multihost import process_started_at


class Clock:
  def __init__(self, now):
    self.now = now

  def __call__(self):
    return self.now


def test_a_first_launch_counts_its_start_and_what_no_phase_holds():
  clock = Clock(110.0)
  goodput = Goodput(clock=clock)
  goodput.start_launch(process_started=100.0, session_started=103.0, finished_before=None)
  goodput.add("step", 5.0)
  record, line = goodput.summary(steps_trained=10)
  assert record["seconds"]["launch"] == 3.0 and record["job_started"] == 100.0
  assert record["seconds"]["between_launches"] == pytest.approx(2.0)  # 10 s of job, 8 in phases
  assert record["total_seconds"] == pytest.approx(10.0) and record["goodput"] == pytest.approx(0.5)
  assert line.startswith("goodput: 50.0% of 10.0 s (productive steps 5.0 s") and "between launches 2.0 s" in line


def test_a_relaunch_after_a_kill_counts_the_gap_and_one_after_a_finished_run_does_not():
  first = Goodput(clock=Clock(110.0))
  first.start_launch(100.0, 103.0, None)
  first.add("step", 5.0)
  saved = first.saved(steps_trained=10)  # what the checkpoint carries
  killed = Goodput(saved, clock=Clock(230.0))
  killed.start_launch(process_started=200.0, session_started=202.0, finished_before=None)
  killed.add("step", 20.0)
  record, _ = killed.summary(steps_trained=20)
  # 130 s since the first process started; the phases hold 8 + 2 + 20.
  assert record["job_started"] == 100.0 and record["seconds"]["between_launches"] == pytest.approx(100.0)
  assert record["goodput"] == pytest.approx(25.0 / 130.0)
  extended = Goodput(saved, clock=Clock(230.0))
  extended.start_launch(200.0, 202.0, finished_before=150.0)  # the run had finished at 150: 50 s idle
  extended.add("step", 20.0)
  record, _ = extended.summary(steps_trained=20)
  assert record["idle_seconds"] == 50.0 and record["seconds"]["between_launches"] == pytest.approx(50.0)


def test_a_saved_record_is_not_counted_twice():
  goodput = Goodput(clock=Clock(120.0))
  goodput.start_launch(100.0, 101.0, None)
  goodput.summary(steps_trained=0)
  again, _ = Goodput(goodput.saved(0), clock=Clock(120.0)).summary(steps_trained=0)
  assert again["seconds"]["between_launches"] == pytest.approx(19.0) and again["total_seconds"] == pytest.approx(20.0)


def test_process_start_is_read_from_the_system():
  before = time.time()
  output = subprocess.run([sys.executable, "-c", "import time; from transformer.train.multihost import "
                           "process_started_at; print(process_started_at(), time.time())"],
                          cwd=REPO, capture_output=True, text=True, check=True).stdout
  started, imported = map(float, output.split())
  assert before - 0.05 <= started <= before + 2.0 and started < imported  # it started before its imports ran
  assert process_started_at() < before  # this process is older
