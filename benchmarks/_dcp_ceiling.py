"""s3sim's own ceiling, measured inside a bench_dcp.py run: PUT and GET of large objects.

It runs :func:`benchmarks.s3sim.ceiling.run` (a fresh s3sim with shaping off, lean
``http.client`` clients in their own processes, no SDK, no signing, no checksums) with its
small-object phases skipped, so what a backend reaches can be read as a fraction of what
the server itself can move on this machine at this moment.

Decisions: the ceiling moves as many bytes as the state dict (at least 32 MiB) in objects
as large as one of the state dict's large tensors, capped at 64 MiB (client memory stays
bounded and each phase stays several requests long); two client processes, the ceiling
tool's default. bench_dcp.py measures it before the backends' runs and again after them;
the ratios use the higher of the two for each phase (:func:`best_ceiling`): a ceiling
disturbed by a busy moment would otherwise flatter every backend.
"""

from __future__ import annotations

import time
from typing import Any

from _dcp_state import MiB, shape_numels

__all__ = ["CEILING_MAX_OBJECT_MIB", "best_ceiling", "ceiling_sizes", "measure_ceiling"]

#: The largest object the ceiling PUTs and GETs, MiB.
CEILING_MAX_OBJECT_MIB = 64


def ceiling_sizes(size_mib: int, shape: str) -> tuple[int, int]:
    """(object MiB, total MiB) for the ceiling of a ``size_mib`` state dict of ``shape``."""
    large_numel, _ = shape_numels(size_mib, shape)
    object_mib = max(1, min(CEILING_MAX_OBJECT_MIB, large_numel * 4 // MiB))
    return object_mib, max(32, size_mib)


def measure_ceiling(size_mib: int, shape: str, clients: int = 2) -> dict[str, Any]:
    """Run s3sim's ceiling (PUT then GET, shaping off) sized to the state dict.

    Returns ``put_mb_per_s``, ``get_mb_per_s``, the sizes, the wall time of the whole
    measurement (server start included) and the ceiling tool's own result under ``detail``.
    """
    from benchmarks.s3sim import ceiling

    object_mib, total_mib = ceiling_sizes(size_mib, shape)
    t0 = time.perf_counter()
    res = ceiling.run(clients, object_mib, total_mib, 0, 4)
    return {
        "put_mb_per_s": res["put"]["mb_per_s"],
        "get_mb_per_s": res["get"]["mb_per_s"],
        "object_mib": object_mib,
        "total_mib": res["total_mib"],
        "clients": clients,
        "measure_s": round(time.perf_counter() - t0, 2),
        "detail": res,
    }


def best_ceiling(measured: list[dict[str, Any]]) -> dict[str, float] | None:
    """The higher PUT and the higher GET MB/s of the ceilings measured; None when none was."""
    if not measured:
        return None
    return {
        "put_mb_per_s": max(m["put_mb_per_s"] for m in measured),
        "get_mb_per_s": max(m["get_mb_per_s"] for m in measured),
    }
