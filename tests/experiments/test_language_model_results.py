"""experiments/language_model_results.py writes a page from a (tiny) trained run: the table, the command that
reproduces it, and greedy continuations through transformer.load; the committed page from its records alone."""
import os
import shutil

import pytest

from experiments import language_model_results, output_pages, record_store
from tests.data.data_fixtures import write_multi30k
from tests.tasks.test_language_model import SIZES, tiny_config
from transformer.train import run


@pytest.mark.slow
def test_page_from_a_tiny_run_and_again_from_its_records(tmp_path):
  raw_dir = write_multi30k(tmp_path / "raw" / "multi30k", sizes=SIZES)
  run(tiny_config(raw_dir, tmp_path / "tfds"), str(tmp_path / "runs" / "small"))
  output = tmp_path / "page"
  text = language_model_results.main([f"--workdir_root={tmp_path / 'runs'}", f"--output_dir={output}"])
  assert sorted(os.listdir(output)) == ["RESULTS.md", "curves.png", "log_probs", "logs", "records.json"]
  record = record_store.RecordStore(str(output))["small"]
  assert record["steps"] == 20 and record["values"]["best_perplexity"] > 1.0
  # The run's training log kept beside the page gives the row's best step, wall time and throughput again.
  from_log = language_model_results.log_values(output_pages.read_log(str(output), "small"))
  assert from_log.pop("steps") == 20 and from_log == {name: record["values"][name] for name in from_log}
  # The row's numbers are those of the per-sentence log-probabilities beside the page, and the run's own eval's.
  recomputed = language_model_results.recompute(str(output), "small", record)
  assert recomputed == {name: record["values"][name] for name in recomputed}
  assert record["values"]["best_nll"] == pytest.approx(record["values"]["logged"]["nll"], rel=1e-5)
  assert f"| small | 20 | {record['values']['best_perplexity']:.2f} |" in text
  # The tiny run differs from the small variant by flags, which the command carries; paths are made portable.
  assert "--config.model.d_model=32" in record["command"] and "--workdir=WORKDIR" in record["command"]
  assert text.count("| A man in a red shirt |") == 1
  # The page again, from records.json alone: the run's workdir is not read.
  shutil.rmtree(tmp_path / "runs")
  assert language_model_results.main(["--from_records", f"--output_dir={output}"]) == text


def test_the_committed_page_is_rewritten_from_its_records_alone(tmp_path, monkeypatch):
  copy = tmp_path / "committed" / "language_model"
  shutil.copytree(os.path.join(record_store.COMMITTED, "language_model"), copy)
  monkeypatch.setattr(record_store, "COMMITTED", str(copy.parent))
  monkeypatch.setattr(language_model_results, "collect", lambda *args: pytest.fail("--from_records reads no run"))
  before = (copy / "RESULTS.md").read_text()
  assert language_model_results.main(["--from_records", "--update_committed"]) == before
