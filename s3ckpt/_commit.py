"""Pieces of the commit protocol shared by the writer, the reader and gc (torch-free).

The protocol itself is written down in ``docs/dcp.md`` ("The commit protocol"). What lives
here is what more than one party needs:

* :class:`Heartbeat` — a save is visibly alive: each writing rank PUTs
  ``s3ckpt.alive.{tag}.{rank}`` every :data:`~s3ckpt.format.HEARTBEAT_INTERVAL` seconds
  while it uploads, so prune and gc, which measure grace from the newest activity of a
  save's tag, never take a running save for a dead one.
* :func:`writer_gone` — a heartbeat whose writing process ran on this host and is gone
  proves its save dead at once (restic's rule for stale locks), so gc need not wait out the
  grace period after a killed save on the same machine.
* :func:`read_marker` — the commit marker and its ETag, read back (how an unknown outcome
  is decided).
* :func:`restore_stock_metadata` — the roll-forward of a commit that was interrupted
  after its marker: the plain ``.metadata`` stock DCP readers use becomes a copy of the
  committed ``.metadata.{tag}`` again.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time

from s3ckpt import _crc
from s3ckpt.errors import CorruptCheckpointError, ObjectNotFoundError, S3CkptError
from s3ckpt.format import (
    HEARTBEAT_INTERVAL,
    MANIFEST_NAME,
    METADATA_NAME,
    Manifest,
    heartbeat_name,
)
from s3ckpt.metrics.instrument import in_context
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

# A generator of its own: drawing from the global ``random`` would move a training job's
# Python RNG with every save, and a resumed run would no longer repeat the interrupted one.
_JITTER = random.Random()

__all__ = [
    "Heartbeat",
    "check_metadata",
    "metadata_matches",
    "process_gone",
    "read_marker",
    "restore_stock_metadata",
    "writer_gone",
]

log = logging.getLogger(__name__)


def pid_namespace() -> str:
    """This process's PID namespace (``""`` where /proc does not say)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists in this PID namespace (True when unsure)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists but not ours to signal, or cannot tell: alive
    return True


def process_gone(host: str, pidns: str, pid: int) -> bool:
    """Whether process ``pid`` of ``host`` / ``pidns`` provably no longer exists: only
    decidable on that same host and PID namespace (a reused pid reads as alive: the safe
    side)."""
    return (
        bool(pidns)
        and pid > 0
        and host == socket.gethostname()
        and pidns == pid_namespace()
        and pid != os.getpid()
        and not pid_alive(pid)
    )


def heartbeat_body(tag: str, rank: int, step: int | None) -> bytes:
    """What a heartbeat object holds: liveness is its LastModified; host, PID namespace and
    pid let :func:`writer_gone` prove a killed writer dead at once on the same host."""
    doc = {
        "tag": tag,
        "rank": rank,
        "step": step,
        "host": socket.gethostname(),
        "pidns": pid_namespace(),
        "pid": os.getpid(),
        "interval": HEARTBEAT_INTERVAL,
        "time": time.time(),
    }
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def writer_gone(raw: bytes) -> bool:
    """Whether the heartbeat body ``raw`` names a writing process that is provably gone.

    A save whose rank died can never commit (the coordinator's gather waits for every
    rank; a dead coordinator commits nothing), so one such heartbeat proves the save dead.
    Anything unreadable proves nothing.
    """
    try:
        doc = json.loads(raw.decode("utf-8"))
        return process_gone(str(doc["host"]), str(doc["pidns"]), int(doc["pid"]))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        return False


class Heartbeat:
    """Beats ``s3ckpt.alive.{tag}.{rank}`` under ``url`` from a daemon thread until stopped.

    The first beat comes after one interval (with jitter): the coordinator beats once
    before any data is written, so thousands of ranks need not PUT at the same instant.
    A failed beat is logged and retried at the next interval; it never fails the save (the
    save's own requests will fail if the store is gone).

    Args:
        store: Where to beat.
        url: The checkpoint prefix.
        tag: The save's tag (see :func:`~s3ckpt.format.save_tag`).
        rank: The beating rank.
        step: Recorded in the body, for people.
        interval: Seconds between beats.
    """

    def __init__(
        self,
        store: ObjectStore,
        url: StoreURL,
        tag: str,
        rank: int,
        step: int | None = None,
        *,
        interval: float = HEARTBEAT_INTERVAL,
    ) -> None:
        self.store = store
        self.key = url.key(heartbeat_name(tag, rank))
        self._tag = tag
        self._rank = rank
        self._step = step
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.beats = 0

    def beat(self) -> None:
        """One PUT of the heartbeat object now (raises what the store raises)."""
        self.store.put(self.key, heartbeat_body(self._tag, self._rank, self._step))
        self.beats += 1

    def start(self) -> Heartbeat:
        """Start beating in the background."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=in_context(self._run), name=f"s3ckpt-heartbeat-{self._rank}", daemon=True
            )
            self._thread.start()
        return self

    def _run(self) -> None:
        wait = self._interval * (0.5 + _JITTER.random() / 2)
        while not self._stop.wait(wait):
            try:
                self.beat()
            except S3CkptError as exc:
                log.warning("s3ckpt: heartbeat %s failed (retrying): %s", self.key, exc)
            wait = self._interval

    def stop(self) -> None:
        """Stop beating (waits for a beat in flight)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_marker(store: ObjectStore, url: StoreURL) -> tuple[Manifest, str | None] | None:
    """The committed manifest at ``url`` and the marker's ETag, or None when uncommitted.

    Request cost: one HEAD and one GET. The ETag is for a compare-and-swap (If-Match) of
    the marker; if the marker changes between the two requests the swap fails, which is
    the safe side.
    """
    key = url.key(MANIFEST_NAME)
    info = store.head(key)
    if info is None:
        return None
    try:
        raw = store.get(key)
    except ObjectNotFoundError:
        return None
    return Manifest.from_json(raw, where=key), info.etag


def restore_stock_metadata(store: ObjectStore, ckpt: StoreURL, manifest: Manifest) -> None:
    """Make ``{ckpt}/.metadata`` a copy of the committed ``manifest.metadata_key``.

    The roll-forward of a commit interrupted after its marker (a kill before the copy, or
    an overwrite whose old ``.metadata`` is still in place): stock DCP readers then read
    the committed save, not the replaced one. The source is checked against the manifest
    first, so a damaged source is never published.

    Raises:
        CorruptCheckpointError: the committed metadata object is missing or damaged.

    Request cost: one GET and one PUT.
    """
    if manifest.metadata_key == METADATA_NAME:
        return  # a format-1 commit: the plain .metadata is the committed object itself
    key = ckpt.key(manifest.metadata_key)
    try:
        raw: bytes | None = store.get(key)
    except ObjectNotFoundError:
        raw = None
    check_metadata(raw, manifest, bucket=store.bucket, key=key)
    assert raw is not None
    store.put(ckpt.key(METADATA_NAME), raw, crc32c=manifest.metadata_crc32c)


def metadata_matches(raw: bytes | None, manifest: Manifest) -> bool:
    """Whether ``raw`` is the ``.metadata`` the manifest commits (its size and CRC32C)."""
    return (
        raw is not None
        and len(raw) == manifest.metadata_size
        and _crc.crc32c(raw) == manifest.metadata_crc32c
    )


def check_metadata(raw: bytes | None, manifest: Manifest, *, bucket: str, key: str) -> None:
    """Raise :class:`CorruptCheckpointError` naming ``key`` unless ``raw`` (None: missing)
    is the ``.metadata`` the manifest commits."""
    name = key.rpartition("/")[2]
    if raw is None:
        raise CorruptCheckpointError(
            f"{MANIFEST_NAME} commits {name}, which is missing; the checkpoint was partly "
            "deleted. Load an earlier checkpoint",
            bucket=bucket,
            key=key,
        )
    if not metadata_matches(raw, manifest):
        crc = _crc.crc32c(raw)
        raise CorruptCheckpointError(
            f"{name} does not match the one {MANIFEST_NAME} committed (size {len(raw)} vs "
            f"{manifest.metadata_size}, crc32c {crc:08x} vs {manifest.metadata_crc32c:08x}); "
            "it was changed after the commit",
            bucket=bucket,
            key=key,
        )
