"""``benchmarks.loop_overhead``: the training runs it times keep their lines (examples, evaluation, summary) out
of the benchmark's output, which is its table alone."""
import math

import pytest

from benchmarks import loop_overhead


@pytest.mark.slow
def test_the_timed_training_run_prints_nothing(capsys):
  from transformer.train.config import set_field
  config = loop_overhead.experiment_config(loop_overhead.SIZES["tiny (d 32, batch 16)"], 20)
  for path, value in {"log_every": 5, "task.num_eval_examples": 4, "eval_batch_size": 4}.items():
    set_field(config, path, value)
  seconds = loop_overhead.loop_seconds_per_step(config)
  printed = capsys.readouterr()
  assert math.isfinite(seconds) and seconds > 0
  assert printed.out == "" and printed.err == "", printed
