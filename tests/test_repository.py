"""What the repository tracks: code, docs and small results; never data, weights or checkpoints (they are reached
through a config value, a flag or $TRANSFORMER_DATA_DIR), and no committed output large enough to be one."""
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_BYTES = 2 * 1024 * 1024  # results are stored small (tenths in int16, per-window errors): a bigger file is data
# Weights, checkpoints and prepared or raw data sets: what users fetch or make themselves.
FORBIDDEN_SUFFIXES = {".safetensors", ".msgpack", ".ckpt", ".pt", ".pth", ".bin", ".h5", ".onnx", ".tfrecord",
                      ".array_record", ".arrayrecord", ".zip", ".gz", ".tgz", ".tar", ".xz", ".parquet", ".model"}


def tracked_files() -> list[pathlib.Path]:
  if shutil.which("git") is None or not (ROOT / ".git").exists():
    pytest.skip("not a git checkout: nothing says which files are tracked")
  listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
  return [ROOT / name for name in listed.decode().split("\0") if name]


def test_no_tracked_file_is_over_the_size_line():
  sizes = {path.relative_to(ROOT): path.stat().st_size for path in tracked_files() if path.is_file()}
  assert len(sizes) > 100  # the listing worked
  assert {path: size for path, size in sizes.items() if size > MAX_BYTES} == {}


def test_no_weights_checkpoints_or_data_archives_are_tracked():
  files = tracked_files()
  assert not [path.relative_to(ROOT) for path in files if path.suffix in FORBIDDEN_SUFFIXES]
  assert not [path.relative_to(ROOT) for path in files if "checkpoints" in path.parts]


def heading_anchors(path: pathlib.Path) -> set[str]:
  """The anchors a markdown file's headings get on GitHub: lowercased, punctuation but hyphens dropped, spaces
  made hyphens."""
  headings = re.findall(r"^#+\s+(.+?)\s*$", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
  return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_relative_link_of_the_markdown_files_resolves():
  """A link's file exists and, where it names a heading of a markdown file (``#anchor``), that heading does."""
  link = re.compile(r"\]\(([^)\s]+)\)")
  broken = []
  for path in tracked_files():
    if path.suffix != ".md" or path.name.endswith("page_template.md"):  # a template links from its page's folder
      continue
    for target in link.findall(path.read_text(encoding="utf-8")):
      if "://" in target or target.startswith("mailto:"):
        continue
      file, _, anchor = target.partition("#")
      linked = path.parent / file if file else path
      if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked)):
        broken.append(f"{path.relative_to(ROOT)}: {target}")
  assert broken == []


def test_a_heading_anchor_is_the_one_github_gives():
  assert heading_anchors(ROOT / "README.md") >= {"quick-start", "code-map-and-adding-an-experiment"}
