"""Test session setup: 8 virtual CPU devices, so multi-device code is tested without accelerators.

XLA reads the flag once, when JAX initialises its backend, so it must be set before anything imports jax.
"""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Many tests compile identical programs (the same tiny model under the same settings); a persistent
# compilation cache shared by the session turns the repeats into cache hits.
import tempfile  # noqa: E402

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "transformer-test-jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
