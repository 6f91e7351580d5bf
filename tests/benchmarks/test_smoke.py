"""Every benchmark script runs at ``--smoke`` size: it prints its table, its ratios are finite numbers, and it
leaves ``benchmarks/RESULTS.md`` alone (only full-size runs write it).

The scripts run in this process (one JAX start-up for all), each through its ``main(argv)``.
"""
import importlib
import math
import os

import pytest

from benchmarks import common


def _results_snapshot():
  if not os.path.exists(common.RESULTS_PATH):
    return None
  with open(common.RESULTS_PATH) as f:
    return f.read()


# The suite runs the others in subprocesses, and time to BLEU needs data: tests/benchmarks/test_suite.py.
IN_PROCESS = [script for script in common.SCRIPTS if script not in ("suite", "time_to_bleu")]


@pytest.mark.slow
@pytest.mark.parametrize("script", IN_PROCESS)
def test_smoke_run_prints_table_with_finite_ratios(script, capsys):
  before = _results_snapshot()
  report = importlib.import_module(f"benchmarks.{script}").main(["--smoke"])
  printed = capsys.readouterr().out

  assert report.script == script
  assert f"## {report.title}" in printed
  assert "| " + " | ".join(report.header) + " |" in printed
  assert report.rows and all(len(row) == len(report.header) for row in report.rows)
  assert report.ratios, "a benchmark must report at least one ours / reference ratio"
  for name, value in report.ratios.items():
    assert isinstance(value, float) and math.isfinite(value), f"{script}: ratio {name!r} is {value!r}"
  assert _results_snapshot() == before, "--smoke must not write benchmarks/RESULTS.md"


@pytest.mark.slow
def test_train_step_compiles_a_row_for_every_cpu_option(capsys):
  """Every XLA:CPU option benchmarks/FINDINGS.md measured is still accepted by this jaxlib and times a row."""
  from benchmarks import train_step
  report = train_step.main(["--smoke", "--no_torch", "--no_flax_stock", "--cpu_option_rows=all"])
  capsys.readouterr()
  implementations = [row[2] for row in report.rows]
  assert implementations == ["ours", *train_step.CPU_OPTION_ROWS]
  assert not [note for note in report.notes if "skipped: XLA rejected" in note]
  assert all(math.isfinite(row[4]) and row[4] > 0 for row in report.rows)  # step ms


def test_the_big_config_is_the_papers_big_model_for_ours_flax_stock_and_the_flop_count():
  """``--configs transformer_big``: Vaswani et al.'s Transformer (big) at base's vocabulary, the same parameter
  count for ours and flax-stock (shapes only, nothing initialised), and MFU's FLOPs counted from its sizes."""
  import jax
  import numpy as np

  from benchmarks import train_step
  from transformer.nn.config import transformer_flops
  from transformer.train.config import build_task
  config, model_config = train_step.experiment_config("transformer_big")
  _, base = train_step.experiment_config("transformer_base")
  assert (model_config.d_model, model_config.num_heads, model_config.d_ff, model_config.num_encoder_layers,
          model_config.num_decoder_layers, model_config.dropout_rate, model_config.vocab_size) == (
              1024, 16, 4096, 6, 6, 0.3, 32000)
  batch = train_step.random_batch(2, 8, 8, model_config.vocab_size)
  counts = {}
  for name, model in {"ours": build_task(config).build_model(model_config),
                      "flax-stock": train_step.FlaxStockTransformer(model_config)}.items():
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), batch["source"], batch["target"]))
    counts[name] = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes["params"]))
  assert counts["ours"] == counts["flax-stock"] and 200e6 < counts["ours"] < 220e6, counts
  ratio = transformer_flops(model_config, 1, 64, 64)["total"] / transformer_flops(base, 1, 64, 64)["total"]
  assert 3.0 < ratio < 4.0  # layers 4x the matmul work, the output projection 2x


@pytest.mark.slow
def test_train_step_times_the_big_config_at_smoke_size(capsys):
  """The big config's code path (config, step, FLOPs, MFU) end to end, shrunk as the others by ``--smoke``."""
  from benchmarks import train_step
  report = train_step.main(["--smoke", "--configs", "transformer_big", "--no_torch", "--no_flax_stock",
                            "--cpu_option_rows=none"])
  capsys.readouterr()
  assert [(row[0], row[2]) for row in report.rows] == [("transformer_big (smoke size)", "ours")]
  assert all(math.isfinite(value) and value > 0 for value in report.rows[0][3:8])  # params, ms, tokens/s, GFLOP
  assert math.isfinite(report.ratios["transformer_big MFU"])


@pytest.mark.slow
def test_remat_says_not_run_when_the_fit_batch_was_not_compiled(monkeypatch, capsys):
  """A budget spent before the --fit_batch steps compile leaves the fit target unjudged, never "not met"."""
  from benchmarks import remat
  compile_policies, calls = remat.compile_policies, []

  def budget_spent_after_the_first_batch(args, batch_size, policies):
    calls.append(batch_size)
    return compile_policies(args, batch_size, policies) if len(calls) == 1 else {}
  monkeypatch.setattr(remat, "compile_policies", budget_spent_after_the_first_batch)
  report = remat.main(["--smoke", "--time_budget_s", "600"])
  capsys.readouterr()
  target = next(note for note in report.notes if note.startswith("Target"))
  assert len(calls) == 2 and target.endswith(": not run (not both compiled).")
  assert any("none, full not compiled" in note or "full, none not compiled" in note for note in report.notes)
