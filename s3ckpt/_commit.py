"""Pieces of the commit protocol shared by the writer, the reader and gc (torch-free).

The protocol itself is written down in ``docs/dcp.md`` ("The commit protocol"). What lives
here is what more than one party needs:

* :class:`Heartbeat` — a save is visibly alive: each writing rank PUTs
  ``s3ckpt.alive.{tag}.{rank}`` every :data:`~s3ckpt.format.HEARTBEAT_INTERVAL` seconds
  while it uploads, so prune and gc, which measure grace from the newest activity of a
  save's tag, never take a running save for a dead one.
* :func:`writer_gone` — a heartbeat whose writing process ran on this boot of this host
  and is gone proves its save dead at once (restic's rule for stale locks), so gc need not
  wait out the grace period after a killed save on the same machine. "This host" is proven
  by the kernel's boot id, not the hostname (fleets reuse hostnames, and the initial PID
  namespace id is the same constant on every Linux host), and "gone" by the pid's absence
  or by another process holding it now (its start time differs): see :func:`process_gone`.
* :func:`record_failure` — a save that failed where s3ckpt saw it fail says so
  (``s3ckpt.failed.{tag}.{rank}``), so ``ls`` shows it failed and gc need not wait out the
  grace period either; a commit marker always wins over such a record.
* :func:`read_marker` — the commit marker and its ETag, read back (how an unknown outcome
  is decided).
* :func:`restore_stock_metadata` — the roll-forward of a commit that was interrupted
  after its marker: the plain ``.metadata`` stock DCP readers use becomes a copy of the
  committed ``.metadata.{tag}`` again.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import asdict, dataclass
from typing import TypeVar

from s3ckpt import _crc
from s3ckpt.errors import (
    CheckpointExistsError,
    CorruptCheckpointError,
    ObjectNotFoundError,
    S3CkptError,
)
from s3ckpt.format._manifest import Manifest
from s3ckpt.format._names import (
    HEARTBEAT_INTERVAL,
    MANIFEST_NAME,
    METADATA_NAME,
    failure_name,
    heartbeat_name,
)
from s3ckpt.metrics.instrument import expecting, in_context
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

# A generator of its own: drawing from the global ``random`` would move a training job's
# Python RNG with every save, and a resumed run would no longer repeat the interrupted one.
_JITTER = random.Random()

__all__ = [
    "Heartbeat",
    "Identity",
    "at_once",
    "boot_id",
    "check_metadata",
    "describe_failure",
    "failure_reason",
    "get_or_none",
    "identity",
    "lost_race_error",
    "metadata_matches",
    "process_gone",
    "process_start",
    "read_items",
    "read_marker",
    "record_failure",
    "restore_stock_metadata",
    "writer_gone",
    "writer_record",
]

log = logging.getLogger(__name__)

_A = TypeVar("_A")
_B = TypeVar("_B")

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def pid_namespace() -> str:
    """This process's PID namespace (``""`` where /proc does not say)."""
    with suppress(OSError):
        return os.readlink("/proc/self/ns/pid")
    return ""


@functools.cache  # read once: a process never changes boots
def boot_id() -> str:
    """This boot of this host: ``/proc/sys/kernel/random/boot_id`` (``""`` where there is
    none). Unlike a hostname it is never shared by two machines, and it changes on reboot,
    when every pid of the previous boot is gone."""
    with suppress(OSError, UnicodeDecodeError), open(_BOOT_ID, encoding="ascii") as f:
        return f.read().strip()
    return ""


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (field 22 of
    ``/proc/<pid>/stat``); None when it does not exist or /proc does not say. Together with
    the boot id it names one process: a pid reused later starts later."""
    # Field 2 (the command) is in parentheses and may hold spaces or ")": split after the
    # last ")". Field 3 is then the first, so field 22 is the 20th.
    with suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rpartition(b")")[2].split()[19])
    return None


def process_gone(host: str, pidns: str, pid: int, boot: str = "", start: int | None = None) -> bool:
    """Whether the process ``pid`` (of ``host``, boot ``boot``, PID namespace ``pidns``,
    started at ``start`` clock ticks after boot) provably no longer exists.

    Only decidable on the same boot of the same machine (boot id, hostname and PID
    namespace all ours): there, a pid that does not exist is gone, and so is one that
    exists with another start time (the pid was reused; that process is not the writer).
    Anything missing (a record without a boot id or a pid namespace, no /proc) proves
    nothing: the caller's grace period decides.
    """
    here = (boot_id(), pid_namespace(), socket.gethostname())
    if not (boot and pidns and pid > 0 and (boot, pidns, host) == here):
        return False
    try:
        os.kill(pid, 0)  # whether it exists in this PID namespace
    except ProcessLookupError:
        return True
    except OSError:
        pass  # exists but not ours to signal, or cannot tell: alive
    # Alive, and with no start time nothing says it is another process: the safe side.
    return start is not None and process_start(pid) not in (None, start)


@dataclass(frozen=True)
class Identity:
    """A process as heartbeats and leases record it (see :func:`process_gone`)."""

    host: str
    boot: str
    pidns: str
    pid: int
    start: int | None


def identity() -> Identity:
    """This process's :class:`Identity`."""
    pid = os.getpid()
    return Identity(socket.gethostname(), boot_id(), pid_namespace(), pid, process_start(pid))


JOB_VARIABLES = ("S3CKPT_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
# Where a writer's job id comes from, the first one set (``Manifest.writer["job"]``).


def writer_record() -> dict[str, str]:
    """Who commits a marker: ``host``, ``pid`` and ``job`` (from :data:`JOB_VARIABLES`)."""
    job = next((os.environ[v] for v in JOB_VARIABLES if os.environ.get(v)), "")
    return {"host": socket.gethostname(), "pid": str(os.getpid()), "job": job}


def lost_race_error(
    url: StoreURL, winner: Manifest | None, why: str, *, bucket: str, rank: int | None
) -> CheckpointExistsError:
    """The error of a save that found another save's marker at ``url`` (``winner``, when
    read): who committed it, and what to do. Only a marker this job wrote (same job id, or
    this very process) is the user's own checkpoint that ``overwrite=True`` replaces."""
    me, them = writer_record(), dict(winner.writer) if winner is not None else {}
    who = ", ".join(f"{k} {v!r}" for k, v in them.items() if v) or "an unknown writer"
    if them and _job(them) == _job(me):
        message = (
            f"this job already committed {url} ({why}); this save was discarded. Pass "
            "overwrite=True to replace it, or save under another step"
        )
    else:
        message = (
            f"another writer committed {url} first ({why}: {who}); this save was discarded "
            "and the other checkpoint is untouched. Two jobs are saving to one run: stop the "
            "other job, or save under another run URL or step"
        )
    return CheckpointExistsError(message, bucket=bucket, key=url.key(MANIFEST_NAME), rank=rank)


def _job(record: dict[str, str]) -> str:
    return record.get("job") or f"{record.get('host')}:{record.get('pid')}"


def heartbeat_body(tag: str, rank: int, step: int | None) -> bytes:
    """What a heartbeat object holds: liveness is its LastModified; host, boot id, PID
    namespace, pid and start time let :func:`writer_gone` prove a killed writer dead at
    once on the same boot of the same host."""
    return _record(tag=tag, rank=rank, step=step, interval=HEARTBEAT_INTERVAL)


def _record(**fields: object) -> bytes:
    """A heartbeat's or failure record's JSON body: ``fields``, this process's
    :class:`Identity` and the time."""
    doc = {**fields, **asdict(identity()), "time": time.time()}
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def writer_gone(raw: bytes) -> bool:
    """Whether the heartbeat body ``raw`` names a writing process that is provably gone.

    A dead coordinator commits nothing, so its heartbeat proves the save dead
    (:func:`s3ckpt.retention._liveness.dead_saves` reads only the coordinator's). Anything
    unreadable proves nothing.
    """
    with suppress(ValueError, KeyError, TypeError, AttributeError):  # ValueError: bad UTF-8 too
        doc = json.loads(raw.decode("utf-8"))
        boot = str(doc.get("boot") or "")  # older writers recorded none: nothing provable
        start = None if doc.get("start") is None else int(doc["start"])
        return process_gone(str(doc["host"]), str(doc["pidns"]), int(doc["pid"]), boot, start)
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
    """

    def __init__(
        self, store: ObjectStore, url: StoreURL, tag: str, rank: int, step: int | None = None
    ) -> None:
        self.store, self.key = store, url.key(heartbeat_name(tag, rank))
        self._tag, self._rank, self._step = tag, rank, step
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """One PUT of the heartbeat object now (raises what the store raises)."""
        self.store.put(self.key, heartbeat_body(self._tag, self._rank, self._step))

    def start(self) -> Heartbeat:
        """Start beating in the background."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=in_context(self._run), name=f"s3ckpt-heartbeat-{self._rank}", daemon=True
            )
            self._thread.start()
        return self

    def _run(self) -> None:
        wait = HEARTBEAT_INTERVAL * (0.5 + _JITTER.random() / 2)
        while not self._stop.wait(wait):
            try:
                self.beat()
            except S3CkptError as exc:
                log.warning("s3ckpt: heartbeat %s failed (retrying): %s", self.key, exc)
            wait = HEARTBEAT_INTERVAL

    def stop(self) -> None:
        """Stop beating (waits for a beat in flight)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


MAX_FAILURE_TEXT = 500
# Characters of the error a failure record keeps (and ``ls`` shows).


def describe_failure(exc: BaseException) -> str:
    """One line saying why a save failed, for its failure record."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (KeyboardInterrupt)"
    if isinstance(exc, SystemExit):
        return f"the process exited (SystemExit {exc.code!r})"
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= MAX_FAILURE_TEXT else text[: MAX_FAILURE_TEXT - 3] + "..."


def record_failure(
    store: ObjectStore,
    url: StoreURL,
    tag: str,
    rank: int,
    step: int | None,
    exc: BaseException,
) -> bool:
    """Record that the save tagged ``tag`` failed on ``rank``: PUT
    ``s3ckpt.failed.{tag}.{rank}`` under ``url``, so that ``ls`` shows it as failed and gc
    may remove what it left once the record is ``FAILURE_SETTLE`` old (a minute), without
    waiting out the grace period.

    Written where the failed save may have left objects: a delete of its own objects
    failed, the commit's outcome is unknown (its objects are kept), or other ranks of the
    save uploaded. A failed save that removed everything it wrote records nothing.

    Best effort: a store error is logged, never raised (the grace period then decides, as
    for a killed save). What the record may claim, and what it may not:

    * a commit marker wins: a marker PUT whose reply was lost may have been applied, so the
      catalog takes a prefix whose marker exists for committed whatever records lie there;
    * it names one save (its tag): another save of the same prefix (an overwrite, a retry)
      stays live or committed;
    * its LastModified is when the store saw the failure (the time ``ls`` shows); the body
      is for people (see :func:`failure_reason`).

    Request cost: one PUT. Returns whether the record was written.
    """
    key = url.key(failure_name(tag, rank))
    body = _record(state="failed", tag=tag, rank=rank, step=step, error=describe_failure(exc))
    try:
        store.put(key, body)
    except Exception as err:  # best effort: the grace period still ends the save
        log.warning("s3ckpt: could not record the failed save at %s (%s)", key, err)
        return False
    return True


def failure_reason(raw: bytes) -> str:
    """The error a failure record's body names (``"(unreadable failure record)"`` when it
    names none: a bucket's contents are not trusted)."""
    with suppress(ValueError, KeyError, TypeError, AttributeError):  # ValueError: bad UTF-8 too
        doc = json.loads(raw.decode("utf-8"))
        return f"rank {int(doc['rank'])}: {str(doc['error'])[:MAX_FAILURE_TEXT]}"
    return "(unreadable failure record)"


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
    with expecting("not_found"):  # removed since the HEAD: uncommitted now
        raw = get_or_none(store, key)
    return None if raw is None else (Manifest.from_json(raw, where=key), info.etag)


def read_items(store: ObjectStore, url: StoreURL, manifest: Manifest) -> Manifest:
    """``manifest`` with its item records: a format-4 marker's are read from the object it
    names (one GET) and checked against it (:meth:`Manifest.with_items`); an older marker's
    are inline already.

    Raises:
        CorruptCheckpointError: The records object is missing or does not match the marker.
    """
    if manifest.items is not None or manifest.items_ref is None:
        return manifest
    key = url.key(manifest.items_ref.name)
    with expecting("not_found"):
        raw = get_or_none(store, key)
    try:
        return manifest.with_items(raw, where=key)
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(exc.message, bucket=store.bucket, key=key) from None


def at_once(first: Callable[[], _A], second: Callable[[], _B]) -> tuple[_A, _B]:
    """Run both at once (``first`` on a thread of its own, its requests counted for the
    caller's operation) and return their results once both ended. Where both fail,
    ``first``'s error is raised, as when they ran one after the other (a Ctrl-C in
    ``second`` still wins)."""
    with ThreadPoolExecutor(1, thread_name_prefix="s3ckpt-at-once") as pool:
        other = pool.submit(in_context(first))
        try:
            result = second()
        except Exception:
            other.result()
            raise
        return other.result(), result


def get_or_none(store: ObjectStore, key: str) -> bytes | None:
    """``store.get(key)``; None when there is no such object."""
    with suppress(ObjectNotFoundError):
        return store.get(key)
    return None


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
    raw = check_metadata(get_or_none(store, key), manifest, bucket=store.bucket, key=key)
    store.put(ckpt.key(METADATA_NAME), raw, crc32c=manifest.metadata_crc32c)


def metadata_matches(raw: bytes | None, manifest: Manifest) -> bool:
    """Whether ``raw`` is the ``.metadata`` the manifest commits (its size and CRC32C)."""
    return (
        raw is not None
        and len(raw) == manifest.metadata_size
        and _crc.crc32c(raw) == manifest.metadata_crc32c
    )


def check_metadata(raw: bytes | None, manifest: Manifest, *, bucket: str, key: str) -> bytes:
    """``raw``; raises :class:`CorruptCheckpointError` naming ``key`` unless ``raw`` (None:
    missing) is the ``.metadata`` the manifest commits."""
    name = key.rpartition("/")[2]
    if raw is None:
        message = (
            f"{MANIFEST_NAME} commits {name}, which is missing; the checkpoint was partly "
            "deleted. Load an earlier checkpoint"
        )
    elif not metadata_matches(raw, manifest):
        message = (
            f"{name} does not match the one {MANIFEST_NAME} committed (size {len(raw)} vs "
            f"{manifest.metadata_size}, crc32c {_crc.crc32c(raw):08x} vs "
            f"{manifest.metadata_crc32c:08x}); it was changed after the commit"
        )
    else:
        return raw
    raise CorruptCheckpointError(message, bucket=bucket, key=key)
