"""``quiet_dcp``: silence DCP's warning for loads and saves run in one process on purpose."""

from __future__ import annotations

import warnings

__all__ = ["quiet_dcp"]


class _Quiet(warnings.catch_warnings):
    def __enter__(self) -> None:
        super().__enter__()
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def quiet_dcp() -> warnings.catch_warnings:
    """A context that silences DCP's "torch.distributed is disabled" warning (the tools
    load in one process on purpose)."""
    return _Quiet()
