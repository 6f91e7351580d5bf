"""The embed command: the reference embeddings of all-MiniLM-L6-v2, mean pooling and normalisation against
numpy, one row per line in input order whatever the batching, progress and clear errors."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.pretrained.tiny_bert import numpy_bert, write_tiny_bert
from tests.shared_data import REPO_ROOT, shared_path
from transformer.pretrained import embed, load_bert

TEXTS = ["the fire is near the river", "", "a big flood on the road !", "burning", "Rain , rain , rain .",
         "the small fires near the big river burn on the road"]


@pytest.mark.slow
def test_command_reproduces_the_reference_sentence_embeddings(tmp_path):
  """python -m transformer.pretrained.embed on reference/sentences.txt: cosine >= 0.9999 per sentence."""
  model_dir = shared_path("models", "all-MiniLM-L6-v2")
  reference = np.load(model_dir / "reference" / "embeddings.npz")
  output = tmp_path / "embeddings.npy"
  result = subprocess.run(
      [sys.executable, "-m", "transformer.pretrained.embed", f"--model={model_dir}",
       f"--input={model_dir / 'reference' / 'sentences.txt'}", f"--output={output}"],
      capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  embeddings = np.load(output)
  assert embeddings.dtype == np.float32 and embeddings.shape == reference["embeddings"].shape
  np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
  cosine = np.sum(embeddings * reference["embeddings"], axis=1) / np.linalg.norm(reference["embeddings"], axis=1)
  assert cosine.min() >= 0.9999, cosine


@pytest.fixture
def tiny_model(tmp_path):
  hf_config, tensors = write_tiny_bert(tmp_path / "model")
  return tmp_path / "model", hf_config, tensors


def test_embeddings_are_normalised_means_over_real_tokens(tiny_model):
  model_dir, hf_config, tensors = tiny_model
  config, params, tokenizer = load_bert(model_dir)
  embeddings = embed.embed_texts(config, params, tokenizer, TEXTS, batch_size=4)
  assert embeddings.shape == (len(TEXTS), hf_config["hidden_size"]) and embeddings.dtype == np.float32
  for row, text in enumerate(TEXTS):  # one at a time: no padding in the reference
    ids = tokenizer.encode(text)[None]
    hidden = numpy_bert(tensors, hf_config, ids, np.zeros_like(ids), np.ones_like(ids))[0]
    expected = hidden.mean(0) / np.linalg.norm(hidden.mean(0))
    np.testing.assert_allclose(embeddings[row], expected, atol=2e-5, err_msg=text)


def test_batching_and_length_order_do_not_change_the_rows(tiny_model):
  config, params, tokenizer = load_bert(tiny_model[0])
  reports = []
  by_one = embed.embed_texts(config, params, tokenizer, TEXTS, batch_size=1)
  by_four = embed.embed_texts(config, params, tokenizer, TEXTS, batch_size=4,
                              progress=lambda done, total: reports.append((done, total)))
  np.testing.assert_allclose(by_four, by_one, atol=1e-6)
  assert reports == [(4, 6), (6, 6)]
  assert np.abs(by_one[0] - by_one[2]).max() > 1e-2  # distinct texts, distinct rows
  assert embed.embed_texts(config, params, tokenizer, [], batch_size=4).shape == (0, config.d_model)


def _run_main(capsys, *args) -> tuple[int, str]:
  code = embed.main([str(arg) for arg in args])
  return code, capsys.readouterr().err


def test_main_writes_one_row_per_line_and_reports_progress(tiny_model, tmp_path, capsys):
  model_dir = tiny_model[0]
  (tmp_path / "input.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
  output = tmp_path / "out" / "embeddings.npy"
  code, err = _run_main(capsys, f"--model={model_dir}", f"--input={tmp_path / 'input.txt'}",
                        f"--output={output}", "--batch_size=2")
  assert code == 0, err
  assert "embedded 6/6 lines" in err and f"wrote {output}: 6 embeddings of 8 floats" in err
  config, params, tokenizer = load_bert(model_dir)
  np.testing.assert_allclose(np.load(output), embed.embed_texts(config, params, tokenizer, TEXTS), atol=1e-6)


def test_main_errors_are_one_line_naming_the_problem(tiny_model, tmp_path, capsys):
  model_dir = tiny_model[0]
  good_input = tmp_path / "input.txt"
  good_input.write_text("the fire\n", encoding="utf-8")
  output = tmp_path / "out.npy"

  (model_dir / "tokenizer.json").rename(tmp_path / "tokenizer.json")
  code, err = _run_main(capsys, f"--model={model_dir}", f"--input={good_input}", f"--output={output}")
  assert code == 1 and err.startswith("error: ") and err.count("\n") == 1
  assert f"BERT model directory {model_dir} lacks tokenizer.json" in err
  (tmp_path / "tokenizer.json").rename(model_dir / "tokenizer.json")

  bad_input = tmp_path / "latin1.txt"
  bad_input.write_bytes("fire\nflood in K\xf6ln\n".encode("latin-1"))
  code, err = _run_main(capsys, f"--model={model_dir}", f"--input={bad_input}", f"--output={output}")
  assert code == 1 and f"{bad_input}, line 2: not UTF-8" in err

  code, err = _run_main(capsys, f"--model={model_dir}", f"--input={tmp_path / 'none.txt'}", f"--output={output}")
  assert code == 1 and "input file" in err and "does not exist" in err
  assert not output.exists()


def test_read_lines_keeps_empty_lines_and_drops_only_the_final_newline(tmp_path):
  path = tmp_path / "lines.txt"
  path.write_bytes(b"first\r\n\nthird\xe2\x80\xa8still third\n")
  assert embed.read_lines(path) == ["first", "", "third\u2028still third"]
  path.write_bytes(b"no final newline")
  assert embed.read_lines(path) == ["no final newline"]
