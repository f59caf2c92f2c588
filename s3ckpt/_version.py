"""The installed package's version: a leaf module any layer may import.

Single-sourced from the package metadata (``pyproject.toml``'s ``version``, recorded at
install). A source tree used without installing (``PYTHONPATH=.``) has no metadata; it
reports ``0+unknown`` rather than a number that may be stale.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__: str = version("s3ckpt")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"
