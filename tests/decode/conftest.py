"""Every decoding test runs twice: in JAX's default 32-bit mode and with ``jax_enable_x64`` (the cache update
once mixed int64 literals with int32 indices there)."""
import jax
import pytest


@pytest.fixture(autouse=True, params=[False, True], ids=["x32", "x64"])
def x64_mode(request):
  with jax.enable_x64(request.param):  # the config option as a context manager, restored after
    yield request.param
