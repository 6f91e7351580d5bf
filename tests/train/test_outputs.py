"""What a run tells its user: the config's path (not its ~90 lines), a line per compiled batch shape, an
end-of-run summary, a finished run reported instead of retrained, eval as a table, predict's file, and on a
terminal no text written inside the progress bar."""
import importlib.util
import io
import os
import re
import sys

import pytest

from transformer import load
from transformer.train.config import build_task
from transformer.train import run
from transformer.train.workdir import read_metrics
from transformer.train.writers import final_lines, results_table, shown_metrics


def test_a_run_prints_the_config_path_one_compile_line_and_a_summary(make_config, tmp_path, capsys):
  run(make_config(quiet=False, best_metric="eval/loss", best_mode="min", tensorboard=True), str(tmp_path))
  out = capsys.readouterr().out
  assert f"config: {tmp_path}/config.json" in out
  assert "num_train_steps" not in out and "d_model" not in out  # the full config stays in the file
  assert out.count("compiling the train step for batch shape") == 1  # synthetic batches have one shape
  summary = out[out.index("done: step 20 of 20"):]
  evals = [record for record in read_metrics(str(tmp_path)) if "eval/loss" in record]
  best = min(evals, key=lambda record: record["eval/loss"])
  final_line = next(line for line in summary.splitlines() if line.startswith("final: "))
  assert f"eval/loss={evals[-1]['eval/loss']:.4f}" in final_line
  assert f"best: eval/loss={best['eval/loss']:.4f} at step {best['step']}: {tmp_path}/checkpoints/{best['step']}" \
      in summary
  for expected in (f"checkpoints: {tmp_path}/checkpoints", f"metrics: {tmp_path}/metrics.jsonl",
                   f"python -m transformer.plot {tmp_path}", f"tensorboard --logdir {tmp_path}/tensorboard"):
    assert expected in summary
  # The viewer is an extra: without it the line says how to install it.
  viewer_installed = importlib.util.find_spec("tensorboard") is not None
  assert ('pip install -e ".[tensorboard]"' in summary) != viewer_installed


def test_many_final_metrics_are_a_table_few_are_one_line():
  """A forecaster's mae/mse/rmse per horizon made the summary's final line hundreds of characters long."""
  few = {"eval/loss": 1.0, "eval/exact_match": 0.5}
  assert final_lines(few) == ["final: eval/loss=1.0000 eval/exact_match=0.5000"]
  many = shown_metrics({f"eval/{kind}_{hours}h": float(hours) for kind in ("mae", "mse", "rmse")
                        for hours in (1, 6, 12, 24)})
  header, table = final_lines(many)
  assert header == "final:" and table == results_table(many)
  assert [row.split()[0] for row in table.splitlines()[1:4]] == ["mae_1h", "mae_6h", "mae_12h"]
  assert max(len(row) for row in table.splitlines()) < 40


def test_quiet_leaves_out_the_compile_lines_not_the_summary(make_config, tmp_path, capsys):
  run(make_config(quiet=True), str(tmp_path))
  out = capsys.readouterr().out
  assert "compiling" not in out and "done: step 20 of 20" in out


def test_rerunning_a_finished_run_reports_it_and_trains_nothing(make_config, tmp_path, capsys):
  first = run(make_config(), str(tmp_path))
  records = read_metrics(str(tmp_path))
  checkpoints = sorted(os.listdir(tmp_path / "checkpoints"))
  capsys.readouterr()
  again = run(make_config(), str(tmp_path))
  out = capsys.readouterr().out
  assert f"already done: {tmp_path} is trained to step 20" in out and "final: eval/" in out
  assert again.step == 20 and again.metrics == pytest.approx(first.metrics)
  assert read_metrics(str(tmp_path)) == records and sorted(os.listdir(tmp_path / "checkpoints")) == checkpoints


def test_results_table_has_a_row_per_metric_and_a_column_per_split():
  table = results_table({"eval/bleu": 38.1234567, "eval/loss": 1.5, "test/bleu": 39.86,
                         "test/bleu_signature": "nrefs:1", "test/f1/seed_0": 0.5, "test/by_length": {"0-9": 1.0}})
  assert table.splitlines() == ["metric  eval     test",
                                "bleu    38.1235  39.86",
                                "loss    1.5"]


def test_metrics_are_printed_by_the_value_of_their_numbers():
  """PM2.5's horizons once printed as mae_12h, mae_1h, mae_24h, mae_6h (a plain sort of the names)."""
  metrics = {f"eval/{kind}_{hours}h": float(hours) for kind in ("rmse", "mae") for hours in (24, 6, 1, 12)}
  metrics.update({"eval/loss": 0.5, "eval/mae_1h/seed_0": 1.0})
  expected = ["loss"] + [f"{kind}_{hours}h" for kind in ("mae", "rmse") for hours in (1, 6, 12, 24)]
  assert [row.split()[0] for row in results_table(metrics).splitlines()[1:]] == expected
  assert list(shown_metrics(metrics)) == [f"eval/{name}" for name in expected]  # the eval line and the summary


@pytest.mark.slow
def test_eval_prints_its_metrics_as_a_table(make_config, tmp_path, capsys):
  run(make_config(), str(tmp_path))
  capsys.readouterr()
  output = run(make_config(), str(tmp_path), mode="eval")
  out = capsys.readouterr().out
  lines = out[out.index("step 20:\n"):].splitlines()[1:]
  assert lines[0].split() == ["metric", "eval"]
  rows = {}
  for line in lines[1:]:
    if line.startswith("written: "):
      break
    name, value = line.split()
    rows[f"eval/{name}"] = float(value)
  assert rows == pytest.approx(output.metrics, abs=1e-4)
  assert f"written: {tmp_path}/eval_results.json" in out


@pytest.mark.slow
def test_predict_writes_one_line_per_example_and_does_not_evaluate(make_config, tmp_path, capsys):
  config = make_config()
  run(config, str(tmp_path))
  capsys.readouterr()
  output = run(config, str(tmp_path), mode="predict")
  out = capsys.readouterr().out
  assert output.metrics == {} and "eval/" not in out
  assert f"predictions of step 20: {tmp_path}/predictions.txt" in out
  lines = (tmp_path / "predictions.txt").read_text().splitlines()
  assert len(lines) == config.task.num_eval_examples
  source = build_task(config).eval_batches(config.eval_batch_size)[0]["source"][0]
  source_text, predicted_text = lines[0].split("\t")
  assert source_text.split() == [str(t) for t in source if t]
  model = load(str(tmp_path))
  decoded = [int(t) for t in model.decode([source[source != 0]])[0] if t not in (0, model.model_config.eos_id)]
  predicted = [int(t) for t in predicted_text.split()]
  assert predicted == decoded[:len(predicted)]  # the same greedy decoding (the file's may be cut shorter)


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_on_a_terminal_every_message_starts_its_own_line_outside_the_bar(make_config, tmp_path, monkeypatch):
  terminal = _Terminal()
  monkeypatch.setattr(sys, "stdout", terminal)
  monkeypatch.setattr(sys, "stderr", terminal)
  run(make_config(quiet=False), str(tmp_path))
  text = terminal.getvalue()
  assert "20/20" in text  # the bar was drawn
  pieces = re.split(r"[\r\n]", text)
  for marker, start in (("compiling the train step", "compiling"), ("examples:", "examples:"),
                        (" (step ", "eval/exact_match="), ("done: step 20 of 20", "done:")):
    hits = [piece for piece in pieces if marker in piece]
    assert hits and all(piece.startswith(start) for piece in hits), (marker, hits)


def test_sweep_variants_are_named_by_their_values():
  from transformer.train.config import Replicas
  from transformer.train.writers import variant_tables
  replicas = Replicas.parse("optimizer.learning_rate=0.002,0.0005;label_smoothing=0,0.1", num_seeds=2)
  assert replicas.variant_names() == ["variant_0 (optimizer.learning_rate=0.002, label_smoothing=0)",
                                      "variant_1 (optimizer.learning_rate=0.0005, label_smoothing=0.1)"]
  assert Replicas.parse("", num_seeds=2).variant_names() == []
  metrics = {"eval/loss": 2.0, "eval/loss/variant_0": 1.5, "eval/loss/variant_1": 2.5, "eval/loss/seed_0": 1.4}
  assert variant_tables(metrics, replicas.variant_names()).splitlines() == [
      "variant_0 (optimizer.learning_rate=0.002, label_smoothing=0):", "metric  eval", "loss    1.5",
      "variant_1 (optimizer.learning_rate=0.0005, label_smoothing=0.1):", "metric  eval", "loss    2.5"]


@pytest.mark.slow
def test_a_sweep_summary_and_eval_show_a_table_per_variant(make_config, tmp_path, capsys):
  """The end-of-run summary and ``--mode=eval`` print each variant's metrics under its values, beside the mean
  over all replicas (before, only the mean was in a table, the variants as ``eval/loss/variant_0`` in one line)."""
  config = make_config(sweep="optimizer.learning_rate=0.002,0.0005", num_train_steps=10, eval_every=10,
                       checkpoint_every=10)
  results = run(config, str(tmp_path)).metrics
  summary = capsys.readouterr().out.split("done: step 10 of 10")[1]
  run(config, str(tmp_path), "eval")
  evaluated = capsys.readouterr().out.split("step 10:")[1]
  for printed in (summary, evaluated):
    for index, rate in enumerate(("0.002", "0.0005")):
      block = printed.split(f"variant_{index} (optimizer.learning_rate={rate}):\n")[1].splitlines()
      loss_row = results_table({"eval/loss": results[f"eval/loss/variant_{index}"]}).splitlines()[1]
      assert block[0].split() == ["metric", "eval"] and loss_row.split() in [line.split() for line in block], block
  final_line = next(line for line in summary.splitlines() if line.startswith("final: "))
  assert "variant_" not in final_line and "eval/loss=" in final_line
