"""A JAX/Flax Transformer research codebase: pure ops, thin Flax modules, one training system."""
__version__ = "0.1.0"
