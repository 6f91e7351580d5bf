"""experiments/reruns.py: a row recorded over one of another run keeps what its headline cells printed before."""
from experiments import reruns

HEADER = ["task", "score", "wall time"]


def row(name, record):
  return [name, f"{record['values']['score']:.3f}", f"{record['values']['wall']} s"]


def record(score, wall, root, date="2026-11-23", earlier=()):
  return {"steps": 10, "command": "c", "machine": f"1 x cpu, JAX 0.10.2, {date}",
          "values": {"score": score, "wall": wall, "workdir_root": root, "reruns": list(earlier)}}


def test_a_rerun_names_each_headline_cell_it_changed_and_those_it_did_not():
  old = record(0.792, 100, "/tmp/a")
  entries = reruns.history(old, record(0.801, 90, "/tmp/b"), "x", row, HEADER, ("score",))
  assert len(entries) == 1 and entries[0]["was_date"] == "2026-11-23"
  assert entries[0]["changes"] == [{"column": "score", "was": "0.792", "now": "0.801"}]  # wall time: no headline
  same = reruns.history(old, record(0.792, 90, "/tmp/b"), "x", row, HEADER, ("score",))
  assert same[0]["changes"] == []

  class Store(dict):
    pass
  store = Store(x=record(0.801, 90, "/tmp/b", earlier=entries), y=record(0.5, 1, "/tmp/b", earlier=same))
  text = reruns.section(store, ["x", "y"])
  assert text.startswith("## Reruns\n")
  assert f"- `x`: rerun on {entries[0]['date']} (the row before was of 2026-11-23): score was 0.792, now 0.801." in text
  assert "- `y`: rerun on " in text and ": the same score." in text


def test_scoring_the_same_run_again_or_a_new_row_adds_nothing():
  earlier = [{"date": "2026-11-20", "was_date": "2026-11-19", "columns": ["score"], "changes": []}]
  old = record(0.792, 100, "/tmp/a", earlier=earlier)
  assert reruns.history(old, record(0.700, 100, "/tmp/a"), "x", row, HEADER, ("score",)) == earlier
  assert reruns.history(None, record(0.700, 100, "/tmp/a"), "x", row, HEADER, ("score",)) == []
  assert reruns.section({"x": record(0.7, 1, "/tmp/a")}, ["x"]) == ""
