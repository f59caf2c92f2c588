"""The fault proxy's faults: the kinds, the arms that aim them, the random draw, the counts.

The kinds (:data:`ALL_FAULT_KINDS`; a proxy draws from :data:`FAULT_KINDS` by default):

``"slowdown"``
    ``503 SlowDown`` with an S3 XML error body; the request is not forwarded.
``"internal"``
    ``500 InternalError`` with an S3 XML error body; not forwarded.
``"reset"``
    the request is read completely and the TCP connection is then aborted
    with a RST (``SO_LINGER`` 0) without any response; not forwarded.
``"reset_mid_body"``
    the request *is* forwarded and executed upstream; the response status
    line, headers and only part of the body are sent to the client before
    the connection is aborted with a RST.  Only applies to responses that
    have a body; bodiless responses are delivered normally and the fault is
    not counted.
``"lost_reply"``
    the request *is* forwarded and applied upstream and the complete
    response is read from upstream, then the client connection is aborted
    with a RST without a single response byte: the client cannot tell
    whether its request took effect.
``"stall"``
    the request is read but not forwarded; nothing is sent back and the
    connection is held open until the client closes it or the proxy stops
    (a black-holed endpoint: the client must hit its read timeout).
``"stall_after"``
    like ``"stall"``, but the request is forwarded and applied upstream
    first (its response is read and dropped).
``"cut_head"``
    the request is forwarded and applied upstream and the complete response
    is read from upstream; the client then gets the status line and only the
    reply's generic headers (``Date``, ``Server``, request ids,
    ``Content-Type``), never the end of the header block, and the connection
    closes (FIN): a reply cut inside its headers, without the ``ETag``,
    ``Content-Length``, checksums or body that carry the result.
``"flip_byte"``
    the request is forwarded with one byte of its body flipped (the middle
    byte, XOR 0xFF) and the reply is relayed unchanged: corruption in
    transit that only a store verifying checksums notices. Only applies to
    requests with a ``Content-Length`` body; others are forwarded intact and
    the fault is not counted.
``"strip_conditions"``
    the request is forwarded without its ``If-None-Match`` / ``If-Match``
    headers and the reply relayed unchanged: the upstream then behaves as a
    store that ignores conditional writes (s3rver, old MinIO). Only counted
    on requests that carry one; an upstream checking SigV4 signatures (not
    moto) refuses the altered request.
``"not_implemented"``
    ``501 NotImplemented`` with an S3 XML error body; not forwarded (arm it
    on ``ListMultipartUploads`` for a store without it, as s3rver).
``"denied"``
    ``403 AccessDenied`` with an S3 XML error body; not forwarded (a policy that refuses
    the operation: arm it on ``DeleteObjects`` for a role without ``s3:DeleteObject``).
``"drip"``
    the request is forwarded and applied upstream; the response head is
    relayed at once, then its body one byte per second (a reply that a
    per-read timeout never ends) until it is all sent, the client closes
    or the proxy stops. Only applies to responses with a body.

Which fault a request gets is decided once, when its head is in (:meth:`Injector.decide`):
an :class:`Arm` that matches it first, else the random draw. The draw comes from
``random.Random(seed)`` under a lock, so a single-threaded client sees a reproducible fault
sequence; one number is drawn for every request (armed, filtered out by ``ops`` or not), so
arming a fault does not shift the random sequence of the rest.
"""

from __future__ import annotations

import fnmatch
import random
import threading
from collections.abc import Callable

from tests.faultproxy._s3ops import OPERATIONS

__all__ = [
    "ALL_FAULT_KINDS",
    "FAULT_KINDS",
    "LOCAL_FAULTS",
    "REPLY_FAULTS",
    "Arm",
    "Hook",
    "Injector",
    "Pending",
    "Stats",
    "check_rate",
]

FAULT_KINDS: tuple[str, ...] = ("slowdown", "internal", "reset", "reset_mid_body")
"""The kinds a proxy draws from by default (unchanged, so seeded sequences stay put)."""

ALL_FAULT_KINDS: tuple[str, ...] = (
    *FAULT_KINDS,
    "lost_reply",
    "stall",
    "stall_after",
    "cut_head",
    "flip_byte",
    "strip_conditions",
    "not_implemented",
    "denied",
    "drip",
)
"""Every fault kind the proxy can inject."""

LOCAL_FAULTS = frozenset({"slowdown", "internal", "reset", "stall", "not_implemented", "denied"})
"""Faults answered without forwarding the request upstream."""

REPLY_FAULTS = frozenset({"lost_reply", "stall_after", "cut_head"})
"""Faults applied once the upstream response head is in."""

Hook = Callable[[str, str, str], None]
"""``hook(op, key, phase)``: see :class:`FaultProxy`."""


def check_rate(rate: float) -> None:
    """Refuse a fault rate outside [0, 1] (``ValueError``)."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"fault_rate must be within [0, 1], got {rate!r}")


class Arm:
    """A deterministic fault: see :meth:`FaultProxy.arm`. Counters are live."""

    def __init__(
        self,
        op: str,
        kind: str,
        *,
        times: int,
        skip: int,
        key_glob: str,
        conditional: bool | None,
    ) -> None:
        self.op = op
        self.kind = kind
        self.times = times
        self.skip = skip
        self.key_glob = key_glob
        self.conditional = conditional
        self._seen = 0
        self._hits = 0
        self._active = True

    @property
    def seen(self) -> int:
        """Matching requests so far (fired or not)."""
        return self._seen

    @property
    def hits(self) -> int:
        """How many times the fault was actually injected."""
        return self._hits

    @property
    def exhausted(self) -> bool:
        """Whether every request in the arm's window has gone past."""
        return self._seen >= self.skip + self.times

    def _matches(self, op: str, key: str, conditional: bool) -> bool:
        return (
            self._active
            and (self.op == "*" or self.op == op)
            and (self.conditional is None or self.conditional == conditional)
            and fnmatch.fnmatchcase(key, self.key_glob)
        )

    def __repr__(self) -> str:
        return (
            f"Arm(op={self.op!r}, kind={self.kind!r}, times={self.times}, skip={self.skip}, "
            f"key_glob={self.key_glob!r}, conditional={self.conditional}, "
            f"seen={self._seen}, hits={self._hits})"
        )


class Pending:
    """A fault decided for the current request (armed, or drawn at random)."""

    __slots__ = ("arm", "kind")

    def __init__(self, kind: str, arm: Arm | None) -> None:
        self.kind = kind
        self.arm = arm


class Stats(dict[str, int]):
    """Counter snapshot: a key never counted reads as 0 (e.g. ``op:HeadObject``)."""

    def __missing__(self, key: str) -> int:
        return 0


class Injector:
    """Decides which fault, if any, each request gets, and keeps the proxy's counters.

    The counters share the decisions' lock: a request is counted in the same step that
    decides its fault. A random fault is *reserved* when drawn (``max_faults`` counts
    reservations) and then committed (counted) once applied, or cancelled when it did
    not apply (``reset_mid_body`` on a bodiless reply); an armed one uses up its slot
    either way. Arguments are checked by :class:`FaultProxy`, which owns one of these.
    """

    def __init__(
        self,
        faults: tuple[str, ...],
        fault_rate: float,
        seed: int,
        max_faults: int | None,
        ops: frozenset[str] | None,
    ) -> None:
        self._faults = faults
        self._fault_rate = float(fault_rate)
        self._max_faults = max_faults
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._reserved = 0  # random faults decided (possibly not yet applied)
        self._ops = ops
        self._arms: list[Arm] = []
        self._stats: dict[str, int] = dict.fromkeys(
            ("requests", "forwarded", "faults", *FAULT_KINDS), 0
        )

    @property
    def stats(self) -> Stats:
        """Snapshot of the counters; missing keys read as 0."""
        with self._lock:
            return Stats(self._stats)

    def arm(
        self,
        op: str,
        kind: str,
        *,
        times: int,
        skip: int,
        key_glob: str,
        conditional: bool | None,
    ) -> Arm:
        """Check and add an arm (see :meth:`FaultProxy.arm`)."""
        if op != "*" and op not in OPERATIONS:
            raise ValueError(f"unknown operation {op!r}; known: {OPERATIONS} or '*'")
        if kind not in ALL_FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {ALL_FAULT_KINDS}")
        if times < 1 or skip < 0:
            raise ValueError("arm needs times >= 1 and skip >= 0")
        armed = Arm(op, kind, times=times, skip=skip, key_glob=key_glob, conditional=conditional)
        with self._lock:
            self._arms.append(armed)
        return armed

    def disarm(self, armed: Arm | None = None) -> None:
        """Remove one arm (or, with no argument, every arm)."""
        with self._lock:
            for a in self._arms if armed is None else [armed]:
                a._active = False
            self._arms = [] if armed is None else [a for a in self._arms if a is not armed]

    @property
    def fault_rate(self) -> float:
        """The probability of a random fault per request."""
        with self._lock:
            return self._fault_rate

    def set_fault_rate(self, rate: float) -> None:
        """Change the fault probability for subsequent requests (thread-safe)."""
        check_rate(rate)
        if rate > 0 and not self._faults:
            raise ValueError("fault_rate > 0 needs at least one fault kind")
        with self._lock:
            self._fault_rate = float(rate)

    def bump(self, key: str) -> None:
        """Count one more ``key`` (``forwarded``, ``hook_errors``)."""
        with self._lock:
            self._stats[key] = self._stats.get(key, 0) + 1

    def decide(self, op: str, key: str, conditional: bool) -> Pending | None:
        """Count a request and decide whether (and which) fault to inject."""
        with self._lock:
            self._stats["requests"] += 1
            op_key = f"op:{op}"
            self._stats[op_key] = self._stats.get(op_key, 0) + 1
            # Drawn for every request, so arms and ops= do not shift the sequence.
            roll = self._rng.random()
            kind = self._rng.choice(self._faults) if self._faults else None
            chosen: Arm | None = None
            for armed in self._arms:
                if armed._matches(op, key, conditional):
                    armed._seen += 1
                    if chosen is None and armed.skip < armed._seen <= armed.skip + armed.times:
                        chosen = armed
            if chosen is not None:
                return Pending(chosen.kind, chosen)
            if roll >= self._fault_rate or kind is None:
                return None
            if self._ops is not None and op not in self._ops:
                return None
            if self._max_faults is not None and self._reserved >= self._max_faults:
                return None
            self._reserved += 1
            return Pending(kind, None)

    def commit(self, pending: Pending) -> None:
        """Count ``pending`` as injected."""
        with self._lock:
            self._stats[pending.kind] = self._stats.get(pending.kind, 0) + 1
            self._stats["faults"] += 1
            if pending.arm is not None:
                pending.arm._hits += 1

    def cancel(self, pending: Pending) -> None:
        """Release the reservation of a random ``pending`` fault that did not apply."""
        if pending.arm is not None:
            return  # an armed slot is used up either way (see FaultProxy.arm)
        with self._lock:
            self._reserved -= 1
