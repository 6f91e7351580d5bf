"""transformer/plot.py: a run's metrics.jsonl drawn to a PNG (a grid of panels), also from an installed package
without the repository (the end-of-run hint), and clear errors for a wrong workdir or metric."""
import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from transformer import plot

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_run(workdir, records):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(record) + "\n" for record in records)


RECORDS = [{"step": 100, "train/loss": 2.0}, {"step": 200, "train/loss": 1.0},
           {"step": 200, "eval/exact_match": 0.5, "eval/exact_match/seed_0": 0.5, "eval/loss": 1.1}]


def test_default_metrics_are_the_loss_and_each_eval_metric_without_seed_copies():
  assert plot.default_metrics({"run": RECORDS}) == ["train/loss", "eval/exact_match", "eval/loss"]


def test_a_sweeps_variants_are_lines_of_the_same_panels(tmp_path, monkeypatch):
  drawn = {}
  monkeypatch.setattr(plot, "plot_curves",
                      lambda runs, metrics, path, title: drawn.update(runs=runs, metrics=metrics))
  _write_run(tmp_path / "sweep", [
      {"step": 10, "train/loss": 1.5, "train/loss/variant_0": 1.0, "train/loss/variant_1": 2.0,
       "train/loss/seed_0": 1.0},
      {"step": 20, "eval/bleu": 3.0, "eval/bleu/variant_0": 4.0, "eval/bleu/variant_1": 2.0}])
  plot.plot_runs([str(tmp_path / "sweep")])
  assert drawn["metrics"] == ["train/loss", "eval/bleu"]
  assert drawn["runs"] == {"sweep variant_0": [{"step": 10, "train/loss": 1.0}, {"step": 20, "eval/bleu": 4.0}],
                           "sweep variant_1": [{"step": 10, "train/loss": 2.0}, {"step": 20, "eval/bleu": 2.0}]}


def _png_size(path) -> tuple[int, int]:
  """``(width, height)`` in pixels, from the PNG's header chunk."""
  with open(path, "rb") as f:
    header = f.read(24)
  assert header[:8] == b"\x89PNG\r\n\x1a\n"
  return struct.unpack(">II", header[16:24])


def test_panels_wrap_into_rows_of_at_most_four():
  assert [plot.panel_grid(count) for count in (1, 2, 4, 5, 20)] == [(1, 1), (1, 2), (1, 4), (2, 4), (5, 4)]


def test_many_metrics_are_drawn_as_a_grid(tmp_path):
  """A forecasting run logs ~20 metrics (per-horizon errors): a grid readable at a glance, not one long row."""
  workdir = str(tmp_path / "run")
  horizons = [f"eval/mae_{hours}h" for hours in range(19)]
  _write_run(workdir, [{"step": 100, "train/loss": 2.0}, {"step": 100, **dict.fromkeys(horizons, 5.0)}])
  width, height = _png_size(plot.plot_runs([workdir]))
  assert width <= 4 * 5 * 110 and height >= 5 * 3.6 * 110 * 0.9  # 4 panels of 5 x 3.6 inches a row, 5 rows


def test_the_command_line_takes_workdirs_a_metric_list_and_an_output(tmp_path, capsys):
  workdir, output = str(tmp_path / "run"), str(tmp_path / "compare.png")
  _write_run(workdir, RECORDS)
  plot.main([workdir, "--metrics=train/loss,eval/loss", f"--output={output}"])
  assert f"wrote {output}" in capsys.readouterr().out
  assert _png_size(output)[0] == 2 * 5 * 110  # two panels: the list was split at the comma
  with pytest.raises(SystemExit):  # no WORKDIR: a usage error
    plot.main([])
  assert "the following arguments are required: WORKDIR" in capsys.readouterr().err


INSTALLED_RUN = """
from transformer.train import base_config, run
config = base_config("transformer")
config.task.name = "synthetic"
config.model.update(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1)
config.update(batch_size=8, num_train_steps=4, log_every=2, eval_every=4, checkpoint_every=4, quiet=True,
              tensorboard=False)
run(config, "run")
"""


@pytest.mark.slow
def test_a_training_and_its_curves_hint_work_with_the_package_alone(tmp_path):
  """As after a non-editable install: only ``transformer/`` on the path, run from elsewhere; the end-of-run hint
  names a command that works there (it once named ``<repo>/experiments/plot.py``)."""
  site = tmp_path / "site-packages"
  shutil.copytree(os.path.join(REPO, "transformer"), site / "transformer",
                  ignore=shutil.ignore_patterns("__pycache__"))
  work = tmp_path / "work"
  work.mkdir()
  env = {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
  trained = subprocess.run([sys.executable, "-c", INSTALLED_RUN], cwd=work, env=env, capture_output=True,
                           text=True, timeout=300)
  assert trained.returncode == 0, trained.stderr
  hint = next(line for line in trained.stdout.splitlines() if line.startswith("curves: "))
  command = hint[len("curves: "):].split("  or  ")[0].split()
  assert command[0] == "python" and "experiments" not in hint
  drawn = subprocess.run([sys.executable, *command[1:]], cwd=work, env=env, capture_output=True, text=True,
                         timeout=120)
  assert drawn.returncode == 0, drawn.stderr
  with open(work / "run" / "curves.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_missing_run_or_metric_is_one_clear_line(tmp_path):
  with pytest.raises(SystemExit, match="has no metrics.jsonl"):
    plot.plot_runs([str(tmp_path / "nothing")])
  _write_run(str(tmp_path / "run"), RECORDS)
  with pytest.raises(SystemExit, match="no run logged eval/bleu; logged metrics: eval/exact_match"):
    plot.plot_runs([str(tmp_path / "run")], ["eval/bleu"])
