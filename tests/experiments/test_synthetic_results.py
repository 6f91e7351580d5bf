"""experiments/synthetic_results.py: the page goes to a folder of the user's unless --update_committed, a
committed row is only replaced by a run at least as long (unless --force), and the committed page is rewritten
from its records.json alone (--from_records)."""
import json
import os
import shutil

import pytest

from experiments import launching, record_store, synthetic_results


def records(steps: int) -> list[dict]:
  """Metric records of a run trained for ``steps`` (as metrics.jsonl holds them)."""
  return [{"step": step, "train/loss": 1.0 / step, "train/steps_per_second": 10.0,
           "train/tokens_per_second": 2000.0, "wall_seconds": step / 10} for step in (steps // 2, steps)] + [
              {"step": steps, "eval/exact_match": 1.0, "eval/token_accuracy": 1.0, "wall_seconds": steps / 10}]


@pytest.fixture
def committed(tmp_path, monkeypatch):
  """A copy of the committed experiments/synthetic/ page, standing in for it (tests never write the real one)."""
  copy = tmp_path / "committed" / "synthetic"
  shutil.copytree(os.path.join(record_store.COMMITTED, "synthetic"), copy)
  monkeypatch.setattr(record_store, "COMMITTED", str(copy.parent))
  return copy


def file_bytes(folder) -> dict:
  """Path (relative to ``folder``) -> bytes of every file under it."""
  return {os.path.relpath(os.path.join(root, name), folder): open(os.path.join(root, name), "rb").read()
          for root, _, names in os.walk(folder) for name in sorted(names)}


def recorded_steps(folder) -> dict[str, int]:
  return {name: record["steps"] for name, record in record_store.RecordStore(str(folder)).items()}


def train_fake_runs(monkeypatch, steps: int) -> None:
  """launching.launch writes a finished run's metrics instead of training; its outputs are two examples, right."""
  def write_outputs(folder, name, workdir, step):
    os.makedirs(os.path.join(folder, synthetic_results.OUTPUTS), exist_ok=True)
    with open(synthetic_results.outputs_path(folder, name), "w") as f:
      f.write("source\ttarget\tprediction\tcorrect_tokens\ttokens\n3 4\t3 4 2\t3 4 2\t3\t3\n5\t5 2\t5 2\t2\t2\n")
    return {"exact_match": 1.0, "token_accuracy": 1.0}
  monkeypatch.setattr(synthetic_results, "write_outputs", write_outputs)

  def launch(config, workdir):
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(record) + "\n" for record in records(steps))
    return ["python", "launch.py", f"--config={config}", f"--workdir={workdir}"]
  monkeypatch.setattr(launching, "launch", launch)


def test_the_page_goes_to_the_workdir_root_by_default(tmp_path, monkeypatch, committed, capsys):
  before = file_bytes(committed)
  repository_before = file_bytes(os.path.join(record_store.REPO, "experiments", "synthetic"))
  train_fake_runs(monkeypatch, steps=300)
  text = synthetic_results.main([f"--workdir_root={tmp_path / 'runs'}"])
  assert file_bytes(committed) == before
  assert file_bytes(os.path.join(record_store.REPO, "experiments", "synthetic")) == repository_before
  output = tmp_path / "runs" / "results"
  assert f"{output}/RESULTS.md" in capsys.readouterr().out
  assert recorded_steps(output) == {"copy": 300, "reverse": 300, "sort": 300}
  assert "| copy | 300 | 1.0000 | 1.0000 | step 300, 30 s | 30 s | 10.0 | 2,000 |" in text
  assert (output / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_a_committed_row_is_replaced_only_by_a_run_at_least_as_long(tmp_path, monkeypatch, committed):
  before = file_bytes(committed)
  recorded = recorded_steps(committed)
  assert set(recorded) == set(synthetic_results.VARIANTS)
  train_fake_runs(monkeypatch, steps=min(recorded.values()) - 1)
  with pytest.raises(SystemExit) as exited:
    synthetic_results.main([f"--workdir_root={tmp_path / 'short'}", "--update_committed"])
  message = str(exited.value)
  assert message.startswith("error: ") and "\n" not in message and "--force" in message
  assert f"row 'copy' records a run of {recorded['copy']} training steps, the new one trained" in message
  assert file_bytes(committed) == before

  train_fake_runs(monkeypatch, steps=max(recorded.values()))
  synthetic_results.main([f"--workdir_root={tmp_path / 'long'}", "--update_committed"])
  page = (committed / "RESULTS.md").read_text()
  assert "--workdir_root=" + str(tmp_path / "long") in page
  assert (committed / "outputs" / "copy.tsv").exists()
  # Another run over a committed row: the page says what its headline cells were and are.
  assert "- `copy`: rerun on " in page and "first >= 99% exact match was " in page

  train_fake_runs(monkeypatch, steps=10)
  synthetic_results.main([f"--workdir_root={tmp_path / 'forced'}", "--update_committed", "--force"])
  assert recorded_steps(committed) == {"copy": 10, "reverse": 10, "sort": 10}


def test_the_committed_page_is_rewritten_from_its_records_alone(tmp_path, committed, monkeypatch):
  """--from_records trains nothing (no workdir exists) and gives the committed page byte for byte: its rows,
  commands and machine stamp all come from records.json; curves.png is left as it is. The page is deleted first,
  so only a page written again from the records can match."""
  monkeypatch.setattr(launching, "launch", lambda *args: pytest.fail("--from_records must train nothing"))
  before = file_bytes(committed)
  (committed / "RESULTS.md").unlink()
  synthetic_results.main(["--from_records", "--update_committed", f"--workdir_root={tmp_path / 'none'}"])
  assert file_bytes(committed) == before


def test_force_alone_and_both_destinations_are_refused(tmp_path, committed):
  with pytest.raises(SystemExit, match="--force only applies with --update_committed"):
    synthetic_results.main([f"--workdir_root={tmp_path}", "--force"])
  with pytest.raises(SystemExit, match="not both"):
    synthetic_results.main([f"--workdir_root={tmp_path}", "--update_committed", f"--output_dir={tmp_path / 'x'}"])


def test_from_records_without_the_records_file_refuses_and_keeps_the_committed_page(tmp_path, committed, monkeypatch):
  """Issue 57: ``--from_records --update_committed`` with records.json gone emptied the committed table, exit 0."""
  monkeypatch.setattr(launching, "launch", lambda *args: pytest.fail("--from_records must train nothing"))
  (committed / "records.json").unlink()
  before = file_bytes(committed)
  with pytest.raises(SystemExit) as exited:
    synthetic_results.main(["--from_records", "--update_committed", f"--workdir_root={tmp_path / 'none'}"])
  message = str(exited.value)
  assert message.startswith(f"error: --from_records: there is no {committed / 'records.json'}") and "\n" not in message
  assert file_bytes(committed) == before
