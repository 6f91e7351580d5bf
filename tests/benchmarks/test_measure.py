"""What the benchmarks measure with (benchmarks/measure.py): timing in turns, the persistent cache switch, the
matmul peaks and the MFU sanity check (the model-FLOP count behind MFU: tests/nn/test_flops.py)."""
import time

import jax
import pytest

from benchmarks import measure
from experiments import record_store


def test_time_interleaved_takes_turns_and_rotates_who_goes_first():
  order = []
  calls = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
  timings = measure.time_interleaved(calls, warmup=1, repeats=3)
  assert order[:3] == ["a", "b", "c"]  # warm-up, one each
  assert order[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # each round starts one later
  assert set(timings) == {"a", "b", "c"} and all(len(t.times) == 3 for t in timings.values())
  assert all(t.minimum <= t.median for t in timings.values())


def test_time_interleaved_budget_is_judged_by_the_first_round_without_warm_up():
  calls_made = []

  def slow():
    calls_made.append(1)
    time.sleep(0.1)

  timing = measure.time_interleaved({"slow": slow}, warmup=0, repeats=50, budget_s=0.25)["slow"]
  assert len(timing.times) == len(calls_made) == 2  # 0.25 s holds two 0.1 s calls, not 50
  fast = measure.time_interleaved({"fast": lambda: None}, warmup=0, repeats=4, budget_s=10.0)["fast"]
  assert len(fast.times) == 4


def test_back_to_back_samples_are_several_calls_reported_per_call():
  calls_made = []

  def call():
    calls_made.append(1)
    time.sleep(0.02)

  timing = measure.time_interleaved({"call": call}, warmup=1, repeats=2, back_to_back=3)["call"]
  assert len(calls_made) == 1 + 2 * 3 and len(timing.times) == 2
  assert 0.02 <= timing.minimum < 0.04  # one call's time, not three


def test_persistent_cache_disabled_only_inside_the_block():
  before = jax.config.jax_enable_compilation_cache
  with pytest.raises(RuntimeError):
    with measure.persistent_cache_disabled():
      assert jax.config.jax_enable_compilation_cache is False
      raise RuntimeError("leaving the block by an error also restores the setting")
  assert jax.config.jax_enable_compilation_cache == before


# ------------------------------------------------------------------------------------------- peaks and MFU

def test_mfu_above_100_percent_of_either_peak_is_a_measurement_error():
  assert measure.mfu_error("x", 0.45, 0.30) is None
  assert measure.mfu_error("x", 0.45, None) is None  # theoretical peak unknown
  assert "measurement error" in measure.mfu_error("x", 1.3, 0.6)
  assert "theoretical" in measure.mfu_error("x", 0.9, 1.2)
  assert measure.mfu_cell(0.45, 0.3) == pytest.approx(45.0)
  assert measure.mfu_cell(1.3, None).startswith("error")


def test_peaks_take_the_higher_measurement_and_divide_by_both():
  peaks = measure.Peaks("bfloat16", (8,), before=100.0, after=200.0, theoretical=1000.0)
  assert peaks.measured == 200.0
  assert peaks.mfu(50.0) == (pytest.approx(0.25), pytest.approx(0.05))
  assert "before the timed steps" in peaks.describe()
  # A theoretical peak below the measured one (a CPU above its reported clock) is wrong, so not used.
  turbo = measure.Peaks("float32", (8,), before=400.0, after=420.0, theoretical=333.0)
  assert turbo.mfu(100.0) == (pytest.approx(100 / 420), None) and "not used" in turbo.describe()


def test_measured_peak_is_the_best_of_sizes_and_repeats(monkeypatch):
  """A scripted clock makes the fastest call known: the middle size, in its middle repeat. The median, the
  first call, the first or the last size would each give another answer."""
  durations = {8: (0.001, 0.0005, 0.002), 16: (0.004, 0.0001, 0.003), 32: (0.01, 0.002, 0.02)}
  readings, now = [], 0.0
  for size in (8, 16, 32):
    for seconds in (1.0,) + durations[size]:  # one untimed warm-up call, then the timed ones
      readings += [now, now + seconds]
      now += seconds
  clock = iter(readings)
  monkeypatch.setattr(measure, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: next(clock))}))
  flops, size = measure.best_matmul_flops((8, 16, 32), "float32", warmup=1, repeats=3)
  assert size == 16
  assert flops == pytest.approx(2 * 16**3 / 0.0001, rel=1e-9)
  assert next(clock, None) is None  # every warm-up and timed call read the clock, no more


def test_cpu_vector_description_names_what_the_peak_is_computed_from():
  assert record_store.cpu_vector_description({"flags": "avx2 fma", "max MHz": "2450"}) == " (AVX2, FMA, 2.45 GHz)"
  assert record_store.cpu_vector_description({}) == ""


def test_cpu_theoretical_peak_from_cpuinfo():
  info = {"flags": "fpu sse2 avx avx2 fma", "max MHz": "2000.0"}
  assert measure.cpu_theoretical_peak("float32", info, cores=2) == 2 * 8 * 2 * 2 * 2e9
  assert measure.cpu_theoretical_peak("float32", {"flags": "avx512f fma", "max MHz": "1000"}, cores=1) == 64e9
  assert measure.cpu_theoretical_peak("float32", {}, cores=2) is None  # unreadable: unknown


def test_gpu_theoretical_peak_by_device_name(monkeypatch):
  class Device:
    platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"
  monkeypatch.setattr(measure.jax, "devices", lambda: [Device()])
  assert measure.theoretical_peak("bfloat16")[0] == 989e12
  Device.device_kind = "NVIDIA H200"
  assert measure.theoretical_peak("bfloat16")[0] == 989e12
  Device.device_kind = "NVIDIA H100 PCIe"
  assert measure.theoretical_peak("bfloat16")[0] == 756e12
  Device.device_kind = "Some New GPU"
  peak, source = measure.theoretical_peak("bfloat16")
  assert peak is None and source.startswith("unknown")
