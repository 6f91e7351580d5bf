"""benchmarks.collect copies a run's sections into a page unchanged, keeping the page's other sections."""
import pytest

from benchmarks import collect, common


def _section(name: str, body: str) -> str:
  return f"<!-- benchmarks.{name} -->\n## {name}\n\n{body}\n<!-- /benchmarks.{name} -->\n"


def _write(path, *sections):
  path.write_text(common.RESULTS_HEADER + "".join("\n" + text for text in sections))


def test_named_sections_are_copied_verbatim_and_others_kept(tmp_path):
  run, page = tmp_path / "run.md", tmp_path / "page.md"
  _write(run, _section("suite.gpu", "new suite"), _section("attention.gpu", "partial attention"))
  _write(page, _section("attention.gpu", "full attention"), _section("train_step", "cpu steps"))

  assert collect.collect(str(run), ["suite.gpu"], str(page)) == ["suite.gpu"]

  sections = common.read_sections(str(page))
  assert sections["suite.gpu"] == _section("suite.gpu", "new suite")
  assert sections["attention.gpu"] == _section("attention.gpu", "full attention")  # not named: kept
  assert sections["train_step"] == _section("train_step", "cpu steps")
  assert list(sections) == ["suite.gpu", "attention.gpu", "train_step"]  # the order of common.SCRIPTS


def test_no_names_copies_everything(tmp_path):
  run, page = tmp_path / "run.md", tmp_path / "page.md"
  _write(run, _section("decoding.gpu", "a"), _section("attention.gpu", "b"))
  assert sorted(collect.collect(str(run), [], str(page))) == ["attention.gpu", "decoding.gpu"]
  assert common.read_sections(str(page))["attention.gpu"] == _section("attention.gpu", "b")


def test_a_missing_section_is_refused_naming_what_the_run_has(tmp_path):
  run, page = tmp_path / "run.md", tmp_path / "page.md"
  _write(run, _section("suite.gpu", "x"))
  _write(page, _section("train_step", "y"))
  before = page.read_text()
  with pytest.raises(ValueError, match="no section time_to_bleu.gpu; it has suite.gpu"):
    collect.collect(str(run), ["time_to_bleu.gpu"], str(page))
  assert page.read_text() == before
