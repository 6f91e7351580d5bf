"""Test session setup: 8 virtual CPU devices, so multi-device code is tested without accelerators.

XLA reads the flag once, when JAX initialises its backend, so it must be set before anything imports jax.
"""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Many tests compile identical programs (the same tiny model under the same settings); a persistent
# compilation cache shared by the session (and later runs) turns the repeats into cache hits.
import tempfile  # noqa: E402

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "transformer-test-jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def _write_cache_entries_whole():
  """JAX writes a cache entry in place (and reads without a lock when the cache has no size limit), so a run
  beside another, or another worker, read entries half-written: "Error reading persistent compilation cache
  entry ... incomplete". Each entry is written to a temporary file of this process and renamed into place, so it
  appears whole or not at all; the cache stays shared. Where JAX's cache class is not the one known here, each
  process gets a folder of its own instead."""
  from jax._src import lru_cache  # imports jax: after the flags above

  suffix = getattr(lru_cache, "_CACHE_SUFFIX", None)
  put = getattr(getattr(lru_cache, "LRUCache", None), "put", None)
  if suffix is None or put is None or getattr(put, "writes_whole", False):
    if suffix is None or put is None:
      os.environ["JAX_COMPILATION_CACHE_DIR"] += f"-{os.getpid()}"
    return

  def put_whole(self, key: str, value: bytes) -> None:
    if self.eviction_enabled or not key:  # a size-limited cache writes under its file lock
      return put(self, key, value)
    path = self.path / f"{key}{suffix}"
    if path.exists():
      return None
    temporary = self.path / f"{key}.{os.getpid()}.tmp"  # not *-cache: never read as an entry
    temporary.write_bytes(value)
    os.replace(temporary, path)
    return None

  put_whole.writes_whole = True
  lru_cache.LRUCache.put = put_whole


_write_cache_entries_whole()
