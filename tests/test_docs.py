"""What README.md and docs/ say about the code and the tools it drives, checked against them (issue 70: the
profiler's trace location, the quick loop's figure, --average_checkpoints with a tiny run)."""
import pathlib
import re

import jax
import jax.numpy as jnp

ROOT = pathlib.Path(__file__).resolve().parents[1]


def read(name: str) -> str:
  return " ".join((ROOT / name).read_text(encoding="utf-8").split())  # lines joined: a claim may wrap


def test_the_profiler_trace_is_where_training_md_says(tmp_path):
  """jax.profiler.start_trace(WORKDIR/profile) writes three folders down, plugins/profile/<time>/ (the docs said
  WORKDIR/profile/ itself)."""
  jax.profiler.start_trace(str(tmp_path), create_perfetto_trace=True)
  jnp.ones((8, 8)).sum().block_until_ready()
  jax.profiler.stop_trace()
  (folder,) = {path.parent for path in tmp_path.rglob("*") if path.is_file()}
  assert re.fullmatch(r"plugins/profile/\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d", folder.relative_to(tmp_path).as_posix())
  files = {path.name for path in folder.iterdir()}
  assert "perfetto_trace.json.gz" in files and any(name.endswith(".xplane.pb") for name in files)
  docs = read("docs/training.md")
  assert "`WORKDIR/profile/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/`" in docs
  assert "`<host>.xplane.pb`" in docs and "`perfetto_trace.json.gz`" in docs


def test_the_readme_quotes_development_mds_quick_loop_and_quick_start():
  development, readme = read("docs/development.md"), read("README.md")
  assert '-m "not slow" # the quick loop while editing: under 3 minutes' in development
  assert "runs two thirds of them in under 3 minutes" in readme
  quick_start = re.search(r"the README's quick start in a fresh clone and venv, (\d+)m(\d+)s with the install", development)
  minutes = int(quick_start.group(1)) + int(quick_start.group(2)) / 60
  stated = float(re.search(r"On 2 CPU cores it takes about ([\d.]+) minutes, install included", readme).group(1))
  assert abs(stated - minutes) <= 0.25, (stated, minutes)


def test_average_checkpoints_in_translation_md_fits_the_checkpoints_each_variant_keeps():
  from experiments import multi30k
  small, tiny = multi30k.get_config("transformer_small"), multi30k.get_config("tiny")
  docs = read("docs/translation.md")
  assert "--run=transformer_small:/tmp/m30k --average_checkpoints=5" in docs.replace("\\ ", "")
  assert small.keep_checkpoints == 5 and small.num_train_steps // small.checkpoint_every >= 5
  saved = tiny.num_train_steps // tiny.checkpoint_every
  assert saved == 2 and min(saved, tiny.keep_checkpoints) == 2
  assert "a `tiny` run saves only 2 (steps 20 and 40), so it takes `--average_checkpoints=2` at most" in docs
