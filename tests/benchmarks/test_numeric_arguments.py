"""Every benchmark script's numeric flags go through ``common``'s argparse types: a size of 0 or below, or a budget
that is no positive number, is argparse's one error line naming the flag, before anything is measured (was:
``sequence_length --lengths 0`` a ZeroDivisionError, ``decoding --lengths -1`` a traceback after 14 s)."""
import importlib

import pytest

from benchmarks import common


@pytest.mark.parametrize("script, argv, expected", [
    ("sequence_length", ["--lengths", "0"], "argument --lengths: must be an integer >= 1, got 0"),
    ("sequence_length", ["--lengths", "64", "-8"], "argument --lengths: must be an integer >= 1, got -8"),
    ("sequence_length", ["--tokens", "0"], "argument --tokens: must be an integer >= 1, got 0"),
    ("sequence_length", ["--chunk", "-1"], "argument --chunk: must be an integer >= 1, got -1"),
    ("decoding", ["--lengths", "-1"], "argument --lengths: must be an integer >= 1, got -1"),
    ("decoding", ["--batch_sizes", "1", "0"], "argument --batch_sizes: must be an integer >= 1, got 0"),
    ("decoding", ["--beam_size", "0"], "argument --beam_size: must be an integer >= 1, got 0"),
    ("decoding", ["--buckets", "0"], "argument --buckets: must be an integer >= 1, got 0"),
    ("decoding", ["--source_length", "0"], "argument --source_length: must be an integer >= 1, got 0"),
    ("decoding", ["--budget_s", "-5"], "argument --budget_s: must be a number > 0, got '-5'"),
    ("input_pipeline", ["--synthetic_batches", "0"], "argument --synthetic_batches: must be an integer >= 1"),
    ("step_profile", ["--length", "0"], "argument --length: must be an integer >= 1, got 0"),
    ("step_profile", ["--matmul_size", "-2"], "argument --matmul_size: must be an integer >= 1, got -2"),
    ("train_step", ["--length", "-64"], "argument --length: must be an integer >= 1, got -64"),
    ("remat", ["--memory_limit_gib", "0"], "argument --memory_limit_gib: must be a number > 0, got '0'"),
    ("time_to_bleu", ["--eval_reserve_s", "-1"], "argument --eval_reserve_s: must be a number >= 0, got '-1'"),
    ("attention", ["--budget_s", "nan"], "argument --budget_s: must be a number > 0, got 'nan'"),
    ("chunked_attention", ["--time_budget_s", "0"], "argument --time_budget_s: must be a number > 0, got '0'"),
    ("replicas", ["--length", "x"], "argument --length: must be an integer >= 1, got 'x'"),
])
def test_a_bad_number_is_one_usage_error_naming_the_flag(script, argv, expected, capsys):
  with pytest.raises(SystemExit) as raised:
    importlib.import_module(f"benchmarks.{script}").main(["--smoke", *argv])
  assert raised.value.code == 2
  errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
  assert len(errors) == 1 and expected in errors[0], errors


def test_the_number_types_take_what_they_name():
  assert common.positive_int("3") == 3 and common.positive_float("0.5") == 0.5
  assert common.non_negative_float("0") == 0.0
