"""The one training system: ``run(config, workdir, mode)``; and getting a run back (``load_params``)."""
from transformer.train.config import base_config, validate_config
from transformer.train.loop import RunOutput, run_train
from transformer.train.modes import run, run_eval, run_predict, run_translate
from transformer.train.run_config import RunConfig, build_task
from transformer.train.saved_run import LoadedParams, load_params, read_run_config

__all__ = ["LoadedParams", "RunConfig", "RunOutput", "base_config", "build_task", "load_params", "read_run_config",
           "run", "run_eval", "run_predict", "run_train", "run_translate", "validate_config"]
