"""The layering of DESIGN.md, checked on the source: which package may import which, and no private names.

Parses every module's imports (no import is executed), so a violation is caught even on a code path no other
test runs.
"""
import ast
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "transformer"
STDLIB = set(sys.stdlib_module_names)

# package -> (third-party top-level modules it may import, project packages it may import). Its own package,
# the standard library, transformer.errors (the project's error types) and transformer.effects (what changing a
# setting does), which import nothing of the project, are always allowed.
LAYERS = {
    "ops": ({"jax", "numpy"}, set()),
    "nn": ({"jax", "numpy", "flax"}, {"ops"}),
    "data": ({"numpy", "tensorflow_datasets", "etils", "sentencepiece", "tokenizers", "grain"}, set()),
    "decode": ({"jax", "numpy"}, {"ops"}),
    "pretrained": ({"jax", "numpy", "flax", "safetensors", "tokenizers", "tqdm"}, {"nn", "data", "ops"}),
    "tasks": ({"jax", "numpy", "flax", "ml_collections", "sacrebleu", "optax", "tqdm"},
              {"nn", "data", "decode", "ops", "pretrained"}),
    "train": ({"jax", "numpy", "flax", "ml_collections", "optax", "orbax", "tqdm", "tensorboardX"},
              {"nn", "data", "decode", "ops", "pretrained", "tasks"}),
}
ALWAYS = ("errors", "effects")
ROOT_NAMES = ("lazy_exports",)  # what the package root itself defines, for every package's __init__
# The package root: what each of its modules may import (errors.py: nothing, so that every layer may use it).
ROOT_MODULES = {
    "errors.py": (set(), set()),
    "effects.py": (set(), set()),
    "plot.py": ({"matplotlib"}, {"train"}),
    "inference.py": ({"jax", "numpy", "ml_collections"}, {"train", "tasks", "errors"}),
    "export.py": ({"jax", "numpy"}, {"inference", "tasks", "decode", "errors"}),
    "__init__.py": (set(), {"train", "inference", "errors"}),
}


def _python_files(directory: pathlib.Path):
  return sorted(path for path in directory.rglob("*.py") if "__pycache__" not in path.parts)


def _imports(path: pathlib.Path, package: str | None = None):
  """``(line, module, imported names)`` of every import statement in a file; names are None for ``import x``.
  A relative import is resolved against ``package`` (default: the file's own under the repository root)."""
  tree = ast.parse(path.read_text(), filename=str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, alias.name, None
    elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
      module = node.module
      if node.level:  # ``from ..tasks import x`` in transformer/nn/: transformer.tasks
        parts = (package or ".".join(path.relative_to(ROOT).parent.parts)).split(".")
        module = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
      yield node.lineno, module, [alias.name for alias in node.names]


def _private_attribute_uses(path: pathlib.Path):
  """``(line, "alias._name")`` where a name bound to a project module is used for a private attribute
  (``seq2seq._beam_decode`` after ``from transformer.tasks import seq2seq``)."""
  tree = ast.parse(path.read_text(), filename=str(path))
  modules = {}  # local name -> project module it is bound to
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("transformer"):
      modules.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
    elif isinstance(node, ast.Import):
      modules.update({alias.asname: alias.name for alias in node.names
                      if alias.asname and alias.name.startswith("transformer")})
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
        and node.attr.startswith("_") and not node.attr.startswith("__")):
      yield node.lineno, modules[node.value.id], f"{node.value.id}.{node.attr}"


def _project_package(module: str) -> str | None:
  """``transformer.nn.attention`` -> ``nn``; ``transformer`` itself -> ``""``; anything else -> None."""
  parts = module.split(".")
  if parts[0] != "transformer":
    return None
  return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_layer_imports_only_what_design_allows(layer):
  allowed_external, allowed_project = LAYERS[layer]
  directory = PACKAGE / layer
  if not directory.is_dir():
    pytest.skip(f"transformer/{layer} does not exist yet")
  violations = []
  for path in _python_files(directory):
    for line, module, names in _imports(path):
      top = module.split(".")[0]
      package = _project_package(module)
      if package is None:
        if top not in STDLIB and top not in allowed_external and top != "__future__":
          violations.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
      elif package == "" and names is not None:
        # `from transformer import x`: x is a subpackage (or a top-level module such as errors).
        violations += [f"{path.relative_to(ROOT)}:{line} imports transformer.{name}" for name in names
                       if name not in {layer, *ALWAYS, *ROOT_NAMES} | allowed_project]
      elif package not in {layer, *ALWAYS} | allowed_project:
        violations.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
  assert not violations, f"transformer/{layer} may import {sorted(allowed_project) or 'no other project package'}:\n" + \
      "\n".join(violations)


@pytest.mark.parametrize("name", sorted(ROOT_MODULES))
def test_the_package_root_imports_only_the_run_layer(name):
  """``load`` and the typed models (inference.py) sit on train and tasks; nothing in a layer imports them back
  (the layer tests above allow no ``transformer.inference``)."""
  allowed_external, allowed_project = ROOT_MODULES[name]
  violations = []
  for line, module, names in _imports(PACKAGE / name):
    top, package = module.split(".")[0], _project_package(module)
    if package is None:
      if top not in STDLIB | allowed_external | {"__future__"}:
        violations.append(f"{name}:{line} imports {module}")
    elif package == "":
      violations += [f"{name}:{line} imports transformer.{n}" for n in names or [] if n not in allowed_project]
    elif package not in allowed_project:
      violations.append(f"{name}:{line} imports {module}")
  assert not violations, f"transformer/{name} may import {sorted(allowed_project)}:\n" + "\n".join(violations)


def test_nothing_outside_train_imports_a_private_name_of_another_package():
  """``from transformer.tasks.seq2seq import _beam_decode`` in a script or another package is a hidden API.

  ``transformer/train`` (the one system that ties everything together) and tests of the module itself are the
  exceptions: a test may reach into the package it mirrors (tests/ops for transformer/ops).
  """
  violations = []
  sources = [p for p in _python_files(PACKAGE) if "train" not in p.relative_to(PACKAGE).parts[:1]]
  sources += _python_files(ROOT / "experiments") + _python_files(ROOT / "benchmarks") + _python_files(ROOT / "tests")
  sources += [ROOT / "launch.py"]
  for path in sources:
    relative = path.relative_to(ROOT)
    if relative.parts[0] == "transformer":
      own = relative.parts[1] if len(relative.parts) > 2 else None
    elif relative.parts[0] == "tests" and len(relative.parts) > 2:
      own = relative.parts[1]  # tests/ops/... mirrors transformer/ops
    else:
      own = None
    for line, module, names in _imports(path):
      package = _project_package(module)
      if package is None or package == own or names is None:
        continue
      private = [name for name in names if name.startswith("_")]
      if private:
        violations.append(f"{relative}:{line} imports {', '.join(private)} from {module}")
    for line, module, use in _private_attribute_uses(path):
      if _project_package(module) not in (own, None):
        violations.append(f"{relative}:{line} uses {use} ({module})")
  assert not violations, "private names imported across packages:\n" + "\n".join(violations)


def test_the_checker_sees_a_violation(tmp_path):
  """The import parser finds both kinds of statement (so an empty result above means something)."""
  source = tmp_path / "module.py"
  source.write_text("import flax.linen as nn\nfrom transformer.tasks.seq2seq import _beam_decode\n"
                    "from transformer.tasks import seq2seq\nseq2seq._greedy_decode(None)\n")
  found = list(_imports(source))
  assert found == [(1, "flax.linen", None), (2, "transformer.tasks.seq2seq", ["_beam_decode"]),
                   (3, "transformer.tasks", ["seq2seq"])]
  assert list(_private_attribute_uses(source)) == [(4, "transformer.tasks.seq2seq", "seq2seq._greedy_decode")]
  assert _project_package("transformer.tasks.seq2seq") == "tasks"
  source.write_text("from ..tasks import seq2seq\nfrom . import layers\nfrom .attention import dot\n")
  assert list(_imports(source, package="transformer.nn")) == [
      (1, "transformer.tasks", ["seq2seq"]), (2, "transformer.nn", ["layers"]), (3, "transformer.nn.attention", ["dot"])]


def _module_name(path: pathlib.Path, base: pathlib.Path = ROOT) -> str:
  parts = path.relative_to(base).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_graph(root: pathlib.Path = PACKAGE) -> dict:
  """``module -> project modules it imports`` over every import statement of ``root``'s modules, those inside
  functions included (a lazy import only hides a circle). ``from package import name`` is an edge to the
  package's ``__init__`` and, when ``name`` is a module, to that module too."""
  modules = {_module_name(path, root.parent): path for path in _python_files(root)}
  graph = {}
  for module, path in modules.items():
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = set()
    for _, imported, names in _imports(path, package=package):
      targets |= {imported, *(f"{imported}.{name}" for name in names or [])}
    graph[module] = {target for target in targets if target in modules and target != module}
  return graph


def _circles(graph: dict) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
  index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph[start])))]
    index[start] = low[start] = counter
    counter += 1
    stack.append(start)
    on_stack.add(start)
    while work:
      node, edges = work[-1]
      for target in edges:
        if target not in index:
          index[target] = low[target] = counter
          counter += 1
          stack.append(target)
          on_stack.add(target)
          work.append((target, iter(sorted(graph[target]))))
          break
        if target in on_stack:
          low[node] = min(low[node], index[target])
      else:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[node])
        if low[node] == index[node]:
          component = []
          while True:
            member = stack.pop()
            on_stack.discard(member)
            component.append(member)
            if member == node:
              break
          if len(component) > 1:
            found.append(sorted(component))
  return found


def test_no_module_of_the_package_imports_itself_through_others():
  """A circle of imports (``writers -> transformer.train -> loop -> writers``) makes import order matter and
  hides which module is below which; none is allowed, a lazy import inside a function included."""
  assert _circles(_module_graph()) == []


def test_the_circle_finder_finds_a_circle_hidden_by_a_lazy_import(tmp_path):
  package = tmp_path / "transformer" / "train"
  package.mkdir(parents=True)
  (tmp_path / "transformer" / "__init__.py").write_text("")
  (package / "__init__.py").write_text("from transformer.train.loop import run\n")
  (package / "loop.py").write_text("from transformer.train import writers\n")
  (package / "writers.py").write_text("def write():\n  from transformer.train.loop import run\n")
  (package / "config.py").write_text("import json\n")
  assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert _circles(_module_graph(tmp_path / "transformer")) == [["transformer.train", "transformer.train.loop", "transformer.train.writers"]]


def test_the_run_layers_modules_are_those_the_code_map_names():
  """docs/development.md lists each module of ``transformer/train`` with its job: a module added, merged or
  renamed without the table is caught here, and the package stays at the dozen modules the design allows."""
  modules = sorted(path.stem for path in (PACKAGE / "train").glob("*.py") if path.stem != "__init__")
  text = (ROOT / "docs" / "development.md").read_text()
  listed = sorted(set(re.findall(r"^\| `([a-z_]+)\.py` \|", text, flags=re.M)))
  assert modules == listed
  assert len(modules) <= 12


@pytest.mark.slow  # a fresh interpreter
def test_importing_one_module_of_the_run_layer_pulls_in_neither_orbax_nor_the_loop():
  """``transformer.train``'s ``__init__`` is lazy: the typed run alone (what a script that reads a config needs)
  imports no checkpointing library and no training loop."""
  code = ("import sys, transformer.train.config\n"
          "print(sorted(m for m in sys.modules if m.startswith(('orbax', 'transformer.train.'))))")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
  assert result.stdout.strip() == "['transformer.train.config']", result.stdout


# What a synthetic copy run uses: 7 package __init__s and 41 modules, each with a function the run calls.
SYNTHETIC_RUN_MODULES = 48


@pytest.mark.slow  # a fresh interpreter that trains
def test_a_synthetic_run_imports_only_the_modules_it_uses(tmp_path):
  """Every other task, model family and data path stays unloaded (their imports are lazy or absent), and a new
  eager import on the run's path shows here as a count above the one written in ``SYNTHETIC_RUN_MODULES``."""
  from tests.train.conftest import TINY_FLAGS
  code = ("import runpy, sys\n"
          f"sys.argv = ['launch.py', '--config=experiments/synthetic.py:copy', '--workdir={tmp_path}', "
          f"*{TINY_FLAGS!r}, '--config.num_train_steps=2', '--config.quiet=True']\n"
          "try:\n  runpy.run_path('launch.py', run_name='__main__')\nexcept SystemExit as exit:\n"
          "  assert not exit.code, exit.code\n"
          "print(sorted(m for m in sys.modules if m == 'transformer' or m.startswith('transformer.')))")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  loaded = ast.literal_eval(result.stdout.strip().splitlines()[-1])
  unused = ("forecast", "classification", "pretrained", "rnn", "language_model", "translation", "tokenizers",
            "batching", "packing", "chunked", "series", "inference", "export", "progress")
  assert not [module for module in loaded if any(word in module for word in unused)], loaded
  assert len(loaded) <= SYNTHETIC_RUN_MODULES, f"{len(loaded)} modules: {loaded}"
