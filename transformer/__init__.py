"""A JAX/Flax Transformer research codebase: pure ops, thin Flax modules, one training system.

``from transformer import load`` gets a trained model back (``transformer.inference``); it is imported on
first use, so ``import transformer`` stays light (no JAX).

``lazy_exports`` is how this package and each subpackage do that (PEP 562): an ``__init__`` lists where each
public name lives and takes its module hooks from it, so importing one module of a package
(``transformer.ops.masks``, ``transformer.train.config``) does not import its siblings::

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {"attention": ("attend", "dot_product_attention")})

It lives here, in the module every import of the package runs anyway, and imports nothing of the project.
"""
from __future__ import annotations

import importlib
import sys

__version__ = "0.1.0"


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]):
  """``(__getattr__, __dir__, __all__)`` for ``package``: ``exports`` maps each submodule (a name relative to
  the package) to the public names it defines; a submodule's own name is public too (``ops.kernels``). The first
  use of a name imports its submodule and keeps the value in the package's namespace. Call it from the package's
  ``__init__``."""
  where = {name: submodule for submodule, names in exports.items() for name in names}
  # A name its submodule shares (``ops.dropout``, the function) is bound now: importing that submodule later would
  # bind the module itself to the package's attribute, where ``__getattr__`` is never asked.
  for name in [name for name, submodule in where.items() if name == submodule]:
    setattr(sys.modules[package], name, getattr(importlib.import_module(f"{package}.{name}"), name))

  def __getattr__(name: str):
    if name in where:
      value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
    elif name in exports:
      value = importlib.import_module(f"{package}.{name}")
    else:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    setattr(sys.modules[package], name, value)
    return value

  def __dir__() -> list[str]:
    return sorted(set(where) | set(exports) | set(vars(sys.modules[package])))

  return __getattr__, __dir__, sorted(where)


# submodule -> the names it exports here, imported on first use
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "inference": ("TrainedModel", "load", "load_params", "read_run_config"),
})
