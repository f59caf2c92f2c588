"""Proxies for benchmarks/chaos.py classes 10 and 11: a store without conditional writes, and
replies cut inside their headers.

Both faults are FaultProxy kinds in :mod:`s3ckpt.testing`: ``"strip_conditions"`` removes
``If-None-Match`` / ``If-Match`` on the way upstream (moto then behaves as a store that ignores
them, as s3rver does), ``"cut_head"`` cuts a reply inside its headers. :func:`open_proxy`
arms them.
"""

from __future__ import annotations

from typing import Any

from tests.faultproxy import ALL_FAULT_KINDS, FaultProxy

__all__ = ["STRIP_KIND", "TRUNCATE_KIND", "open_proxy", "strip_kind", "truncate_kind"]

STRIP_KIND = "strip_conditions"
TRUNCATE_KIND = "cut_head"
assert STRIP_KIND in ALL_FAULT_KINDS and TRUNCATE_KIND in ALL_FAULT_KINDS


def strip_kind() -> str:
    """The FaultProxy kind that strips conditional headers."""
    return STRIP_KIND


def truncate_kind() -> str:
    """The FaultProxy kind that cuts a reply inside its headers."""
    return TRUNCATE_KIND


def open_proxy(
    upstream: str,
    *,
    strip: bool = False,
    cuts: list[dict[str, Any]] | None = None,
    hook: Any = None,
) -> tuple[FaultProxy, list[Any], str]:
    """A started proxy with ``strip`` and the reply cuts ``cuts`` (``op``, ``key_glob``,
    ``skip``, ``times``) armed; its arms; how the faults are made (for the notes).

    The cuts are armed first: an arm armed earlier wins a request both match, so a cut
    conditional request is cut, not stripped.
    """
    proxy = FaultProxy(upstream, fault_rate=0.0, hook=hook)
    proxy.start()
    arms: list[Any] = []
    for c in cuts or []:
        arms.append(
            proxy.arm(
                c["op"],
                TRUNCATE_KIND,
                key_glob=c.get("key_glob", "*"),
                skip=c.get("skip", 0),
                times=c.get("times", 1),
            )
        )
    if strip:
        arms.append(proxy.arm("*", STRIP_KIND, conditional=True, times=10**9))
    how = " + ".join(
        f"FaultProxy kind {k!r}" for k, on in ((STRIP_KIND, strip), (TRUNCATE_KIND, cuts)) if on
    )
    return proxy, arms, how
