"""experiments/translation_results.py: rows accumulate in runs.json across invocations; the committed test
output is the best-on-validation model's."""
import json

from experiments import translation_results

HYPOTHESIS = "test_2016_flickr.hyp.de"


def summary(validation_bleu, test_bleu):
  return {"size": "4+4 layers, d_model 128", "training_pairs": 29000, "best_step": 200, "steps_trained": 300,
          "steps_planned": 400, "wall_hours": 0.5, "validation_bleu": validation_bleu, "test_bleu": test_bleu,
          "test_bleu_lowercase": test_bleu + 0.5, "signature": "nrefs:1|tok:13a", "command": "python launch.py",
          "hardware": "1 x cpu", "note": "",
          "curves": [{"step": 100, "train/nll": 3.0}, {"step": 200, "train/nll": 2.0, "eval/bleu": validation_bleu}]}


def run_dir(tmp_path, name, text):
  workdir = tmp_path / name
  workdir.mkdir()
  (workdir / HYPOTHESIS).write_text(text)
  return str(workdir)


def test_rows_accumulate_and_best_hypotheses_are_kept(tmp_path):
  output = tmp_path / "multi30k"
  output.mkdir()
  first = run_dir(tmp_path, "first", "erste\n")
  translation_results.write_results("multi30k", str(output), {"transformer_small": (summary(30.0, 31.0), first)})
  assert (output / HYPOTHESIS).read_text() == "erste\n"

  worse = run_dir(tmp_path, "worse", "schlechter\n")
  text = translation_results.write_results("multi30k", str(output), {"gru_bahdanau": (summary(20.0, 21.0), worse)})
  assert (output / HYPOTHESIS).read_text() == "erste\n"  # a worse model on validation does not replace it
  assert set(json.loads((output / "runs.json").read_text())) == {"transformer_small", "gru_bahdanau"}
  rows = [line for line in text.splitlines() if line.startswith("| transformer_small") or line.startswith("| gru")]
  assert len(rows) == 2 and "| 31.00 | 31.50 |" in rows[0] and "| 21.00 | 21.50 |" in rows[1]
  assert "200 of 300 (stopped early of 400)" in rows[0]
  assert "The best model on validation (transformer_small)" in text

  better = run_dir(tmp_path, "better", "besser\n")  # reporting a variant again replaces its row
  text = translation_results.write_results("multi30k", str(output), {"gru_bahdanau": (summary(35.0, 36.0), better)})
  assert (output / HYPOTHESIS).read_text() == "besser\n"
  assert "| 36.00 |" in text and "| 21.00 |" not in text
  assert (output / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
