"""experiments/stats.py: Welch's t-test of two runs' seeds (the Student t p-value from the regularized incomplete
beta function) checked against closed forms and published values, its one spelling in words, mean ± std over
seeds, and the block bootstrap of a paired MAE difference."""
import math

import numpy as np
import pytest

from experiments import stats


@pytest.mark.parametrize("t, df, expected", [
    (2.0, 4, 0.1161165235),  # t tables: P(|T| >= 2) with 4 degrees of freedom
    (3.0, 2, 1 - 3 / math.sqrt(3 ** 2 + 2)),  # df 2 closed form: 1 - |t| / sqrt(t^2 + 2) = 0.0955
    (-3.0, 2, 1 - 3 / math.sqrt(3 ** 2 + 2)),  # two-sided: the sign does not matter
    (1.7, 1, 1 - 2 / math.pi * math.atan(1.7)),  # df 1 is the Cauchy distribution
    (12.0, 1, 1 - 2 / math.pi * math.atan(12.0)),  # far in the tail
    (1.959963985, 1e7, 0.05),  # many degrees of freedom: the normal's 97.5% quantile
    (0.0, 3.3, 1.0),
])
def test_the_two_sided_p_value_matches_closed_forms_and_tables(t, df, expected):
  assert stats.student_t_two_sided_p(t, df) == pytest.approx(expected, rel=1e-6)


def test_welch_t_test_by_hand_and_its_degenerate_samples():
  # mean 2 (variance 1) against mean 5.5 (variance 3.25): standard error sqrt(1/3 + 3.25/3) = 1.190238.
  t, df, p = stats.welch_t_test([1.0, 2.0, 3.0], [4.0, 5.0, 7.5])
  assert t == pytest.approx(-3.5 / math.sqrt(4.25 / 3))
  assert df == pytest.approx((4.25 / 3) ** 2 / ((1 / 3) ** 2 / 2 + (3.25 / 3) ** 2 / 2))  # 3.1243
  assert p == pytest.approx(0.0575221433, rel=1e-7)  # scipy.stats.ttest_ind(..., equal_var=False)
  assert stats.welch_t_test([1.0, 2.0, 3.0], [4.0, 5.0, 7.5])[2] == stats.welch_t_test([4.0, 5.0, 7.5],
                                                                                       [1.0, 2.0, 3.0])[2]
  assert stats.welch_t_test([1.0, 1.0], [2.0, 2.0])[::2] == (-math.inf, 0.0)  # constant, different means
  t, df, p = stats.welch_t_test([1.0, 1.0], [1.0, 1.0])
  assert math.isnan(t) and math.isnan(df) and p == 1.0
  with pytest.raises(ValueError, match="at least 2 values"):
    stats.welch_t_test([1.0], [1.0, 2.0])
  with pytest.raises(ValueError, match="all finite"):
    stats.welch_t_test([1.0, float("nan")], [1.0, 2.0])
  assert stats.format_p_value(0.0912) == "p = 0.091" and stats.format_p_value(0.0004) == "p < 0.001"


def test_block_bootstrap_shift_is_exact_and_dependence_widens_the_interval():
  rng = np.random.default_rng(0)
  mask = np.ones((2000, 1), bool)
  base = np.abs(rng.normal(size=(2000, 1)))
  shifted = stats.block_bootstrap_difference(base + 2.0, base, mask, block_length=24)
  np.testing.assert_allclose([shifted["difference"][0], shifted["low"][0], shifted["high"][0]], 2.0, atol=1e-12)
  # Errors that drift slowly (AR(1), 0.98 per step): resampling single windows understates the uncertainty.
  drift = np.zeros(2000)
  for hour in range(1, 2000):
    drift[hour] = 0.98 * drift[hour - 1] + rng.normal()
  single = stats.block_bootstrap_difference(drift[:, None], np.zeros((2000, 1)), mask, block_length=1)
  weekly = stats.block_bootstrap_difference(drift[:, None], np.zeros((2000, 1)), mask, block_length=168)
  np.testing.assert_allclose(single["difference"], weekly["difference"], rtol=1e-12)
  assert (weekly["high"] - weekly["low"])[0] > 3 * (single["high"] - single["low"])[0]
  # Unmeasured targets count in neither sum.
  masked = stats.block_bootstrap_difference(np.array([[1.0], [0.0]]), np.zeros((2, 1)), np.array([[True], [False]]),
                                            block_length=1)
  assert masked["difference"][0] == 1.0


def test_welch_in_words_and_mean_std_over_seeds():
  # The samples of test_welch_t_test_by_hand: t = -2.94, 3.1 degrees of freedom, p = 0.058.
  assert stats.welch_text([1.0, 2.0, 3.0], [4.0, 5.0, 7.5]) == "Welch's t = -2.94, 3.1 degrees of freedom, p = 0.058"
  assert stats.welch_text([1.0, 2.0, 3.0], [4.0, 5.0, 7.5], brief=True) == "t = -2.94, df = 3.1, p = 0.058"
  assert stats.mean_std([0.4, 0.5, 0.6]) == "0.500 ± 0.100"
  assert stats.mean_std([12.34], 1) == "12.3"  # one value (a baseline, one seed): no spread to give
  assert stats.mean_std([1.0, float("nan")]) == "1.000 ± 0.000 (1 not finite)"
  assert stats.mean_std([float("nan")]) == "n/a"


def test_block_bootstrap_pools_the_draws_of_its_seeds_and_gives_each_seeds_bounds():
  rng = np.random.default_rng(1)
  errors_a, errors_b = np.abs(rng.normal(size=(300, 2))), np.abs(rng.normal(size=(300, 2)))
  mask = rng.random((300, 2)) > 0.1
  errors_a, errors_b = errors_a * mask, errors_b * mask
  result = stats.block_bootstrap_difference(errors_a, errors_b, mask, block_length=10, resamples=400, seeds=3)
  # By a plain loop: each draw picks 30 blocks of 10 windows with replacement; MAE difference over their targets.
  per_seed = []
  for seed in range(3):
    draws = np.random.default_rng(seed).integers(0, 30, size=(400, 30))
    values = []
    for draw in draws:
      rows = np.concatenate([np.arange(10 * block, 10 * block + 10) for block in draw])
      values.append((errors_a[rows] - errors_b[rows]).sum(0) / mask[rows].sum(0))
    per_seed.append(np.array(values))
  for seed, values in enumerate(per_seed):
    np.testing.assert_allclose([result["lows"][seed], result["highs"][seed]], np.percentile(values, [2.5, 97.5], 0))
  np.testing.assert_allclose([result["low"], result["high"]],
                             np.percentile(np.concatenate(per_seed), [2.5, 97.5], 0))
  single = stats.block_bootstrap_difference(errors_a, errors_b, mask, block_length=10, resamples=400)
  np.testing.assert_allclose([single["low"], single["high"]], [result["lows"][0], result["highs"][0]])
