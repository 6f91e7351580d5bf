"""The one training system: ``run(config, workdir, mode)``."""
from transformer.train.config import base_config, validate_config
from transformer.train.loop import run

__all__ = ["base_config", "run", "validate_config"]
