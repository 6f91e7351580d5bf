"""experiments/synthetic_results.py: the page goes to a folder of the user's unless --update_committed, and a
committed row is only replaced by a run at least as long (unless --force)."""
import json
import os
import shutil

import pytest
from absl import flags
from absl.testing import flagsaver

from experiments import report, synthetic_results


def records(steps: int) -> list[dict]:
  """Metric records of a run trained for ``steps`` (as metrics.jsonl holds them)."""
  return [{"step": step, "train/loss": 1.0 / step, "train/steps_per_second": 10.0,
           "train/tokens_per_second": 2000.0, "wall_seconds": step / 10} for step in (steps // 2, steps)] + [
              {"step": steps, "eval/exact_match": 1.0, "eval/token_accuracy": 1.0, "wall_seconds": steps / 10}]


@pytest.fixture
def committed(tmp_path, monkeypatch):
  """A copy of the committed experiments/synthetic/ page, standing in for it (tests never write the real one)."""
  copy = tmp_path / "committed" / "synthetic"
  shutil.copytree(os.path.join(report.COMMITTED, "synthetic"), copy)
  monkeypatch.setattr(report, "COMMITTED", str(copy.parent))
  return copy


def file_bytes(folder) -> dict:
  return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def train_fake_runs(monkeypatch, steps: int) -> None:
  """report.launch writes a finished run's metrics instead of training."""
  def launch(config, workdir):
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(record) + "\n" for record in records(steps))
    return ["python", "launch.py", f"--config={config}", f"--workdir={workdir}"]
  monkeypatch.setattr(report, "launch", launch)


def test_the_page_goes_to_the_workdir_root_by_default(tmp_path, monkeypatch, committed, capsys):
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  before = file_bytes(committed)
  repository_before = file_bytes(os.path.join(report.REPO, "experiments", "synthetic"))
  train_fake_runs(monkeypatch, steps=300)
  with flagsaver.flagsaver(workdir_root=str(tmp_path / "runs")):
    synthetic_results.main([])
  assert file_bytes(committed) == before
  assert file_bytes(os.path.join(report.REPO, "experiments", "synthetic")) == repository_before
  output = tmp_path / "runs" / "results"
  assert f"{output}/RESULTS.md" in capsys.readouterr().out
  assert report.recorded_steps(str(output), "task") == {"copy": 300, "reverse": 300, "sort": 300}
  assert (output / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_a_committed_row_is_replaced_only_by_a_run_at_least_as_long(tmp_path, monkeypatch, committed):
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  before = file_bytes(committed)
  recorded = report.recorded_steps(str(committed), "task")
  assert set(recorded) == set(synthetic_results.VARIANTS)
  train_fake_runs(monkeypatch, steps=min(recorded.values()) - 1)
  with flagsaver.flagsaver(workdir_root=str(tmp_path / "short"), update_committed=True):
    with pytest.raises(SystemExit) as exited:
      synthetic_results.main([])
  message = str(exited.value)
  assert message.startswith("error: ") and "\n" not in message and "--force" in message
  assert f"row 'copy' records a run of {recorded['copy']} training steps, the new one trained" in message
  assert file_bytes(committed) == before

  train_fake_runs(monkeypatch, steps=max(recorded.values()))
  with flagsaver.flagsaver(workdir_root=str(tmp_path / "long"), update_committed=True):
    synthetic_results.main([])
  assert "--workdir_root=" + str(tmp_path / "long") in (committed / "RESULTS.md").read_text()

  train_fake_runs(monkeypatch, steps=10)
  with flagsaver.flagsaver(workdir_root=str(tmp_path / "forced"), update_committed=True, force=True):
    synthetic_results.main([])
  assert report.recorded_steps(str(committed), "task") == {"copy": 10, "reverse": 10, "sort": 10}


def test_force_alone_and_both_destinations_are_refused(tmp_path, committed):
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  with flagsaver.flagsaver(workdir_root=str(tmp_path), force=True):
    with pytest.raises(SystemExit, match="--force only applies with --update_committed"):
      synthetic_results.main([])
  with flagsaver.flagsaver(workdir_root=str(tmp_path), update_committed=True, output_dir=str(tmp_path / "x")):
    with pytest.raises(SystemExit, match="not both"):
      synthetic_results.main([])
