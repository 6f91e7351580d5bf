"""A tiny synthetic experiment that trains in seconds, for the training-system tests."""
import importlib.util
import os
import signal
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_experiment_config(name="synthetic", variant="copy"):
  spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "experiments", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


TINY_OVERRIDES = {
    "model.d_model": 32, "model.num_heads": 4, "model.d_ff": 64, "model.num_encoder_layers": 1,
    "model.num_decoder_layers": 1, "task.max_length": 6, "task.num_eval_examples": 32, "batch_size": 16,
    "num_train_steps": 20, "log_every": 5, "eval_every": 10, "checkpoint_every": 10, "eval_batch_size": 16,
    "quiet": True, "tensorboard": False, "async_checkpointing": False, "best_metric": "",
}
TINY_FLAGS = [f"--config.{k}={v}" for k, v in TINY_OVERRIDES.items()]


def start_launch(*flags, env=None, preexec_fn=None):
  """``python launch.py *flags`` in the repository, stdout and stderr together; a hang can dump its stacks.
  ``preexec_fn`` runs in the child before launch.py starts (e.g. to set a resource limit)."""
  env = dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")  # SIGABRT prints every thread's stack
  return subprocess.Popen([sys.executable, "launch.py", *flags], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, preexec_fn=preexec_fn)


def finish(*processes, timeout: float) -> list[str]:
  """The outputs of processes from ``start_launch`` once all have exited.

  If any is still running after ``timeout`` seconds, all are aborted (their Python stacks, printed by the fault
  handler, show where they waited) and the test fails with every output rather than leaving them running.
  """
  try:
    return [process.communicate(timeout=timeout)[0] for process in processes]
  except subprocess.TimeoutExpired:
    outputs = []
    for process in processes:
      if process.poll() is None:
        process.send_signal(signal.SIGABRT)
      try:
        outputs.append(process.communicate(timeout=30)[0])
      except subprocess.TimeoutExpired:
        process.kill()
        outputs.append(process.communicate()[0])
    pytest.fail(f"still running after {timeout} s, so aborted:\n"
                + "\n".join(f"--- {' '.join(p.args[1:])}\n{out}" for p, out in zip(processes, outputs)))


def tiny_config(**overrides):
  """The synthetic copy experiment shrunk to a 1+1-layer d_model=32 model; ``a__b=v`` sets ``config.a.b``."""
  config = load_experiment_config()
  for key, value in {**TINY_OVERRIDES, **{k.replace("__", "."): v for k, v in overrides.items()}}.items():
    node = config
    *parents, leaf = key.split(".")
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return config


@pytest.fixture
def make_config():
  return tiny_config
