"""The benchmark helpers whose numbers end up in tables: timing, the FLOP count, the line fit, RESULTS.md sections."""
import os
import time

import jax
import numpy as np
import pytest

from benchmarks import common
from benchmarks.sequence_length import growth_share
from transformer.nn import EncoderDecoder, ModelConfig


def test_encoder_decoder_flops_match_xla_count_of_forward_pass():
  """The analytic matmul count is at most XLA's count of the whole forward pass and within 5% of it (XLA also
  counts the non-matmul FLOPs: softmax, norms, residuals); source and target lengths differ so that cross
  attention is checked too."""
  config = ModelConfig(vocab_size=300, d_model=64, num_heads=4, d_ff=128, num_encoder_layers=2,
                       num_decoder_layers=1, deterministic=True)
  source = np.ones((2, 24), np.int32)
  target = np.ones((2, 16), np.int32)
  model = EncoderDecoder(config)
  params = model.init(jax.random.PRNGKey(0), source, target)
  analysis = jax.jit(model.apply).lower(params, source, target).compile().cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  ours = common.encoder_decoder_flops(config, 2, 24, 16, train=False)
  assert ours["total"] <= analysis["flops"]
  assert ours["total"] == pytest.approx(analysis["flops"], rel=0.05)
  assert common.encoder_decoder_flops(config, 2, 24, 16)["total"] == pytest.approx(3 * ours["total"])


def test_growth_share_is_the_time_above_the_shortest_length():
  shares = growth_share([256, 64, 1024], [2.0, 1.0, 4.0])
  assert shares == [pytest.approx(0.5), 0.0, pytest.approx(0.75)]
  assert growth_share([], []) == []  # no dense step fitted in memory


def test_update_results_replaces_own_section_and_keeps_others_in_question_order(tmp_path):
  path = str(tmp_path / "RESULTS.md")

  def report(script, value):
    return common.Report(script, f"{script} title", ["name", "value"], rows=[["x", value]])

  common.update_results(report("train_step", 1.5), ["--a"], "machine", path)
  common.update_results(report("attention", 2.5), [], "machine", path)
  common.update_results(report("train_step", 3.5), ["--b"], "machine", path)
  text = open(path).read()
  assert text.startswith(common.RESULTS_HEADER)
  assert text.index("attention title") < text.index("train_step title")  # SCRIPTS order
  assert "| x | 3.50 |" in text and "| x | 1.50 |" not in text and "| x | 2.50 |" in text
  assert "`python -m benchmarks.train_step --b`" in text and text.count("<!-- benchmarks.train_step -->") == 1


def test_a_run_narrowed_to_fewer_cores_writes_its_own_section(tmp_path, monkeypatch):
  path = str(tmp_path / "RESULTS.md")
  report = lambda value: common.Report("train_step", "train_step title", ["name", "value"], rows=[["x", value]])
  monkeypatch.setattr(os, "cpu_count", lambda: 2)
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
  common.update_results(report(1.5), [], "all cores", path)
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)  # as under `taskset -c 0`
  assert common.usable_cores() == 1 and "1 of its 2 cores (taskset)" in common.machine_description()
  common.update_results(report(2.5), [], "one core", path)
  text = open(path).read()
  assert "| x | 1.50 |" in text and "| x | 2.50 |" in text
  assert "<!-- benchmarks.train_step.1core -->" in text and "## train_step title on 1 of 2 CPU cores" in text


def test_accelerator_run_writes_its_own_section_beside_the_cpu_one(tmp_path, monkeypatch):
  path = str(tmp_path / "RESULTS.md")

  def report(script, value):
    return common.Report(script, f"{script} title", ["name", "value"], rows=[["x", value]])

  common.update_results(report("train_step", 1.5), [], "cpu machine", path)
  common.update_results(report("decoding", 4.5), [], "cpu machine", path)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  common.update_results(report("train_step", 2.5), ["--dtype=bfloat16"], "gpu machine", path)
  common.update_results(report("attention", 3.5), [], "gpu machine", path)
  common.update_results(report("train_step", 5.5), ["--dtype=bfloat16"], "gpu machine", path)
  text = open(path).read()
  assert "| x | 1.50 |" in text and "| x | 2.50 |" not in text and "| x | 5.50 |" in text  # GPU replaced GPU only
  assert text.count("<!-- benchmarks.train_step.gpu -->") == 1 and "## train_step title on GPU" in text
  # Question order, each script's accelerator section right after its CPU one.
  starts = [text.index(f"<!-- benchmarks.{name} -->") for name in ("attention.gpu", "train_step", "train_step.gpu",
                                                                    "decoding")]
  assert starts == sorted(starts)


def test_time_interleaved_takes_turns_and_rotates_who_goes_first():
  order = []
  calls = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
  timings = common.time_interleaved(calls, warmup=1, repeats=3)
  assert order[:3] == ["a", "b", "c"]  # warm-up, one each
  assert order[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # each round starts one later
  assert set(timings) == {"a", "b", "c"} and all(len(t.times) == 3 for t in timings.values())
  assert all(t.minimum <= t.median for t in timings.values())


def test_time_interleaved_budget_is_judged_by_the_first_round_without_warm_up():
  calls_made = []

  def slow():
    calls_made.append(1)
    time.sleep(0.1)

  timing = common.time_interleaved({"slow": slow}, warmup=0, repeats=50, budget_s=0.25)["slow"]
  assert len(timing.times) == len(calls_made) == 2  # 0.25 s holds two 0.1 s calls, not 50
  fast = common.time_interleaved({"fast": lambda: None}, warmup=0, repeats=4, budget_s=10.0)["fast"]
  assert len(fast.times) == 4


def test_train_step_rejects_a_batch_size_below_one(capsys):
  from benchmarks import train_step

  with pytest.raises(SystemExit):
    train_step.main(["--smoke", "--batch", "0"])
  assert "argument --batch: must be an integer >= 1, got 0" in capsys.readouterr().err


def test_persistent_cache_disabled_only_inside_the_block():
  before = jax.config.jax_enable_compilation_cache
  with pytest.raises(RuntimeError):
    with common.persistent_cache_disabled():
      assert jax.config.jax_enable_compilation_cache is False
      raise RuntimeError("leaving the block by an error also restores the setting")
  assert jax.config.jax_enable_compilation_cache == before
