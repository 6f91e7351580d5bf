"""Benchmarks: one script per performance question, ``python -m benchmarks.<name>`` (see README.md)."""
