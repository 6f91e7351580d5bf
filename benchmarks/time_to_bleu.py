"""Question 7: time to BLEU: Multi30k from an empty workdir to a scored test_2016_flickr BLEU, on this machine.

    python -m benchmarks.time_to_bleu --data_dir=.gpu_data/multi30k      # on a GPU: transformer_gpu
    python -m benchmarks.time_to_bleu --smoke --data_dir=DIR             # a tiny model, a few steps (tests)

Two fresh ``launch.py`` processes, timed from outside: training of ``--config`` (default
``experiments/multi30k.py:transformer_gpu``: one padded batch shape, bfloat16) in a new workdir, whose TFDS data
dir is inside it, so preparing the data and training the SentencePiece vocabulary count; then ``--mode=eval``
(the best checkpoint on validation; test_2016_flickr decoded by beam search and scored by sacreBLEU). Both
processes share a persistent compilation cache in the workdir, so the evaluation does not compile again what
training compiled.

The raw Multi30k files: ``--data_dir``, else ``$TRANSFORMER_DATA_DIR``, else the git-ignored ``.gpu_data/`` of
the repository (the files, or a ``multi30k/`` folder of them): a copy of the checkout on another machine carries
them there. Nothing is downloaded.

With ``--time_budget_s``, training is sent SIGTERM once the budget less ``--eval_reserve_s`` is spent: it saves
a checkpoint and stops, and the evaluation scores what it reached; the table says at which step of how many.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks import common
from experiments.record_store import REPO, host_description
from transformer.data.download import ENV_VAR
from transformer.errors import MissingDataError, exit_on_user_error
from transformer.train.workdir import RunDirectory

DEFAULT_CONFIG = "experiments/multi30k.py:transformer_gpu"
GIT_IGNORED_DATA = os.path.join(REPO, ".gpu_data")
TEST_SPLIT = "test_2016_flickr"
# --smoke: a model of a few thousand parameters, a 64-piece vocabulary, a few steps; float32 (bfloat16 is slow
# on CPU and the numbers mean nothing).
SMOKE_OVERRIDES = ("--config.model.d_model=16", "--config.model.num_heads=2", "--config.model.d_ff=32",
                   "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
                   "--config.model.dtype=float32", "--config.task.vocab_size=64", "--config.task.max_tokens=256",
                   "--config.task.max_length=32", "--config.decode.beam_size=2", "--config.num_train_steps=4",
                   "--config.eval_every=4", "--config.checkpoint_every=4", "--config.log_every=2")


def add_arguments(parser):
  parser.add_argument("--config", default=DEFAULT_CONFIG, help="launch.py --config")
  parser.add_argument("--data_dir", default="",
                      help=f"raw Multi30k files (default ${ENV_VAR}, else .gpu_data/ of the repository)")
  parser.add_argument("--workdir", default="", help="a new folder for the run, kept (default: a temporary one, "
                      "removed at the end)")
  parser.add_argument("--steps", type=common.positive_int, default=None, help="config.num_train_steps")
  parser.add_argument("--eval_reserve_s", type=common.non_negative_float, default=90.0,
                      help="with --time_budget_s: seconds kept for the evaluation process")
  parser.add_argument("--override", action="append", default=[],
                      help="more launch.py flags, e.g. --override=--config.task.max_tokens=32768")


def find_data_dir(data_dir: str = "") -> str:
  """The folder of raw Multi30k files: ``data_dir``, else ``$TRANSFORMER_DATA_DIR``, else ``.gpu_data/``.

  Raises:
    MissingDataError: none of them is a folder; the message names all three.
  """
  for candidate in (data_dir, os.environ.get(ENV_VAR, ""), GIT_IGNORED_DATA):
    if candidate and os.path.isdir(candidate):
      nested = os.path.join(candidate, "multi30k")
      return os.path.abspath(nested if os.path.isdir(nested) else candidate)
    if candidate and candidate == data_dir:
      raise MissingDataError(f"--data_dir={data_dir} is not a folder; give the folder of Multi30k's raw files "
                             "(train.en.gz, ...).")
  raise MissingDataError(f"no Multi30k raw files: give --data_dir=FOLDER, set ${ENV_VAR}, or copy them into "
                         f"{GIT_IGNORED_DATA}/multi30k/ (git-ignored; carried with the checkout to another machine).")


def launch_command(config: str, workdir: str, *flags: str) -> list[str]:
  return [sys.executable, os.path.join(REPO, "launch.py"), f"--config={config}", f"--workdir={workdir}",
          *flags]


def run_until(command: list[str], env: dict, deadline: float | None) -> tuple[int, float, bool]:
  """``(exit status, seconds, stopped)``: run ``command``; at ``deadline`` (``time.monotonic``) send it SIGTERM
  (a training run then checkpoints and exits), and SIGKILL if it is still there 120 s later."""
  start = time.monotonic()
  process = subprocess.Popen(command, cwd=REPO, env=env)
  stopped = False
  try:
    process.wait(timeout=None if deadline is None else max(1.0, deadline - start))
  except subprocess.TimeoutExpired:
    stopped = True
    print(f"time budget spent: SIGTERM to {os.path.basename(command[1])} (it saves a checkpoint and stops)",
          flush=True)
    process.send_signal(signal.SIGTERM)
    try:
      process.wait(timeout=120)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
  return process.returncode, time.monotonic() - start, stopped


def describe_search(decode: dict) -> str:
  """``config.decode`` in words, e.g. "beam search 5" or "greedy search"."""
  if decode["method"] == "beam":
    return f"beam search {decode['beam_size']}"
  return "greedy search" if decode["method"] == "greedy" else f"sampling (temperature {decode['temperature']})"


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  machine = host_description(load_average=True)
  source_dir = exit_on_user_error(find_data_dir, args.data_dir)
  workdir = os.path.abspath(args.workdir) if args.workdir else tempfile.mkdtemp(prefix="time_to_bleu-")
  if os.path.isdir(workdir) and os.listdir(workdir):
    sys.exit(f"error: --workdir={workdir} is not empty; time to BLEU starts from an empty workdir.")
  os.makedirs(workdir, exist_ok=True)
  env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": os.path.join(workdir, "jax_cache")}
  flags = [f"--config.task.source_dir={source_dir}", f"--config.task.data_dir={os.path.join(workdir, 'tfds')}",
           "--config.quiet=True", "--config.tensorboard=False", *(SMOKE_OVERRIDES if args.smoke else ()),
           *([f"--config.num_train_steps={args.steps}"] if args.steps else []), *args.override]
  budget_end = None if args.time_budget_s is None else args.started + args.time_budget_s
  train_deadline = None if budget_end is None else budget_end - args.eval_reserve_s

  status, train_seconds, stopped = run_until(launch_command(args.config, workdir, *flags), env, train_deadline)
  if status and not stopped:
    sys.exit(f"error: training exited with status {status} (its error is printed above)")
  trained = RunDirectory(workdir).metrics().last_step
  status, eval_seconds, eval_stopped = run_until(launch_command(args.config, workdir, "--mode=eval", *flags), env,
                                                 budget_end)
  if status:
    sys.exit(f"error: --mode=eval exited with status {status}"
             + (" after the time budget was spent" if eval_stopped else " (its error is printed above)"))
  results, config = RunDirectory(workdir).eval_results(), RunDirectory(workdir).config_values()
  planned = config["num_train_steps"]
  task = config["task"]
  bleu = results[f"{TEST_SPLIT}/bleu"]
  report = common.Report(
      "time_to_bleu", "Time to BLEU: Multi30k en-de from an empty workdir (benchmarks/time_to_bleu.py)",
      ["config", "compute dtype", "batch", "steps trained (of planned)", "checkpoint scored", "train process s",
       "eval process s", "total s", "validation BLEU", f"{TEST_SPLIT} BLEU", f"{TEST_SPLIT} BLEU lowercased"])
  batch = (f"{task['max_tokens'] // task['max_length']} x {task['max_length']}" if task["fixed_batch_shape"]
           else f"{task['max_tokens']} tokens, length buckets")
  report.rows.append([args.config.split(":")[-1] + (" (smoke size)" if args.smoke else ""),
                      config["model"]["dtype"], batch, f"{trained:,} of {planned:,}", results.get("step"),
                      train_seconds, eval_seconds, train_seconds + eval_seconds, results.get("eval/bleu"), bleu,
                      results.get(f"{TEST_SPLIT}/bleu_lowercase")])
  report.ratios[f"{TEST_SPLIT} BLEU"] = float(bleu)
  report.ratios["total seconds"] = train_seconds + eval_seconds
  report.notes += [
      "Wall time of two fresh processes: training (TFDS preparation of the raw files and SentencePiece training "
      "into the workdir, compilation, training with its validation BLEU every "
      f"{config['eval_every']:,} steps, checkpoints) and --mode=eval (the best checkpoint on validation; "
      f"{TEST_SPLIT} by {describe_search(config['decode'])}, sacreBLEU "
      f"{results.get(f'{TEST_SPLIT}/bleu_signature', '')}); a persistent compilation cache shared by both.",
      *([f"Training was stopped by the time budget at step {trained:,} of {planned:,} (SIGTERM, checkpoint saved)."]
        if stopped else []),
      f"Command: python launch.py --config={args.config} --workdir=WORKDIR "
      + " ".join(flag for flag in flags if not flag.startswith(("--config.task.source_dir",
                                                               "--config.task.data_dir"))),
  ]
  report = common.finish(report, args, argv, machine)
  if not args.workdir:  # a temporary one: its checkpoints are not wanted, and a device's disk is small
    shutil.rmtree(workdir, ignore_errors=True)
  return report


if __name__ == "__main__":
  main(sys.argv[1:])
