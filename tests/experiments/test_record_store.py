"""experiments/record_store.py: the record store and its replace-only-longer rule, its file round trip and the
order of its rows; the machine stamp's CPU name."""
import json
import math

import pytest

from experiments import record_store
from transformer.errors import UserError


def test_a_record_is_replaced_only_by_a_run_at_least_as_long_unless_forced(tmp_path):
  store = record_store.RecordStore(str(tmp_path))
  store.add("a", steps=300, command="python launch.py", machine="CPU", values={"bleu": 1.5})
  store.add("a", steps=300, command="python launch.py --again", machine="CPU", values={"bleu": 2.0})  # as long
  with pytest.raises(UserError, match=r"row 'a' records a run of 300 training steps, the new one trained "
                     r"200.*--force"):
    store.add("a", steps=200, command="c", machine="m", values={})
  with pytest.raises(UserError, match="row 'a'"):  # before any work: the script checks all its rows
    store.check({"a": 100, "new": 5})
  assert store["a"]["values"] == {"bleu": 2.0}  # the refused record changed nothing
  store.add("a", steps=200, command="c", machine="m", values={"bleu": 0.5}, force=True)
  assert store["a"]["steps"] == 200
  record_store.RecordStore(str(tmp_path), force=True).check({"a": 1})  # a forced store refuses nothing


def test_records_round_trip_sorted_and_a_new_folder_starts_from_the_committed_ones(tmp_path):
  committed, mine = tmp_path / "committed", tmp_path / "mine"
  store = record_store.RecordStore(str(committed))
  store.add("b", steps=2, command="c2", machine="m", values={"x": [1, 2], "nan": float("nan")})
  store.add("a", steps=1, command="c1", machine="m", values={})
  store.save()
  text = (committed / "records.json").read_text()
  assert text.index('"a"') < text.index('"b"') and text.endswith("\n")  # sorted: small diffs in git
  again = record_store.RecordStore(str(committed))
  assert dict(again.items())["b"]["values"]["x"] == [1, 2] and math.isnan(again["b"]["values"]["nan"])
  assert list(again) == ["b", "a"]  # the order rows were added in (a table's), not the file's sorted keys
  again.rename("b", "b (committed)")
  again.add("c", steps=1, command="c3", machine="m", values={})
  assert list(again) == ["b (committed)", "a", "c"]
  assert list(record_store.RecordStore(str(mine), start_from=str(committed))) == ["b", "a"]
  assert len(record_store.RecordStore(str(mine))) == 0  # nothing saved there yet
  (committed / "records.json").write_text("{not json")
  with pytest.raises(UserError, match="records.json is not the JSON"):
    record_store.RecordStore(str(committed))


def test_a_row_of_a_file_without_places_is_replaced_and_machines_are_listed_once(tmp_path):
  (tmp_path / "records.json").write_text(json.dumps({  # written by hand or before rows kept their place
      "a": {"steps": 5, "command": "c", "machine": "CPU", "values": {"root": "/tmp/a"}},
      "b": {"steps": 5, "command": "c", "machine": "GPU", "values": {}}}))
  store = record_store.RecordStore(str(tmp_path))
  store.add("a", steps=5, command="c", machine="CPU", values={"root": "/tmp/b"})
  store.add("c", steps=1, command="c", machine="CPU", values={"root": "/tmp/b"})
  assert list(store) == ["a", "c", "b"]  # placed rows first, in their order; the rest as the file has them
  assert store.distinct(["a", "b", "c"]) == ["CPU", "GPU"]
  assert store.distinct(["a", "b", "c"], "root") == ["/tmp/b"]  # a value's field, rows without it left out


def test_the_cpu_is_named_from_proc_cpuinfo_else_by_platform(monkeypatch):
  monkeypatch.setattr(record_store, "read_cpuinfo", lambda: {"model name": "Some CPU"})
  assert record_store.cpu_name() == "Some CPU"
  monkeypatch.setattr(record_store, "read_cpuinfo", dict)  # unreadable (another OS, a container without /proc)
  monkeypatch.setattr(record_store.platform, "processor", lambda: "")
  assert record_store.cpu_name() == record_store.platform.machine()
