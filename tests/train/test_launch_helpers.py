"""The subprocess helpers of the training tests: a hung ``launch.py`` must fail the test, with its stacks."""
import pytest

from tests.train.conftest import TINY_FLAGS, finish, start_launch


@pytest.mark.slow
def test_a_launch_past_its_timeout_is_aborted_with_every_threads_stack(tmp_path):
  process = start_launch("--config=experiments/synthetic.py:copy", f"--workdir={tmp_path}", *TINY_FLAGS,
                         "--config.num_train_steps=100000")  # far longer than the timeout
  with pytest.raises(pytest.fail.Exception, match="still running after 5 s") as failure:
    finish(process, timeout=5)
  assert process.poll() is not None  # not left running
  message = str(failure.value)
  assert "Fatal Python error: Aborted" in message and 'File "' in message  # the fault handler's stack dump
  assert "launch.py --config=experiments/synthetic.py:copy" in message
