"""The one training system: ``run(config, workdir, mode)``; and getting a run back (``load_params``).

The names below import their module on first use, so importing one module of the package
(``transformer.train.config``) pulls in neither orbax nor the loop.
"""
from transformer import lazy_exports

# submodule -> the names it exports here, imported on first use
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "config": ("RunConfig", "base_config", "build_task", "validate_config"),
    "state": ("LoadedParams", "load_params", "read_run_config"),
    "loop": ("RunOutput",),
    "modes": ("run", "run_eval", "run_predict", "run_train", "run_translate"),
})
