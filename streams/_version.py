"""The release of streamledger: the one place its version is written (pyproject.toml reads it)."""

__version__ = "0.1.0"
