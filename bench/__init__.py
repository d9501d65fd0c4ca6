"""Benchmarks: ``python -m bench streams``."""
