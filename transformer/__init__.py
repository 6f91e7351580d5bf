"""A JAX/Flax Transformer research codebase: pure ops, thin Flax modules, one training system.

``from transformer import load`` gets a trained model back (``transformer.inference``); it is imported on
first use, so ``import transformer`` stays light (no JAX).
"""
__version__ = "0.1.0"

_LAZY = {"load": "transformer.inference", "load_params": "transformer.inference",
         "read_run_config": "transformer.inference", "TrainedModel": "transformer.inference"}


def __getattr__(name):
  if name in _LAZY:
    import importlib
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'transformer' has no attribute {name!r}")


__all__ = ["TrainedModel", "load", "load_params", "read_run_config"]
