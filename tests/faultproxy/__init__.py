"""The fault-injecting S3 proxy that s3ckpt's tests and benchmarks run behind (not shipped
in the wheel): lost replies, resets, 503 SlowDown, stalls, stripped conditions. See
README.md in this folder.

Modules: ``_faultproxy`` (the server, ``FaultProxy``), ``_connection`` (one connection),
``_http1`` (framing), ``_sockets``, ``_s3ops`` (``classify``), ``_faults`` (kinds, arms, the
draw) and ``_s3errors`` (made-up error replies). Stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from s3ckpt.testing import LocalS3
from s3ckpt.testing._server import patched_env
from tests.faultproxy._faultproxy import FaultProxy
from tests.faultproxy._faults import ALL_FAULT_KINDS, FAULT_KINDS, Arm, Hook
from tests.faultproxy._s3ops import OPERATIONS, classify

__all__ = [
    "ALL_FAULT_KINDS",
    "FAULT_KINDS",
    "OPERATIONS",
    "Arm",
    "FaultProxy",
    "Hook",
    "classify",
    "fault_proxy",
]


@contextmanager
def fault_proxy(s3: LocalS3, **options: Any) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` in front of ``s3``'s server, with ``AWS_ENDPOINT_URL`` pointed
    at it for the block (restored after). ``options`` are FaultProxy's, except that
    ``fault_rate`` defaults to 0: nothing fails until a fault is armed or the rate raised.

    Open the stores and Checkpointers that should go through the proxy inside the block: a
    store keeps the client it made first. ``s3.client()`` still talks to the server directly.
    """
    options.setdefault("fault_rate", 0.0)
    with (
        FaultProxy(s3.endpoint_url, **options) as proxy,
        patched_env({"AWS_ENDPOINT_URL": proxy.endpoint_url}),
    ):
        yield proxy
