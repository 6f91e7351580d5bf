"""What a rerun changed on a results page: a row's printed cells before and after, kept in its record.

A results script that records a row over one from another run (another workdir root) calls ``history`` before
``RecordStore.add``: the row's ``values["reruns"]`` then lists each rerun's date and, per headline column, the
cell it printed before and the one it prints now; ``section`` writes them on the page. Scoring the same run again
(the same ``run_key``) adds nothing.
"""
from __future__ import annotations

import datetime
import re
from typing import Callable

DATE = re.compile(r"\d{4}-\d\d-\d\d")  # a record's machine stamp ends with the day it was written


def history(old: dict | None, new: dict, name: str, row: Callable[[str, dict], list], header: list[str],
            columns: tuple[str, ...], run_key: str = "workdir_root") -> list[dict]:
  """The ``reruns`` list of ``new`` (a record: ``steps``, ``command``, ``machine``, ``values``) replacing ``old``
  (the row's record, None for a new row): ``old``'s list, plus one entry when ``new`` is of another run
  (``values[run_key]`` differs): ``{"date", "was_date", "columns", "changes": [{"column", "was", "now"}]}`` over
  ``columns`` (names of ``header``) of ``row(name, record)``, the cells as printed."""
  if old is None:
    return []
  earlier = list(old["values"].get("reruns", []))
  if old["values"].get(run_key) == new["values"].get(run_key):
    return earlier
  was, now = row(name, old), row(name, new)
  changes = [{"column": column, "was": str(was[index]), "now": str(now[index])}
             for index, column in enumerate(header) if column in columns and was[index] != now[index]]
  dates = DATE.findall(old["machine"])
  return earlier + [{"date": datetime.date.today().isoformat(), "was_date": dates[-1] if dates else "an earlier day",
                     "columns": list(columns), "changes": changes}]


def section(store, names) -> str:
  """Markdown: a ``## Reruns`` section, a line per rerun of the rows ``names`` of ``store``; "" if none."""
  lines = []
  for name in names:
    for rerun in store[name]["values"].get("reruns", []):
      changed = [f"{change['column']} was {change['was']}, now {change['now']}" for change in rerun["changes"]]
      same = [column for column in rerun["columns"] if column not in {c["column"] for c in rerun["changes"]}]
      lines.append(f"- `{name}`: rerun on {rerun['date']} (the row before was of {rerun['was_date']}): "
                   + "; ".join(changed + ([f"the same {', '.join(same)}"] if same else [])) + ".")
  return ("## Reruns\n\nWhere a row's run was repeated, what its headline cells printed before and print now:\n\n"
          + "\n".join(lines) + "\n") if lines else ""
