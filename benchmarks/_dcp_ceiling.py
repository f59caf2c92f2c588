"""The two limits a bench_dcp.py run measures: s3sim's own (unshaped) ceiling and the shaped
lean-client limit.

**The server's ceiling** (issue 30): PUT and GET of large objects on a fresh, unshaped s3sim.

It runs :func:`benchmarks.s3sim.ceiling.run` (a fresh s3sim with shaping off, lean
``http.client`` clients in their own processes, no SDK, no signing, no checksums) with its
small-object phases skipped, so what a backend reaches can be read as a fraction of what
the server itself can move on this machine at this moment.

Decisions: the ceiling moves as many bytes as the state dict (at least 32 MiB) in objects
as large as one of the state dict's large tensors, capped at 64 MiB (client memory stays
bounded and each phase stays several requests long); two client processes, the ceiling
tool's default. bench_dcp.py measures it before the backends' runs and again after them;
the ratios use the higher of the two for each phase (:func:`best_ceiling`): a ceiling
disturbed by a busy moment would otherwise flatter every backend. A shape without large
tensors (``tiny``) gets 16 MiB objects.

**The shaped lean-client limit** (issue 40): :func:`measure_shaped_limit` runs
:func:`benchmarks.s3sim.ceiling.shaped_limit` against the benchmark's own s3sim (S3's shaping
on, as the backends face it) under a prefix of the benchmark's bucket: ``--limit-clients``
(default 14) lean client processes, one keep-alive connection each, 16 MiB preallocated bodies
whose PUTs carry their real CRC32C (``x-amz-checksum-crc32c``, as every backend's uploads do),
PUT then GET, about the state dict's bytes but at least one object per client; the objects are
deleted afterwards. It is the fair 100 %: what the leanest client gets through the same
latency, per-connection bandwidth and request rates. Measured before and after the backends,
the higher of each phase counts (:func:`best_ceiling` again).
"""

from __future__ import annotations

import time
from typing import Any

from _dcp_state import MiB, shape_numels, state_dict_mib

__all__ = [
    "CEILING_MAX_OBJECT_MIB",
    "LIMIT_CLIENTS",
    "LIMIT_OBJECT_MIB",
    "best_ceiling",
    "ceiling_sizes",
    "limit_sizes",
    "measure_ceiling",
    "measure_shaped_limit",
]

#: The largest object the ceiling PUTs and GETs, MiB.
CEILING_MAX_OBJECT_MIB = 64
#: The shaped limit's body size (MiB) and default client count.
LIMIT_OBJECT_MIB = 16
LIMIT_CLIENTS = 14


def ceiling_sizes(size_mib: int, shape: str) -> tuple[int, int]:
    """(object MiB, total MiB) for the ceiling of a ``size_mib`` state dict of ``shape``."""
    large_numel, _ = shape_numels(size_mib, shape)
    if not large_numel:  # no large tensors (tiny): the shaped limit's object size
        return LIMIT_OBJECT_MIB, 32
    object_mib = max(1, min(CEILING_MAX_OBJECT_MIB, large_numel * 4 // MiB))
    return object_mib, max(32, size_mib)


def limit_sizes(size_mib: int, shape: str, clients: int = LIMIT_CLIENTS) -> tuple[int, int, int]:
    """(object MiB, objects per client, MiB per phase) of the shaped limit: about the state
    dict's tensor bytes in 16 MiB objects, at least one per client."""
    from benchmarks.s3sim.ceiling import limit_layout

    total = max(clients * LIMIT_OBJECT_MIB, round(state_dict_mib(size_mib, shape)))
    per_client, phase_mib = limit_layout(clients, LIMIT_OBJECT_MIB, total)
    return LIMIT_OBJECT_MIB, per_client, phase_mib


def measure_shaped_limit(
    sim: Any, bucket: str, prefix: str, size_mib: int, shape: str,
    clients: int = LIMIT_CLIENTS,
) -> dict[str, Any]:
    """The shaped lean-client limit through ``sim`` (an :class:`~benchmarks.s3sim.S3Sim`, the
    benchmark's server) under ``bucket/prefix``: ``put_mb_per_s``, ``get_mb_per_s``, the
    sizes, the wall time and the tool's own result under ``detail``."""
    from benchmarks.s3sim import ceiling

    object_mib, _, phase_mib = limit_sizes(size_mib, shape, clients)
    t0 = time.perf_counter()
    res = ceiling.shaped_limit(sim, bucket, prefix, clients, object_mib, phase_mib)
    retried = res["put"]["retried_503"] + res["get"]["retried_503"]
    return _result(res, object_mib, clients, t0, checksum=res["checksum"], retried_503=retried)


def measure_ceiling(size_mib: int, shape: str, clients: int = 2) -> dict[str, Any]:
    """Run s3sim's ceiling (PUT then GET, shaping off) sized to the state dict.

    Returns ``put_mb_per_s``, ``get_mb_per_s``, the sizes, the wall time of the whole
    measurement (server start included) and the ceiling tool's own result under ``detail``.
    """
    from benchmarks.s3sim import ceiling

    object_mib, total_mib = ceiling_sizes(size_mib, shape)
    t0 = time.perf_counter()
    return _result(ceiling.run(clients, object_mib, total_mib, 0, 4), object_mib, clients, t0)


def _result(
    res: dict[str, Any], object_mib: int, clients: int, t0: float, **extra: Any
) -> dict[str, Any]:
    """What both measurements report: the PUT and GET rates, the sizes, ``extra``, the wall
    time since ``t0`` and the tool's own result under ``detail``."""
    return {
        "put_mb_per_s": res["put"]["mb_per_s"],
        "get_mb_per_s": res["get"]["mb_per_s"],
        "object_mib": object_mib,
        "total_mib": res["total_mib"],
        "clients": clients,
        **extra,
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
