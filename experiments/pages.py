"""The one main of a results script and its flags (shared with the benchmarks), where a page goes, and the pieces
of a page: tables, sections, plots, the note of runs not kept, its template's prose (docs/development.md).
"""
from __future__ import annotations

import argparse
import os
import re
import string
import tempfile
from typing import Callable

from experiments.record_store import COMMITTED, RECORDS_FILE, REPO, RecordStore, read_text, write_text
from transformer.errors import UserError, exit_on_user_error

NOT_KEPT_NOTE = "runs_not_kept.md"  # beside a page, by hand: settings tried whose workdirs are gone


def add_output_arguments(parser, default: str, force: bool = True) -> None:
  """``--output_dir`` (``default`` for the help), ``--update_committed`` and ``--force`` (unless ``force=False``)."""
  parser.add_argument("--output_dir", default="", help="Folder for the page (RESULTS.md and what it links), "
                      f"printed at the end; default: {default}.")
  parser.add_argument("--update_committed", action="store_true", help="Write into the committed page instead of "
                      "--output_dir." + (" A row there is only replaced by a run of at least as many training steps "
                                         "(see --force)." if force else ""))
  if force:
    parser.add_argument("--force", action="store_true",
                        help="With --update_committed: replace committed rows even by runs of fewer training steps.")


def add_boolean_argument(parser, name: str, default: bool, help: str) -> None:
  """``--NAME`` and ``--noNAME`` (absl's spelling, which the pages' commands and READMEs use)."""
  parser.add_argument(f"--{name}", dest=name, action="store_true", default=default, help=help)
  parser.add_argument(f"--no{name}", dest=name, action="store_false", help=f"The opposite of --{name}.")


def non_negative_int(text: str) -> int:
  """An argparse ``type``: an integer >= 0, else a usage error naming the value."""
  if not text.strip().isdigit():
    raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
  return int(text)


def comma_list(text: str) -> list[str]:
  """An argparse ``type``: ``a,b`` -> ``["a", "b"]`` (absl's DEFINE_list)."""
  return [part.strip() for part in text.split(",") if part.strip()]


def results_parser(doc: str, default_output: str, default_root: str | None = None,
                   hardware: bool = False) -> argparse.ArgumentParser:
  """A results script's parser: ``doc`` as the help, the output flags, ``--from_records`` and the optional ones."""
  parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   allow_abbrev=False)  # as absl: a misspelt flag is an error
  add_output_arguments(parser, default_output)
  parser.add_argument("--from_records", action="store_true",
                      help=f"Train and score nothing: write the page from the folder's {RECORDS_FILE} alone (a new "
                           "folder's start from the committed page's), e.g. after a change of the page's layout.")
  if default_root is not None:
    parser.add_argument("--workdir_root", default=default_root,
                        help=f"Where the runs' workdirs are: <root>/<variant> (default: {default_root}).")
  if hardware:
    parser.add_argument("--hardware", default="", help="Where the runs read trained, for the page (default: this "
                        "machine), e.g. '1 x NVIDIA H200, 16 cores' for workdirs copied back from a GPU host.")
  return parser


def make_page(args: argparse.Namespace, committed: str, default_output: str,
              collect: Callable[[RecordStore, str], object] | None, render: Callable[[RecordStore, str], str]) -> str:
  """The page's text: the one main of a results script, which fills the folder's ``RecordStore`` with
  ``collect(store, folder)`` and writes ``render(store, folder)`` only if every step succeeds."""
  force = getattr(args, "force", False)
  folder = exit_on_user_error(choose_results_folder, args.output_dir, args.update_committed, force, committed,
                              default_output)
  updating = args.update_committed  # choose_results_folder refuses any other way into the committed folder

  def write() -> str:
    store = RecordStore(folder, start_from=None if updating else committed, force=force or not updating)
    if args.from_records:  # a page of no rows would replace the page: refused before anything is written
      store.require_rows("--from_records")
    try:  # before collect's hours of training or decoding: a folder the page could not be written into
      os.makedirs(folder, exist_ok=True)
      handle, probe = tempfile.mkstemp(prefix=".write-check-", dir=folder)
      os.close(handle)
      os.remove(probe)
    except OSError as error:
      raise UserError(f"cannot write the page into {folder} ({error.strerror or error}): give --output_dir=<a "
                      "folder you can write>, or make it writable, and rerun") from None
    if collect is not None and not args.from_records:
      collect(store, folder)
    text = render(store, folder)
    store.save()
    return write_text(folder, text)

  text = exit_on_user_error(write)
  print(text)
  print(f"Wrote the page to {folder}/RESULTS.md" + ("" if updating else f" (the committed page "
        f"{os.path.relpath(committed, REPO)}/ is unchanged; --update_committed writes there)."))
  return text


def choose_results_folder(output_dir: str, update_committed: bool, force: bool, committed: str,
                          default: str, keeps_rows: bool = True) -> str:
  """``committed`` with ``update_committed``, else ``output_dir``, else ``default``; a UserError for the rest."""
  if update_committed and output_dir:
    raise UserError("give either --output_dir (a page of your own) or --update_committed (the committed page "
                    f"{os.path.relpath(committed, REPO)}/), not both")
  if force and not update_committed:
    raise UserError("--force only applies with --update_committed (it lets shorter runs replace committed rows)")
  if update_committed:
    return committed
  folder = os.path.abspath(output_dir or default)
  if os.path.realpath(folder) == os.path.realpath(committed):
    raise UserError(f"--output_dir={output_dir} is the committed page; give --update_committed to write there"
                    + (" (rows are then only replaced by runs at least as long)" if keeps_rows else "")
                    + ", or another folder")
  return folder


def markdown_table(header: list[str], rows: list[list]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
  return "\n".join(lines)


def section(caption: str, header: list[str], rows: list[list]) -> str:
  """A captioned table between blank lines, or "" without rows."""
  return f"\n{caption}:\n\n{markdown_table(header, rows)}\n" if rows else ""


def image(folder: str, file: str, alt: str) -> str:
  """``![alt](file)`` when ``folder/file`` exists; else a line saying that records do not keep it."""
  if os.path.exists(os.path.join(folder, file)):
    return f"![{alt}]({file})"
  return f"({alt}: `{file}` is drawn from the runs' workdirs, not from {RECORDS_FILE}; not drawn here.)"


def runs_not_kept(output: str) -> str:
  """A section of the hand-written ``output/runs_not_kept.md``, or "" when there is none."""
  note = read_text(output, NOT_KEPT_NOTE).strip()
  return note and (f"\n## Runs not kept\n\nSettings tried whose workdirs are gone, so they are in no table above "
                   f"(hand-written in `{NOT_KEPT_NOTE}`, with the numbers their training printed):\n\n{note}\n")


def read_template(path: str) -> dict[str, string.Template]:
  """The pieces of the template ``experiments/PATH`` (each after a line ``<!-- NAME -->``) as ``string.Template``."""
  with open(os.path.join(COMMITTED, path)) as f:
    parts = re.split(r"^<!-- (\w+) -->\n", f.read(), flags=re.MULTILINE)  # [note, name, piece, name, piece, ...]
  return {name: string.Template(text.rstrip("\n")) for name, text in zip(parts[1::2], parts[2::2])}
