"""The experiments' docstrings carry their commands (DESIGN.md): ``help()`` and the source must show them alike."""
import ast
import pathlib

import pytest

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[2] / "experiments"


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.rglob("*.py")), ids=lambda path: str(path.relative_to(EXPERIMENTS)))
def test_a_docstring_with_a_backslash_is_a_raw_string(path):
  r"""A shell line ending in ``\`` was ``\\`` in the source (a copied command broke), or a single ``\``, which
  Python read as a line continuation and ``help()`` showed two command lines as one; ``\n`` in a ``printf``
  became a line break. A raw docstring reads the same in the source and in ``help()``."""
  source = path.read_text()
  tree = ast.parse(source)
  nodes = [tree] + [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
  for node in nodes:
    body = node.body
    if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
      continue
    text = ast.get_source_segment(source, body[0].value)
    name = getattr(node, "name", "the module")
    assert "\\" not in text or text[:1] in "rR", f"{path.name}:{body[0].lineno}: {name}'s docstring holds a " \
        "backslash; make it a raw string (r\"\"\"...) and write each backslash once"
