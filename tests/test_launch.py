"""launch.py: bad input gets one clear line naming the problem and the fix, never a stack trace."""
import subprocess
import sys

import pytest

from tests.train.conftest import REPO, TINY_FLAGS


def launch(*args):
  return subprocess.run([sys.executable, "launch.py", *args], cwd=REPO, capture_output=True, text=True,
                        timeout=300)


@pytest.mark.parametrize("args,expected", [
    (["--config=experiments/nope.py"], "does not exist. Experiments: "),
    (["--config=experiments/synthetic.py:rotate"], "unknown variant 'rotate'"),
    (["--config=experiments/synthetic.py", "--config.num_train_stpes=3"], 'Did you mean "num_train_steps"'),
    (["--config=experiments/synthetic.py", "--config.model.num_head=3"], 'Did you mean "num_heads"'),
    (["--config=experiments/synthetic.py", "--config.batch_size=abc"], "--config.batch_size=abc"),
    (["--config=experiments/synthetic.py", "--config.batch_size=0"], "config.batch_size must be a positive"),
    (["--config=experiments/synthetic.py", "--config.model.num_heads=5"], "num_heads=5 does not divide d_model=64"),
    (["--config=experiments/synthetic.py", "--config.model.norm=batch_norm"], "choose one of ['layer_norm', 'rms_norm']"),
    (["--config=experiments/synthetic.py", "--config.parallelism=tpu"], "choose one of ['jit', 'pmap', 'mesh']"),
    (["--config=experiments/synthetic.py", "--mode=fly"], "--mode=fly"),
    (["--config=experiments/synthetic.py", "--config.target_token_dropout=1.5"],
     "config.target_token_dropout=1.5 is outside [0, 1)"),
])
def test_bad_input_gets_a_clear_error(tmp_path, args, expected):
  result = launch(f"--workdir={tmp_path}", *args)
  assert result.returncode != 0
  assert expected in result.stderr, result.stderr
  assert "Traceback" not in result.stderr


def test_missing_config_lists_the_experiments(tmp_path):
  result = launch(f"--workdir={tmp_path}", "--config=experiments/nope.py")
  listed = result.stderr.split("Experiments: ")[1].strip().split(", ")
  assert "experiments/synthetic.py" in listed and "experiments/multi30k.py" in listed
  assert "experiments/report.py" not in listed  # helpers without get_config are not experiments


def test_unwritable_workdir(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  result = launch("--config=experiments/synthetic.py", f"--workdir={blocker}/run")
  assert result.returncode != 0 and "is not writable" in result.stderr and "Traceback" not in result.stderr


def test_train_then_eval_and_predict_modes(tmp_path):
  result = launch("--config=experiments/synthetic.py:reverse", f"--workdir={tmp_path}", *TINY_FLAGS)
  assert result.returncode == 0, result.stderr
  assert "examples:" in result.stdout and "eval/exact_match=" in result.stdout
  for mode in ("eval", "predict"):
    result = launch("--config=experiments/synthetic.py:reverse", f"--workdir={tmp_path}", f"--mode={mode}",
                    *TINY_FLAGS)
    assert result.returncode == 0, result.stderr
    assert '"step": 20' in result.stdout and (tmp_path / f"{mode}_results.json").exists()


def test_eval_without_checkpoint_is_an_error(tmp_path):
  result = launch("--config=experiments/synthetic.py", f"--workdir={tmp_path}", "--mode=eval", *TINY_FLAGS)
  assert result.returncode != 0 and "needs a checkpoint" in result.stderr


def test_translation_run_reports_data_preparation_and_padding(tmp_path):
  """Long data preparation says what it does (SentencePiece training) and the batches' padding fraction."""
  from tests.data.data_fixtures import write_multi30k
  sizes = {"train": 200, "val": 8, "test_2016_flickr": 4, "test_2017_flickr": 2, "test_2017_mscoco": 2,
           "test_2018_flickr": 2}
  raw = write_multi30k(tmp_path / "raw", sizes=sizes)
  flags = [f"--config.task.source_dir={raw}", f"--config.task.data_dir={tmp_path / 'tfds'}",
           "--config.task.vocab_size=64", "--config.task.max_tokens=256", "--config.task.max_length=32",
           "--config.model.d_model=16", "--config.model.num_heads=2", "--config.model.d_ff=32",
           "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
           "--config.num_train_steps=2", "--config.eval_every=2", "--config.tensorboard=False"]
  result = launch("--config=experiments/multi30k.py:transformer_small", f"--workdir={tmp_path / 'run'}", *flags)
  assert result.returncode == 0, result.stderr
  assert "SentencePiece en-de: training vocab 64" in result.stderr, result.stderr
  assert "padding fraction" in result.stderr, result.stderr
