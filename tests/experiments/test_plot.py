"""experiments/plot.py: a run's metrics.jsonl drawn to a PNG, and clear errors for a wrong workdir or metric."""
import json
import os
import subprocess
import sys

import pytest

from experiments import plot

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write_run(workdir, records):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(record) + "\n" for record in records)


RECORDS = [{"step": 100, "train/loss": 2.0}, {"step": 200, "train/loss": 1.0},
           {"step": 200, "eval/exact_match": 0.5, "eval/exact_match/seed_0": 0.5, "eval/loss": 1.1}]


def test_default_metrics_are_the_loss_and_each_eval_metric_without_seed_copies():
  assert plot.default_metrics({"run": RECORDS}) == ["train/loss", "eval/exact_match", "eval/loss"]


@pytest.mark.slow
def test_the_command_writes_a_png_beside_the_metrics(tmp_path):
  workdir = str(tmp_path / "run")
  _write_run(workdir, RECORDS)
  result = subprocess.run([sys.executable, "-m", "experiments.plot", workdir], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  path = os.path.join(workdir, "curves.png")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert f"wrote {path}" in result.stdout


def test_a_missing_run_or_metric_is_one_clear_line(tmp_path):
  with pytest.raises(SystemExit, match="has no metrics.jsonl"):
    plot.plot_runs([str(tmp_path / "nothing")])
  _write_run(str(tmp_path / "run"), RECORDS)
  with pytest.raises(SystemExit, match="no run logged eval/bleu; logged metrics: eval/exact_match"):
    plot.plot_runs([str(tmp_path / "run")], ["eval/bleu"])
