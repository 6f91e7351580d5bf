"""``benchmarks/attention.py`` refuses sizes and dtypes it cannot measure with argparse's one error line, before
any measurement (``--lengths 0`` divided by zero, ``--dtypes float8`` failed deep inside JAX)."""
import pytest

from benchmarks import attention


@pytest.mark.parametrize("argv, expected", [
    (["--lengths", "0"], "argument --lengths: must be an integer >= 1, got 0"),
    (["--lengths", "128", "-8"], "argument --lengths: must be an integer >= 1, got -8"),
    (["--tokens", "0"], "argument --tokens: must be an integer >= 1, got 0"),
    (["--dtypes", "float8"], "argument --dtypes: invalid choice: 'float8'"),
])
def test_bad_sizes_and_dtypes_are_usage_errors(argv, expected, capsys):
  with pytest.raises(SystemExit) as raised:
    attention.main(["--smoke", *argv])
  assert raised.value.code == 2
  errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
  assert len(errors) == 1 and expected in errors[0]
