"""The PM2.5 results page: test metrics of a run's seeds and of persistence, recomputed independently."""
import os

import numpy as np
import pytest

from experiments import beijing_pm25_results
from tests.tasks.test_forecasting import numpy_metrics, small_config
from transformer import load
from transformer.errors import UserError
from transformer.train import run


def test_results_page_scores_the_seeds_and_persistence_on_the_test_split(tmp_path):
  root = tmp_path / "runs"
  config = small_config(num_seeds=2, num_train_steps=6, eval_every=6, checkpoint_every=6)
  run(config, str(root / "gru"), "train")
  page = beijing_pm25_results.write_results(str(root), str(tmp_path / "out"))

  per_seed = [numpy_metrics(model.task, model.params, "test")
              for model in (load(str(root / "gru"), replica=r) for r in range(2))]
  mae_1h = np.array([m["mae_h"][0] for m in per_seed])
  assert f"| gru | {mae_1h.mean():.1f} ± {mae_1h.std(ddof=1):.1f} |" in page

  # Persistence: the last measured pm2.5 at or before each origin, by a plain loop.
  series = load(str(root / "gru")).task.series
  windows = load(str(root / "gru")).task.windows("test")
  start = series.split_bounds["test"][0]
  errors = []
  for origin in windows.origins:
    last = next(series.pm25[h] for h in range(origin, start - 1, -1) if not np.isnan(series.pm25[h]))
    if series.target_mask[origin + 1]:
      errors.append(abs(last - series.pm25[origin + 1]))
  assert f"| persistence | {np.mean(errors):.1f} |" in page

  assert "rnn: not run yet: `TRANSFORMER_DATA_DIR=../shared/data python launch.py " \
         "--config=experiments/beijing_pm25.py:rnn --workdir=WORKDIR`" in page
  assert "--config.num_seeds=2" in page  # the run's overrides are part of its command
  for name in ("RESULTS.md", "error_by_horizon.png", "example_forecast.png"):
    assert os.path.getsize(tmp_path / "out" / name) > 0

  # A page recording a longer run is not overwritten by this 6-step one unless asked (--force).
  recorded = (tmp_path / "out" / "RESULTS.md").read_text().replace("| gru | 2 | 6 / 6 |", "| gru | 2 | 600 / 600 |")
  (tmp_path / "out" / "RESULTS.md").write_text(recorded)
  assert beijing_pm25_results.recorded_steps(str(tmp_path / "out")) == {"gru": 600}
  with pytest.raises(UserError, match="row 'gru' records a run of 600 training steps, the new one trained 6"):
    beijing_pm25_results.write_results(str(root), str(tmp_path / "out"), replace_only_longer=True)
  assert (tmp_path / "out" / "RESULTS.md").read_text() == recorded
  beijing_pm25_results.write_results(str(root), str(tmp_path / "out"))
  assert beijing_pm25_results.recorded_steps(str(tmp_path / "out")) == {"gru": 6}
