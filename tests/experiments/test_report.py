"""experiments/report.py's statistics: Welch's t-test of two runs' seeds, with the Student t p-value computed
from the regularized incomplete beta function (no scipy), checked against closed forms and published values."""
import math

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
