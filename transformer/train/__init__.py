"""The one training system: ``run(config, workdir, mode)``; and getting a run back (``load_params``).

The names below are imported on first use, so importing one module of the package (``transformer.train.config``)
pulls in neither orbax nor the loop.
"""
_LAZY = {
    "RunConfig": "config", "base_config": "config", "build_task": "config", "validate_config": "config",
    "LoadedParams": "state", "load_params": "state", "read_run_config": "state",
    "RunOutput": "loop",
    "run": "modes", "run_eval": "modes", "run_predict": "modes", "run_train": "modes", "run_translate": "modes",
}


def __getattr__(name):
  if name in _LAZY:
    import importlib
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
  raise AttributeError(f"module 'transformer.train' has no attribute {name!r}")


__all__ = sorted(_LAZY)
