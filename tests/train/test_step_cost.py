"""The training log names the step's cost (transformer/train/writers.py ``StepCost``): parameters and model FLOPs
per step at the start, TFLOP/s per device in each log line, and MFU against the device's peak where it is known."""
import re

import jax
import numpy as np
import pytest

from transformer.nn import ModelConfig
from transformer.nn.config import transformer_flops
from transformer.train.writers import StepCost, batch_shapes, device_peak, log_line


@pytest.mark.parametrize("device_kind,dtype,peak,name", [
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989e12, "H100"),  # SXM
    ("NVIDIA H100 PCIe", "bfloat16", 756e12, "H100 PCIe"),
    ("NVIDIA H200", "bfloat16", 989e12, "H200"),
    ("NVIDIA A100-SXM4-80GB", "bfloat16", 312e12, "A100"),
    ("Tesla V100-SXM2-16GB", "bfloat16", None, "V100"),  # no bfloat16 tensor cores: no MFU
    ("TPU v4", "bfloat16", 275e12, "TPU v4"),
    ("TPU v5 lite", "bfloat16", 197e12, "TPU v5 lite"),  # v5e, before v5p's "TPU v5"
    ("TPU v5", "bfloat16", 459e12, "TPU v5"),
    ("cpu", "float32", None, ""),
])
def test_the_peak_of_common_accelerators_by_device_kind(device_kind, dtype, peak, name):
  assert device_peak(device_kind, dtype) == (peak, name)


def test_tflops_per_device_and_mfu_from_a_windows_flops():
  config = ModelConfig(vocab_size=100, d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1)
  h100 = StepCost("transformer", config, num_params=1000, replicas=1, devices=8, peak=989e12, peak_name="H100")
  metrics = h100.log_metrics(flops=8 * 989e12 * 0.4 * 2.0, seconds=2.0)  # 8 devices at 40% for 2 s
  assert metrics == pytest.approx({"train/tflops_per_device": 989 * 0.4, "train/mfu": 0.4})
  cpu = StepCost("transformer", config, num_params=1000)
  assert set(cpu.log_metrics(flops=1e9, seconds=1.0)) == {"train/tflops_per_device"}  # no peak: no MFU
  assert cpu.log_metrics(flops=0.0, seconds=1.0) == {}  # a model it does not count
  batch = {"source": np.ones((4, 7), np.int32), "target": np.ones((4, 5), np.int32)}
  assert batch_shapes("transformer", batch) == (4, 7, 5)
  assert batch_shapes("lm", {"tokens": np.ones((3, 9))}) == (3, 0, 9)
  assert batch_shapes("rnn", batch) is None
  vmapped = StepCost("transformer", config, num_params=1000, replicas=3)  # 3 seeds each compute the batch
  assert vmapped.flops(batch) == 3 * transformer_flops(config, 4, 7, 5)["total"]


def test_a_log_line_names_the_tflops_per_device_and_the_mfu():
  metrics = {"train/loss": 1.0, "train/tokens_per_second": 10.0, "train/steps_per_second": 0.5,
             "train/tflops_per_device": 395.6, "train/mfu": 0.4}
  assert log_line(100, 1000, metrics, 2.0) == ("step 100/1000 (10%): loss 1.0000, 10 tokens/s, 0.50 steps/s, "
                                               "396 TFLOP/s per device, MFU 40.0%, ETA 0h30m")


@pytest.mark.slow
def test_a_run_logs_its_parameters_flops_per_step_and_tflops_per_device(make_config, tmp_path, capsys):
  from transformer.train import run  # pylint: disable=import-outside-toplevel
  from transformer.train.config import build_task, validate_config  # pylint: disable=import-outside-toplevel
  from transformer.train.workdir import is_timing, read_metrics  # pylint: disable=import-outside-toplevel
  output = run(make_config(num_train_steps=10, eval_every=10, checkpoint_every=10, quiet=False), str(tmp_path))
  printed = capsys.readouterr().out
  num_params = sum(leaf.size for leaf in jax.tree.leaves(output.state.params))
  start = re.search(r"parameters ([\d,]+); model FLOPs per step ([\d.]+) (\w)FLOP at the first batch's shape "
                    r"\((\d+)x(\d+) \+ (\d+)x(\d+);", printed)
  assert start and int(start[1].replace(",", "")) == num_params, printed
  rows, source, _, target = map(int, start.groups()[3:])
  scale = {"M": 1e6, "G": 1e9, "T": 1e12}[start[3]]
  model_config = build_task(validate_config(make_config())).model_config()
  expected = transformer_flops(model_config, rows, source, target)["total"]
  assert float(start[2]) * scale == pytest.approx(expected, rel=5e-3)  # printed to 3 significant digits
  lines = [line for line in printed.splitlines() if line.startswith("step ")]
  assert lines and all("TFLOP/s per device" in line and "MFU" not in line for line in lines)  # CPU: no peak
  logged = [record for record in read_metrics(str(tmp_path)) if "train/loss" in record]
  assert all(record["train/tflops_per_device"] > 0 and "train/mfu" not in record for record in logged)
  assert is_timing("train/tflops_per_device") and is_timing("train/mfu")  # machine-dependent, as tokens/s
