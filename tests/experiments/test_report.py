"""experiments/report.py, the results library: Welch's t-test of two runs' seeds (the Student t p-value from the
regularized incomplete beta function, no scipy) checked against closed forms and published values; the steps a
page records; the output flags both flag systems share; the block bootstrap of a paired MAE difference."""
import argparse
import dataclasses
import math

import numpy as np
import pytest

from experiments import report


@pytest.mark.parametrize("t, df, expected", [
    (2.0, 4, 0.1161165235),  # t tables: P(|T| >= 2) with 4 degrees of freedom
    (3.0, 2, 1 - 3 / math.sqrt(3 ** 2 + 2)),  # df 2 closed form: 1 - |t| / sqrt(t^2 + 2) = 0.0955
    (-3.0, 2, 1 - 3 / math.sqrt(3 ** 2 + 2)),  # two-sided: the sign does not matter
    (1.7, 1, 1 - 2 / math.pi * math.atan(1.7)),  # df 1 is the Cauchy distribution
    (12.0, 1, 1 - 2 / math.pi * math.atan(12.0)),  # far in the tail (the symmetric branch of the fraction)
    (1.959963985, 1e7, 0.05),  # many degrees of freedom: the normal's 97.5% quantile
    (0.0, 3.3, 1.0),
])
def test_the_two_sided_p_value_matches_closed_forms_and_tables(t, df, expected):
  assert report.student_t_two_sided_p(t, df) == pytest.approx(expected, rel=1e-6)


def test_the_incomplete_beta_is_a_distribution_function():
  assert report.regularized_incomplete_beta(0.3, 1.0, 1.0) == pytest.approx(0.3)  # Beta(1, 1) is uniform
  assert report.regularized_incomplete_beta(0.3, 2.0, 1.0) == pytest.approx(0.09)  # I_x(2, 1) = x^2
  assert report.regularized_incomplete_beta(0.0, 2.0, 3.0) == 0.0
  assert report.regularized_incomplete_beta(1.0, 2.0, 3.0) == 1.0
  with pytest.raises(ValueError, match="outside"):
    report.regularized_incomplete_beta(1.5, 2.0, 3.0)


def test_welch_t_test_by_hand_and_its_degenerate_samples():
  # mean 2 (variance 1) against mean 5.5 (variance 3.25): standard error sqrt(1/3 + 3.25/3) = 1.190238.
  t, df, p = report.welch_t_test([1.0, 2.0, 3.0], [4.0, 5.0, 7.5])
  assert t == pytest.approx(-3.5 / math.sqrt(4.25 / 3))
  assert df == pytest.approx((4.25 / 3) ** 2 / ((1 / 3) ** 2 / 2 + (3.25 / 3) ** 2 / 2))  # 3.1243
  assert p == pytest.approx(0.0575221433, rel=1e-7)  # scipy.stats.ttest_ind(..., equal_var=False)
  assert report.welch_t_test([1.0, 2.0, 3.0], [4.0, 5.0, 7.5])[2] == report.welch_t_test([4.0, 5.0, 7.5],
                                                                                        [1.0, 2.0, 3.0])[2]
  assert report.welch_t_test([1.0, 1.0], [2.0, 2.0])[::2] == (-math.inf, 0.0)  # constant, different means
  t, df, p = report.welch_t_test([1.0, 1.0], [1.0, 1.0])
  assert math.isnan(t) and math.isnan(df) and p == 1.0
  with pytest.raises(ValueError, match="at least 2 values"):
    report.welch_t_test([1.0], [1.0, 2.0])
  with pytest.raises(ValueError, match="all finite"):
    report.welch_t_test([1.0, float("nan")], [1.0, 2.0])
  assert report.format_p_value(0.0912) == "p = 0.091" and report.format_p_value(0.0004) == "p < 0.001"


def test_recorded_steps_reads_the_steps_of_each_sections_table(tmp_path):
  assert report.recorded_steps(str(tmp_path), "run") == {}  # no page yet
  page = "\n\n".join([
      "# Page", report.markdown_table(["run", "steps"], [["a", 300]]),
      "## Other", report.markdown_table(["run", "steps", "BLEU"], [["b", 40], ["c", 1200]]),
      # a section's later table with the same first column and no steps (attention statistics) is not read
      report.markdown_table(["run", "entropy"], [["d", 0.5]]),
      "## Chosen", report.markdown_table(["variant", "chosen step"], [["e", "900 of 1500 (stopped early)"]])])
  report.write_page(str(tmp_path), page)
  assert report.recorded_steps(str(tmp_path), "run") == {"a": 300, "b": 40, "c": 1200}
  assert report.recorded_steps(str(tmp_path), "variant", "chosen step",
                               lambda cell: int(cell.split(" of ")[1].split()[0])) == {"e": 1500}


def test_the_output_flags_are_the_same_in_both_flag_systems():
  parser = argparse.ArgumentParser()
  report.add_output_arguments(parser, "a folder of the script's")
  args = parser.parse_args(["--output_dir=o", "--update_committed", "--force"])
  assert set(vars(args)) == {field.name for field in dataclasses.fields(report.OutputFlags)}  # absl's names
  benchmarks = argparse.ArgumentParser()  # sections replaced by every run: no rows to force
  report.add_output_arguments(benchmarks, "runs/benchmarks-<time>/", force=False)
  assert "--force" not in benchmarks.format_help() and "a run of at least" not in benchmarks.format_help()


def test_block_bootstrap_shift_is_exact_and_dependence_widens_the_interval():
  rng = np.random.default_rng(0)
  mask = np.ones((2000, 1), bool)
  base = np.abs(rng.normal(size=(2000, 1)))
  shifted = report.block_bootstrap_difference(base + 2.0, base, mask, block_length=24)
  np.testing.assert_allclose([shifted["difference"][0], shifted["low"][0], shifted["high"][0]], 2.0, atol=1e-12)
  # Errors that drift slowly (AR(1), 0.98 per step): resampling single windows understates the uncertainty.
  drift = np.zeros(2000)
  for hour in range(1, 2000):
    drift[hour] = 0.98 * drift[hour - 1] + rng.normal()
  single = report.block_bootstrap_difference(drift[:, None], np.zeros((2000, 1)), mask, block_length=1)
  weekly = report.block_bootstrap_difference(drift[:, None], np.zeros((2000, 1)), mask, block_length=168)
  np.testing.assert_allclose(single["difference"], weekly["difference"], rtol=1e-12)
  assert (weekly["high"] - weekly["low"])[0] > 3 * (single["high"] - single["low"])[0]
  # Unmeasured targets count in neither sum.
  masked = report.block_bootstrap_difference(np.array([[1.0], [0.0]]), np.zeros((2, 1)), np.array([[True], [False]]),
                                              block_length=1)
  assert masked["difference"][0] == 1.0
