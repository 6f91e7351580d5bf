"""launch.py: bad input gets one clear line naming the problem and the fix, never a stack trace; a bug keeps
its traceback."""
import os
import re
import subprocess
import sys

import pytest
from absl import flags

from tests.train.conftest import REPO, TINY_FLAGS


def launch(*args):
  return subprocess.run([sys.executable, "launch.py", *args], cwd=REPO, capture_output=True, text=True,
                        timeout=300)


# Each case checks the kind of failure (a one-line "error: ..." and status 1, no traceback) and that it names the
# field and value; the wording is checked only where it is the point: the suggestions and the listed fixes.
@pytest.mark.slow
@pytest.mark.parametrize("args,expected", [
    (["--config=experiments/nope.py"], "does not exist. Experiments: "),
    (["--config=experiments/synthetic.py:rotate"], "unknown variant 'rotate'"),
    (["--config=experiments/synthetic.py", "--config.num_train_stpes=3"], 'Did you mean "num_train_steps"'),
    (["--config=experiments/synthetic.py", "--config.model.num_head=3"], 'Did you mean "num_heads"'),
    (["--config=experiments/synthetic.py", "--config.batch_size=abc"], "--config.batch_size=abc"),
    (["--config=experiments/synthetic.py", "--config.batch_size=0"], "config.batch_size"),
    (["--config=experiments/synthetic.py", "--config.model.num_heads=5"], "ModelConfig.num_heads=5"),
    (["--config=experiments/synthetic.py", "--config.model.norm=group_norm"], "ModelConfig.norm='group_norm'"),
    (["--config=experiments/synthetic.py", "--config.parallelism=tpu"], "config.parallelism='tpu'"),
    (["--config=experiments/synthetic.py", "--mode=fly"], "--mode=fly"),
    (["--config=experiments/synthetic.py", "--config.target_token_dropout=1.5"],
     "config.target_token_dropout=1.5"),
    # config.model holds the variant's model's fields only: the RNN's here, with its own checks.
    (["--config=experiments/multi30k.py:gru_bahdanau", "--config.model.cel=lstm"], 'Did you mean "cell"'),
    (["--config=experiments/multi30k.py:gru_bahdanau", "--config.model.cell=lstm", "--config.model.hidden_dim=7"],
     "RNNConfig.hidden_dim=7"),
    (["--config=experiments/multi30k.py:gru_bahdanau", "--config.model.num_heads=4"],
     "unknown config field 'num_heads'. config.model holds the fields of the experiment's model"),
    (["--config=experiments/multi30k.py:lstm"], "unknown variant 'lstm' of experiments/multi30k.py"),
    (["--config=experiments/synthetic.py", "--config.model_name=rnn"],
     "config.model_name='rnn'"),
    (["--config=experiments/synthetic.py", "--config.model_name=rnm"], "Did you mean 'rnn'?"),
    (["--config=experiments/synthetic.py", "--config.seed=-5"], "config.seed must be an integer in [0, 2**62)"),
    # Settings the data layer checks against the data: the error names the config field.
    (["--config=experiments/multi30k.py:tiny", "--config.task.pair=en-xx"], "(config.task.pair)"),
    (["--config=experiments/language_model.py:tiny", "--config.task.language=vi"], "(config.task.language)"),
    (["--config=experiments/beijing_pm25.py:tiny", "--config.task.synthetic_hours=10"],
     "config.task.synthetic_hours"),
])
def test_bad_input_gets_a_clear_error(tmp_path, args, expected):
  """Also nothing after the line: orbax's cleanup of interrupted saves ran on a thread that outlived a start
  refused at once, and printed a traceback once the workdir was removed (1 of 3 launches of the PM2.5 case)."""
  result = launch(f"--workdir={tmp_path}", *args)
  assert result.returncode == 1 and any(line.startswith("error: ") for line in result.stderr.splitlines())
  assert expected in result.stderr, result.stderr
  assert "Traceback" not in result.stderr


def test_an_override_sets_the_field_of_the_variants_model():
  """``--config.model.cell=lstm`` on an RNN variant, parsed as launch.py parses it."""
  from ml_collections import config_flags

  from transformer.train import validate_config
  argv = ["launch.py", f"--config={os.path.join(REPO, 'experiments', 'multi30k.py')}:gru_bahdanau",
          "--config.model.cell=lstm", "--config.model.attention=luong_general"]
  parsed = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=parsed, lock_config=True, sys_argv=argv)
  parsed(argv)
  config = parsed.config
  assert (config.model_name, config.model.cell, config.model.attention) == ("rnn", "lstm", "luong_general")
  assert "d_model" not in config.model and "num_classes" not in config.model
  validate_config(config)


def launch_with_failing_run(tmp_path, error):
  """launch.py whose ``transformer.train.run`` raises ``error`` (an expression): what a user sees of it."""
  code = ("import runpy, sys\n"
          "import transformer.train\n"
          "from transformer.errors import ConfigError, InputFileError, MissingDataError\n"
          "def failing_run(config, workdir, mode):\n"
          f"  raise {error}\n"
          "transformer.train.run = failing_run\n"
          f"sys.argv = ['launch.py', '--config=experiments/synthetic.py', '--workdir={tmp_path}']\n"
          "runpy.run_path('launch.py', run_name='__main__')\n")
  return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("error", ["ConfigError('config.x is bad; set it to 1')",
                                   "MissingDataError('no train.en in /data; give --config.task.source_dir')",
                                   "InputFileError('train.en is not UTF-8 text')"])
def test_errors_the_user_causes_are_one_line(tmp_path, error):
  result = launch_with_failing_run(tmp_path, error)
  message = error.split("'")[1]
  assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == f"error: {message}", result.stderr
  assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_an_experiment_without_the_data_extra_is_one_line_naming_it(tmp_path):
  """A fresh interpreter where TFDS is not installed: beijing_pm25's config itself needs it (its feature names come
  with the dataset's builder), and says so before anything is imported from it."""
  code = ("import runpy, sys\n"
          "sys.modules['tensorflow_datasets'] = None  # importing it raises ModuleNotFoundError\n"
          f"sys.argv = ['launch.py', '--config=experiments/beijing_pm25.py:tiny', '--workdir={tmp_path}']\n"
          "runpy.run_path('launch.py', run_name='__main__')\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 1 and result.stderr.strip().splitlines() == [
      "error: experiments/beijing_pm25.py needs the 'data' extra (tensorflow-datasets not installed): "
      "run pip install -e \".[data]\" in the repository."], result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("error", ["ValueError('a bug, not bad input')", "FileNotFoundError('a bug')",
                                   "KeyError('a bug')"])
def test_any_other_exception_keeps_its_traceback(tmp_path, error):
  result = launch_with_failing_run(tmp_path, error)
  assert result.returncode != 0 and "Traceback (most recent call last)" in result.stderr
  assert f"{error.split('(')[0]}: " in result.stderr and "in failing_run" in result.stderr, result.stderr


@pytest.mark.slow
def test_missing_config_lists_the_experiments(tmp_path):
  result = launch(f"--workdir={tmp_path}", "--config=experiments/nope.py")
  listed = result.stderr.split("Experiments: ")[1].strip().split(", ")
  assert "experiments/synthetic.py" in listed and "experiments/multi30k.py" in listed
  assert "experiments/pages.py" not in listed  # helpers without get_config are not experiments


@pytest.mark.slow
def test_unwritable_workdir(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  result = launch("--config=experiments/synthetic.py", f"--workdir={blocker}/run")
  assert result.returncode != 0 and "is not writable" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_train_then_eval_and_predict_modes(tmp_path):
  result = launch("--config=experiments/synthetic.py:reverse", f"--workdir={tmp_path}", *TINY_FLAGS)
  assert result.returncode == 0, result.stderr
  assert "examples:" in result.stdout and "eval/exact_match=" in result.stdout
  result = launch("--config=experiments/synthetic.py:reverse", f"--workdir={tmp_path}", "--mode=eval", *TINY_FLAGS)
  assert result.returncode == 0, result.stderr
  assert "step 20:\nmetric" in result.stdout and (tmp_path / "eval_results.json").exists()
  result = launch("--config=experiments/synthetic.py:reverse", f"--workdir={tmp_path}", "--mode=predict",
                  *TINY_FLAGS)
  assert result.returncode == 0, result.stderr
  assert f"predictions of step 20: {tmp_path}/predictions.txt" in result.stdout
  assert "eval/" not in result.stdout  # predict writes predictions; it does not repeat the evaluation
  assert len((tmp_path / "predictions.txt").read_text().splitlines()) == 32  # task.num_eval_examples


@pytest.mark.slow
def test_modes_after_training_read_the_runs_saved_config(tmp_path):
  """Trained with a model override, evaluated without it: the saved config is used; a model change is refused."""
  result = launch("--config=experiments/synthetic.py:reverse", f"--workdir={tmp_path}", *TINY_FLAGS,
                  "--config.model.num_heads=8")
  assert result.returncode == 0, result.stderr
  result = launch("--config=experiments/synthetic.py:reverse", f"--workdir={tmp_path}", "--mode=eval",
                  "--config.eval_batch_size=8")
  assert result.returncode == 0, result.stderr
  assert "--mode=eval uses the run's saved config" in result.stdout and "--config.eval_batch_size" in result.stdout
  assert "step 20:\nmetric" in result.stdout
  result = launch("--config=experiments/synthetic.py:reverse", f"--workdir={tmp_path}", "--mode=eval",
                  "--config.model.num_heads=2")
  assert result.returncode != 0 and "num_heads: 8 -> 2" in result.stderr, result.stderr


@pytest.mark.slow
def test_eval_without_checkpoint_is_an_error(tmp_path):
  result = launch("--config=experiments/synthetic.py", f"--workdir={tmp_path}", "--mode=eval", *TINY_FLAGS)
  assert result.returncode != 0 and "holds no checkpoint" in result.stderr


@pytest.mark.slow
def test_translation_run_reports_data_preparation_and_padding(tmp_path):
  """Long data preparation says what it does (SentencePiece training) and the batches' padding fraction, in lines
  of its own: no absl stamp (``I1128 12:00:00.123 140005 file.py:257]``), no TFDS line of unknown sizes."""
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
  output = result.stdout + result.stderr
  assert not re.search(r"^[IWEF]\d{4} ", output, re.MULTILINE), output
  assert "Unknown size" not in output and "Subsequent calls will reuse" not in output, output
  assert f"multi30k: preparing the data set in {tmp_path / 'tfds'}" in result.stderr, result.stderr
