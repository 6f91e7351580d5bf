"""What a rerun changed on a results page: a row's printed cells before and after, kept in its record
(``values["reruns"]``, from ``history`` before ``RecordStore.add``) and written on the page by ``section``.
"""
from __future__ import annotations

import datetime
import re
from typing import Callable


def history(old: dict | None, new: dict, name: str, row: Callable[[str, dict], list], header: list[str],
            columns: tuple[str, ...], run_key: str = "workdir_root") -> list[dict]:
  """The ``reruns`` list of the record ``new`` replacing ``old``: ``old``'s, plus, when ``new`` is of another run,
  ``{"date", "was_date", "columns", "changes": [{"column", "was", "now"}]}`` of the cells of ``row``."""
  if old is None:
    return []
  earlier = list(old["values"].get("reruns", []))
  if old["values"].get(run_key) == new["values"].get(run_key):
    return earlier
  was, now = row(name, old), row(name, new)
  changes = [{"column": column, "was": str(was[index]), "now": str(now[index])}
             for index, column in enumerate(header) if column in columns and was[index] != now[index]]
  dates = re.findall(r"\d{4}-\d\d-\d\d", old["machine"])  # a machine stamp ends with the day it was written
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
