"""benchmarks/train_step.py times each implementation in a process of its own (``--isolate``): the command of
each process, the merge of their measurements, and the table saying which mode timed the rows."""
import json
import math
import subprocess
import sys

import pytest

from benchmarks import train_step


def test_a_groups_process_gets_the_runs_flags_less_where_the_parent_writes():
  argv = ["--configs", "transformer_base", "--output_dir", "/tmp/page", "--batch", "16", "32", "--isolate",
          "--time_budget_s", "300", "--torch_compile", "--update_committed"]
  command = train_step.group_command(argv, "pytorch", "/tmp/m/pytorch.json", 120.0)
  assert command == [sys.executable, "-m", "benchmarks.train_step", "--configs", "transformer_base", "--batch", "16",
                     "32", "--torch_compile", "--no_isolate", "--only=pytorch",
                     "--measurements_out=/tmp/m/pytorch.json", "--time_budget_s=120"]


def _fake_processes(monkeypatch, failing=(), option_rows=()):
  """``subprocess.run`` of train_step replaced: each group's process writes one row (ours 2 ms, flax-stock 3 ms)
  unless it is in ``failing``, ours' process also one per name in ``option_rows``; returns the commands run."""
  commands = []

  def run(command, cwd=None):
    commands.append(command)
    group = next(a.partition("=")[2] for a in command if a.startswith("--only="))
    path = next(a.partition("=")[2] for a in command if a.startswith("--measurements_out="))
    if group in failing:
      return subprocess.CompletedProcess(command, 1)
    names = [group, *option_rows] if group == "ours" else [group]
    rows = [dict(variant="transformer_small", batch=2, implementation=name, seconds=0.002 if group == "ours" else 0.003,
                 params=23552, compile=1.0, xla_flops=1e6) for name in names]
    with open(path, "w") as f:
      json.dump({"rows": rows, "notes": [f"{group} measured"]}, f)
    return subprocess.CompletedProcess(command, 0)

  monkeypatch.setattr(train_step.subprocess, "run", run)
  return commands


def test_isolate_runs_each_implementation_in_its_own_process_and_merges_their_rows(monkeypatch, capsys):
  commands = _fake_processes(monkeypatch)
  report = train_step.main(["--smoke", "--isolate", "--no_torch", "--cpu_option_rows=none"])
  capsys.readouterr()
  assert [command[-2:] for command in commands] == [
      ["--only=ours", f"--measurements_out={commands[0][-1].partition('=')[2]}"],
      ["--only=flax-stock", f"--measurements_out={commands[1][-1].partition('=')[2]}"]]
  assert all(command[3:7] == ["--smoke", "--no_torch", "--cpu_option_rows=none", "--no_isolate"]
             for command in commands)
  assert [(row[2], row[-1]) for row in report.rows] == [("ours", "own process"), ("flax-stock", "own process")]
  assert report.ratios["transformer_small ours / flax-stock tokens/s"] == pytest.approx(1.5)
  assert "ours measured" in report.notes and "flax-stock measured" in report.notes
  assert any(note.startswith("Each implementation timed in its own process") for note in report.notes)


def test_every_option_row_has_its_place_in_the_table(monkeypatch, capsys):
  """A GPU run's "ours, no command buffers" row once crashed the table after every step had been timed."""
  option_rows = [*train_step.CPU_OPTION_ROWS, *train_step.GPU_OPTION_ROWS]
  _fake_processes(monkeypatch, option_rows=option_rows)
  report = train_step.main(["--smoke", "--isolate", "--no_torch", "--cpu_option_rows=none"])
  capsys.readouterr()
  assert [row[2] for row in report.rows] == ["ours", "flax-stock", *option_rows]


def test_a_reference_whose_process_fails_is_a_note_and_ours_failing_is_an_error(monkeypatch, capsys):
  _fake_processes(monkeypatch, failing=("flax-stock",))
  report = train_step.main(["--smoke", "--isolate", "--no_torch", "--cpu_option_rows=none"])
  assert [row[2] for row in report.rows] == ["ours"]
  assert "flax-stock left out: its process failed (exit 1)." in report.notes
  _fake_processes(monkeypatch, failing=("ours",))
  with pytest.raises(RuntimeError, match="the process measuring ours failed"):
    train_step.main(["--smoke", "--isolate", "--no_torch", "--cpu_option_rows=none"])
  capsys.readouterr()


@pytest.mark.slow
def test_isolated_smoke_run_times_ours_and_flax_stock_in_real_processes(capsys):
  report = train_step.main(["--smoke", "--no_torch", "--cpu_option_rows=none", "--isolate"])
  printed = capsys.readouterr().out
  assert "--- ours: in its own process" in printed and "--- flax-stock: in its own process" in printed
  assert [(row[2], row[-1]) for row in report.rows] == [("ours", "own process"), ("flax-stock", "own process")]
  assert all(math.isfinite(value) for value in report.ratios.values())


def test_a_batch_past_the_devices_memory_ends_its_configs_sizes_with_a_note(monkeypatch):
  """Ours at a batch the device cannot hold (XLA's RESOURCE_EXHAUSTED) leaves the rows of the smaller batches and
  goes on to the next config; at the first batch, or failing otherwise, it is an error."""
  import argparse

  import jax

  failure = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 9.00GiB."

  def measure_cell(args, groups, option_rows, config, model_config, ours_model, batch, measurements):
    if len(batch["source"]) > 4:
      raise jax.errors.JaxRuntimeError(failure)
    return {"ours": dict(seconds=0.002, params=1, compile=1.0, xla_flops=1e6)}
  monkeypatch.setattr(train_step, "measure_cell", measure_cell)
  args = argparse.Namespace(smoke=False, batch=[4, 8, 16], length=8, configs=["transformer_small", "transformer_big"],
                            no_dropout=False, dtype="float32", time_budget_s=None)
  measurements = train_step.measure_in_process(args, ["ours"], {})
  assert [(row["variant"], row["batch"]) for row in measurements.rows] == [("transformer_small", 4),
                                                                          ("transformer_big", 4)]
  assert [note.split(" (")[0] for note in measurements.notes] == [
      f"{variant}: batch sizes [8, 16] not run: batch 8 ran out of device memory"
      for variant in ("transformer_small", "transformer_big")]
  args.batch = [8, 4]
  with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):
    train_step.measure_in_process(args, ["ours"], {})
  failure, args.batch = "INTERNAL: a kernel failed", [4, 8]
  with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
    train_step.measure_in_process(args, ["ours"], {})
