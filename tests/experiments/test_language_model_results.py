"""experiments/language_model_results.py writes a page from a (tiny) trained run: the table, the command that
reproduces it, and greedy continuations through transformer.load."""
import os

from experiments import language_model_results, report
from tests.data.data_fixtures import write_multi30k
from tests.tasks.test_language_model import SIZES, tiny_config
from transformer.train import run


def test_page_from_a_tiny_run(tmp_path, monkeypatch):
  raw_dir = write_multi30k(tmp_path / "raw" / "multi30k", sizes=SIZES)
  workdir = str(tmp_path / "runs" / "small")
  run(tiny_config(raw_dir, tmp_path / "tfds"), workdir)
  output = str(tmp_path / "page")
  text = language_model_results.write_results(output, workdir)
  assert sorted(os.listdir(output)) == ["RESULTS.md", "curves.png"]
  rows = report.read_markdown_table(text, "variant")
  assert [row["steps"] for row in rows] == ["20"]
  assert float(rows[0]["best validation perplexity (per piece)"]) > 1.0
  # The tiny run differs from the small variant by flags, which the command carries; paths are made portable.
  assert "--config.model.d_model=32" in rows[0]["command"] and "--workdir=WORKDIR" in rows[0]["command"]
  assert text.count("| A man in a red shirt |") == 1
