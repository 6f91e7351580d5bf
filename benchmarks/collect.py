"""Copy sections of a benchmark run's RESULTS.md (e.g. the suite's output folder fetched from a GPU machine)
into benchmarks/RESULTS.md, unchanged.

    python -m benchmarks.collect RUN_DIR/RESULTS.md                        # every section of that page
    python -m benchmarks.collect RUN_DIR/RESULTS.md --sections=suite.gpu,time_to_bleu.gpu

A section of the committed page that the run also has is replaced only when named in ``--sections`` or when
none is named: a partial run (a part cut by its time budget) should not replace a complete section.
"""
from __future__ import annotations

import argparse
import os
import sys

from benchmarks import common


def collect(source: str, names: list[str], path: str = common.RESULTS_PATH) -> list[str]:
  """Copy ``names`` (all when empty) from the page ``source`` into ``path`` (default the committed page).

  Returns the names copied. Raises ``ValueError`` naming a section that ``source`` does not have.
  """
  available = common.read_sections(source)
  if not available:
    raise ValueError(f"{source} holds no benchmark sections (is it a RESULTS.md written by benchmarks/?)")
  missing = [name for name in names if name not in available]
  if missing:
    raise ValueError(f"{source} has no section {', '.join(missing)}; it has {', '.join(sorted(available))}")
  chosen = {name: available[name] for name in (names or sorted(available))}
  common.write_sections(chosen, path)
  return list(chosen)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("source", help="a RESULTS.md written by a benchmark run (--output_dir)")
  parser.add_argument("--sections", default="", help="comma-separated section names (default: all)")
  parser.add_argument("--results_path", default=common.RESULTS_PATH, help="the page to write into")
  args = parser.parse_args(argv)
  if not os.path.exists(args.source):
    sys.exit(f"error: {args.source} does not exist; give the RESULTS.md of a benchmark run's output folder.")
  try:
    copied = collect(args.source, [name for name in args.sections.split(",") if name], args.results_path)
  except ValueError as error:
    sys.exit(f"error: {error}")
  print(f"copied {', '.join(copied)} into {args.results_path}")


if __name__ == "__main__":
  main()
