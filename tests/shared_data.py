"""Where the tests find the real data and models (never part of the repository): ``$TRANSFORMER_SHARED_DIR``,
default ``<repo root>/../shared``. Tests that need it skip, saying why, when it is absent."""
from __future__ import annotations

import os
import pathlib

import pytest

ENV_VAR = "TRANSFORMER_SHARED_DIR"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def shared_dir() -> pathlib.Path:
  return pathlib.Path(os.environ.get(ENV_VAR) or REPO_ROOT.parent / "shared")


def shared_path(*parts: str) -> pathlib.Path:
  """``<shared dir>/<parts>``, or skip the calling test when it does not exist."""
  path = shared_dir().joinpath(*parts)
  if not path.exists():
    pytest.skip(f"{path} is absent: set {ENV_VAR} to the folder holding data/ and models/ "
                f"(default <repo root>/../shared).")
  return path
