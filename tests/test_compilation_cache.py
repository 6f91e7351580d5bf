"""The tests' persistent compilation cache (``tests/conftest.py``) is safe for runs side by side on one machine."""
import os

from jax._src import lru_cache


def test_a_cache_entry_appears_whole_or_not_at_all(tmp_path, monkeypatch):
  """Concurrent runs sharing the cache once read each other's half-written entries ("Error reading persistent
  compilation cache entry ... incomplete"): an entry is now renamed into place once written."""
  cache = lru_cache.LRUCache(str(tmp_path), max_size=-1)  # the tests' cache: no size limit, so no lock
  entry = os.urandom(4096)
  seen = []
  real_replace = os.replace

  def replace(source, target):  # what a reader could find at the moment the entry appears
    with open(source, "rb") as file:
      seen.append((os.path.exists(target), file.read()))
    real_replace(source, target)

  monkeypatch.setattr(os, "replace", replace)
  cache.put("key", entry)
  assert seen == [(False, entry)]  # before the rename: no entry at all; then the whole of it
  assert cache.get("key") == entry and os.listdir(tmp_path) == ["key-cache"]  # no temporary file left
  cache.put("key", b"other")  # an entry is written once
  assert cache.get("key") == entry
