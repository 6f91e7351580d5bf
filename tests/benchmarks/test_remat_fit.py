"""remat.py --fit_search: the largest batch that fits per policy. The search against hand-made memory models
(a plan that is right, one that promises more than the device holds, one that is never consulted), what counts
as out of memory, the time budget, and one smoke run of the real step."""
import argparse
import math
import time
import types

import jax
import pytest

from benchmarks import measure, remat

OUT_OF_MEMORY = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes."


def linear_probe(fits_up_to: int, limit_bytes: int | None = None, fixed: int = 1000, per_example: int = 10,
                 seconds: float = 0.0):
  """A probe of a step planned at ``fixed + per_example * batch`` bytes that really fits up to ``fits_up_to``;
  with ``limit_bytes``, a plan above it fails as --memory_limit_gib judges."""
  batches = []

  def probe(policy, batch):
    batches.append(batch)
    peak = fixed + per_example * batch
    if limit_bytes is not None and peak > limit_bytes:
      return remat.Probe(batch, False, peak, fixed, "planned peak over the limit", seconds)
    fits = batch <= fits_up_to
    return remat.Probe(batch, fits, peak, fixed, "ran one step" if fits else "out of memory running", seconds)
  probe.batches = batches
  return probe


def run_search(probe, start=8, resolution=8, limit=None, policies=("none",), budget=None):
  args = argparse.Namespace(time_budget_s=budget, started=time.monotonic())
  searches = {policy: remat.FitSearch(start, resolution, limit) for policy in policies}
  return searches, remat.search_fits(args, searches, probe)


@pytest.mark.parametrize("start", [8, 64, 1000, 4096])
@pytest.mark.parametrize("limit", [None, 1000 + 10 * 1000, 1000 + 10 * 5000])
def test_the_search_ends_at_the_largest_fit_whatever_the_plan_says(start, limit):
  """The real boundary is batch 1,000 (a multiple of 8). The plan is right (limit at 1,000), promises more
  (limit at 5,000: every guess too large) or is not there (no limit): the search ends with 1,000 fitting and
  1,008 failing, within the probes halving needs."""
  probe = linear_probe(fits_up_to=1000)
  searches, unfinished = run_search(probe, start=start, limit=limit)
  search = searches["none"]
  assert not unfinished and search.done()
  assert (search.largest.batch, search.smallest_failed.batch) == (1000, 1008)
  assert len(probe.batches) == len(set(probe.batches)), "no batch is tried twice"
  assert len(probe.batches) <= 2 * math.ceil(math.log2(4096 * 2 / 8)) + 2
  if limit == 1000 + 10 * 1000:  # a plan that is right: the start, the batch past the guess, the guess
    assert len(probe.batches) <= 3


def test_a_plan_that_promises_a_little_more_than_the_device_holds_costs_two_probes_more():
  """A GPU's allocator loses some of its limit to fragmentation: the plan puts the boundary at 2,400 where the
  device holds 2,300. After the guess fails, the search steps down from it, not back to the middle."""
  probe = linear_probe(fits_up_to=2300, fixed=10**6, per_example=30_000)
  searches, _ = run_search(probe, start=256, resolution=64, limit=10**6 + 30_000 * 2400)
  assert probe.batches == [256, 2432, 2368, 2304, 2240]
  assert (searches["none"].largest.batch, searches["none"].smallest_failed.batch) == (2240, 2304)


def test_a_plan_over_the_limit_fails_and_the_largest_fit_is_planned_under_it():
  """--memory_limit_gib's semantics: the largest batch's plan is at most the limit, the next multiple's above."""
  limit = 1000 + 10 * 123
  searches, _ = run_search(linear_probe(fits_up_to=10**9, limit_bytes=limit), start=2, resolution=4, limit=limit)
  search = searches["none"]
  assert search.largest.peak <= limit < search.smallest_failed.peak
  assert search.smallest_failed.batch == search.largest.batch + 4 == 124


def test_a_failed_start_halves_until_a_batch_fits():
  probe = linear_probe(fits_up_to=20)
  searches, _ = run_search(probe, start=4096, resolution=8)
  assert probe.batches[:3] == [4096, 2048, 1024]
  assert (searches["none"].largest.batch, searches["none"].smallest_failed.batch) == (16, 24)


def test_nothing_fits_ends_at_the_resolution():
  searches, _ = run_search(linear_probe(fits_up_to=3), start=64, resolution=8)
  assert searches["none"].largest is None and searches["none"].smallest_failed.batch == 8


def test_policies_take_turns_and_a_spent_budget_leaves_each_a_bracket():
  """Each probe takes 0.4 s against a 1.5 s budget: after one probe per policy the next would end past the
  budget. Every policy has had its probe, and its row says the bracket so far."""
  probe = linear_probe(fits_up_to=1000, seconds=0.4)

  def slow_probe(policy, batch):
    time.sleep(0.4)
    return probe(policy, batch)
  searches, unfinished = run_search(slow_probe, start=256, policies=("none", "dots", "full"), budget=1.5)
  assert unfinished == ["none", "dots", "full"]
  assert probe.batches == [256, 256, 256]
  assert all(search.largest.batch == 256 and search.smallest_failed is None for search in searches.values())


def test_out_of_memory_is_xla_resource_exhausted_and_nothing_else():
  assert measure.is_out_of_memory(jax.errors.JaxRuntimeError(OUT_OF_MEMORY))
  assert measure.is_out_of_memory(jax.errors.JaxRuntimeError("Resource exhausted: Failed to allocate request"))
  assert not measure.is_out_of_memory(jax.errors.JaxRuntimeError("INTERNAL: ptxas exited with non-zero error"))
  assert not measure.is_out_of_memory(MemoryError("out of memory"))  # the host's, not XLA's device memory


class FakeStep:
  """A compiled step as ``remat.compile_one`` returns it, whose one run raises ``error`` (if given)."""

  def __init__(self, batch, error=None):
    analysis = types.SimpleNamespace(argument_size_in_bytes=100, output_size_in_bytes=100,
                                     temp_size_in_bytes=10 * batch, alias_size_in_bytes=100)
    self.compiled = types.SimpleNamespace(memory_analysis=lambda: analysis)
    self.state, self.error = jax.numpy.zeros(2), error

  def __call__(self):
    if self.error:
      raise self.error
    return {}


def test_a_probe_counts_xla_out_of_memory_as_a_failure_and_raises_any_other_error(monkeypatch):
  """The accelerator's path (no planned limit), on the CPU: out of memory compiling or running is a failed
  batch; another XLA error is a real one and propagates."""
  args = argparse.Namespace()

  def compile_one(args, batch, policy, optimizer):
    if batch > 64:
      raise jax.errors.JaxRuntimeError(OUT_OF_MEMORY)
    return FakeStep(batch, jax.errors.JaxRuntimeError(OUT_OF_MEMORY) if batch > 32 else None)
  monkeypatch.setattr(remat, "compile_one", compile_one)
  assert remat.probe_batch(args, "none", 32, None).fits
  running, compiling = remat.probe_batch(args, "none", 48, None), remat.probe_batch(args, "none", 128, None)
  assert (running.fits, running.outcome, running.peak) == (False, "out of memory running", 100 + 10 * 48)
  assert (compiling.fits, compiling.outcome, compiling.peak) == (False, "out of memory compiling", None)
  planned = remat.probe_batch(args, "none", 32, planned_limit=200)
  assert (planned.fits, planned.outcome) == (False, "planned peak over the limit")

  monkeypatch.setattr(remat, "compile_one", lambda *_: FakeStep(8, jax.errors.JaxRuntimeError("INTERNAL: bad")))
  with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
    remat.probe_batch(args, "none", 8, None)


@pytest.mark.slow
def test_smoke_fit_search_finds_the_largest_batch_planned_under_the_limit(capsys):
  """The real step at smoke size against --smoke's 2 MiB planned limit: the largest batch found is planned under
  it and the next multiple of the resolution over it; its own section, not the timings'."""
  report = remat.main(["--smoke", "--fit_search"])
  capsys.readouterr()
  assert report.name == "remat_fit" and report.script == "remat"
  (row,) = report.rows
  policy, largest, largest_mib, failed, failed_mib, outcome = row[:6]
  assert policy == "none" and largest >= 4 and failed == largest + 4
  assert largest_mib <= 2.0 < failed_mib and outcome == "planned peak over the limit"
  assert report.ratios == {"none largest batch": 1.0}
