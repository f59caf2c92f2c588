"""The tombstone: the fence gc, prune and rm put on a checkpoint prefix before deleting any
object of it (torch-free; the deleter writes it, the commit reads it).

A deleter ends a writer's claim on a prefix with ONE conditional write on its marker key
``s3ckpt.json``: the tombstone, created only if absent (``If-None-Match: *``, an uncommitted
prefix) or replacing only the ETag the deleter planned on (``If-Match``: a committed marker,
or an earlier, finished tombstone). Only then are objects deleted. A writer paused anywhere
(SIGSTOP, a VM migration) then fails its own conditional marker PUT -- its ``If-None-Match``
meets the tombstone, its ``If-Match`` an ETag that changed -- reads the marker back, finds
the tombstone and raises :class:`SaveFencedError`: nothing is committed over deleted data.

The body names its owner (the deleter's lease owner), so a PUT whose reply was lost is
recognised as ours by reading it back, and who fenced (``by``) and which saves it reaped
(``reaped``, their tags), so the writer's error can say so; ``tag`` is the committed save's.
Those saves are never live while the tombstone stands (a deletion whose deletes were refused
finishes them whatever their objects' ages). ``names`` lists what the deletion
covers that no save tag proves (the plain ``.metadata``, a format-1 commit's data, a stock
DCP checkpoint's files), so whoever finishes a deletion a deleter left half-done deletes
exactly what it planned.

Its life: while ``done`` is false the prefix is *being deleted*: no writer replaces it, and
the next prune, gc or rm finishes it. At the end the deleter deletes it, unless ``keep``: a
save (another tag than the committed one) may be paused in the prefix, and a deleted
tombstone would let its ``If-None-Match`` PUT succeed. Such a tombstone is rewritten
``done`` and stays (the prefix is *gone*) until a new save of that step replaces it
(``PUT If-Match`` its ETag).
"""

from __future__ import annotations

import json
from contextlib import closing, suppress
from dataclasses import asdict, dataclass, replace

from s3ckpt._step_names import checkpoint_step
from s3ckpt.errors import CheckpointNotFoundError, ObjectNotFoundError, SaveFencedError
from s3ckpt.metrics.instrument import expecting
from s3ckpt.store.base import ObjectInfo, ObjectStore
from s3ckpt.uri import StoreURL

__all__ = [
    "TOMBSTONE_FORMAT",
    "SaveFencedError",
    "Tombstone",
    "deleted_error",
    "fenced_error",
    "read_head",
    "read_object",
    "read_tombstone",
    "step_taken",
]

TOMBSTONE_FORMAT = "s3ckpt.tombstone"
MAX_TOMBSTONE_BYTES = 1024 * 1024
"""The largest body read as a tombstone (its ``names`` of a format-1 or stock checkpoint)."""
_MARK = f'"format":"{TOMBSTONE_FORMAT}"'.encode()


@dataclass(frozen=True)
class Tombstone:
    """What a tombstone says (see the module docstring)."""

    owner: str
    by: str = "prune"
    reaped: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    keep: bool = False
    done: bool = False
    tag: str | None = None
    """The committed save's tag (of the marker the tombstone replaced; None for an
    uncommitted prefix): with ``reaped``, the saves whose names the deletion covers."""

    @property
    def tags(self) -> frozenset[str]:
        """Every save the deletion covers: never live, whatever their objects' ages."""
        return frozenset(self.reaped) | ({self.tag} if self.tag else set())

    def to_json(self) -> bytes:
        doc = {"format": TOMBSTONE_FORMAT, "version": 2, **asdict(self)}
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")

    def finished(self) -> Tombstone:
        """The same tombstone, its deletion done (what stays when ``keep``)."""
        return replace(self, done=True)

    @classmethod
    def parse(cls, raw: bytes | None) -> Tombstone | None:
        """The tombstone in a marker body, or None when it is none (a manifest, garbage)."""
        if not raw or len(raw) > MAX_TOMBSTONE_BYTES or _MARK not in bytes(raw[:64]):
            return None  # (a manifest is never parsed twice)
        with suppress(ValueError, TypeError, AttributeError, RecursionError):
            doc = json.loads(raw.decode("utf-8"))
            if not isinstance(doc, dict) or doc.get("format") != TOMBSTONE_FORMAT:
                return None
            return cls(
                owner=str(doc.get("owner", "")),
                by=str(doc.get("by", "prune")),
                reaped=tuple(str(t) for t in doc.get("reaped", ())),
                # Version 1 deleted a committed marker: its plain .metadata goes with it.
                names=tuple(str(n) for n in doc.get("names", (".metadata",)) if "/" not in str(n)),
                keep=bool(doc.get("keep", False)),
                done=bool(doc.get("done", False)),
                tag=str(doc["tag"]) if doc.get("tag") else None,
            )
        return None


def read_tombstone(store: ObjectStore, key: str) -> tuple[Tombstone, str | None] | None:
    """The tombstone at marker ``key`` and its ETag, or None when the key holds none.

    Request cost: one HEAD and one GET. If the object changes between them a
    compare-and-swap on the ETag fails, the safe side."""
    with expecting("not_found"):
        read = read_object(store, key)
    found = Tombstone.parse(read[1]) if read is not None else None
    return None if found is None or read is None else (found, read[0].etag)


def read_object(store: ObjectStore, key: str) -> tuple[ObjectInfo, bytes] | None:
    """``key`` as one HEAD and then one GET see it, or None when it is not there.

    HEAD comes first: when the GET returns a body only one writer writes (a lease record, a
    tombstone naming its owner), that write finished before the HEAD, so the HEAD's ETag is
    that write's. That is how a conditional write whose reply was lost is recognised."""
    info = store.head(key)
    with suppress(ObjectNotFoundError):
        return None if info is None else (info, store.get(key))
    return None


def step_taken(store: ObjectStore, key: str) -> bool:
    """Whether marker ``key`` holds anything but a finished tombstone (a commit, a damaged
    marker, a deletion in progress): what a save without ``overwrite`` refuses.

    Request cost: one ranged GET of the first bytes (enough to tell a tombstone, which is
    then read whole), and only for a tombstone one HEAD and one GET more. A GET, not a
    HEAD, tells a missing key from a missing bucket (NoSuchBucketError) with only
    s3:GetObject."""
    with expecting("not_found"):  # a probe: 404 is the usual answer
        try:
            head = read_head(store, key, len(_MARK) + 2)
        except ObjectNotFoundError:
            return False
    # Only a finished tombstone is a deleted step any new save may take (its commit replaces
    # the tombstone by its ETag).
    found = read_tombstone(store, key) if _MARK in head else None
    return found is None or not found[0].done


def read_head(store: ObjectStore, key: str, size: int) -> bytes:
    """The first ``size`` bytes of ``key`` (fewer if it is shorter): one ranged GET."""
    buf, got = bytearray(size), 0
    with closing(store.open_range(key, 0, size)) as reader, memoryview(buf) as view:
        while got < size and (n := reader.readinto(view[got:])) > 0:
            got += n
    return bytes(buf[:got])


def deleted_error(
    url: StoreURL, tombstone: Tombstone, *, bucket: str | None, key: str
) -> CheckpointNotFoundError:
    """What a load of the step fenced by ``tombstone`` raises: deleted, not damaged."""
    step = checkpoint_step(url.prefix.rstrip("/").rpartition("/")[2])
    what = f"step {step} ({url})" if step is not None else str(url)
    who = f"`s3ckpt {tombstone.by}`" + (f" ({tombstone.owner})" if tombstone.owner else "")
    how = (
        f"was deleted by {who}"
        if tombstone.done
        else f"is being deleted by {who}: some of its objects may be gone already, and the "
        "next `s3ckpt prune`, `gc` or `rm` finishes the deletion"
    )
    return CheckpointNotFoundError(
        f"no checkpoint at {what}: it {how}. Load another step (`s3ckpt ls` lists the "
        "committed ones)",
        bucket=bucket,
        key=key,
    )


def fenced_error(
    url: object,
    tombstone: Tombstone,
    tag: str,
    step: int | None,
    *,
    bucket: str | None,
    key: str,
    rank: int | None,
) -> SaveFencedError:
    """The error of the save tagged ``tag`` that met ``tombstone`` at its commit."""
    what = f"step {step} ({url})" if step is not None else str(url)
    if tag in tombstone.reaped:
        how = (
            f"this save was paused or stalled past the grace period, and `s3ckpt "
            f"{tombstone.by}` took it for dead, fenced the prefix and deleted its objects"
        )
    elif not tombstone.done:
        how = f"it is being deleted (`s3ckpt {tombstone.by}` fenced the prefix)"
    else:
        how = f"`s3ckpt {tombstone.by}` fenced the prefix while this save ran"
    return SaveFencedError(
        f"{what} was not saved: {how}. Nothing was committed and the previous checkpoint is "
        "still the latest. Save this step again (a new save replaces the fence once the "
        "deletion is finished)",
        bucket=bucket,
        key=key,
        rank=rank,
    )
