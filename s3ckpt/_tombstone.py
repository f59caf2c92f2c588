"""The tombstone marker: how rm and prune delete a commit marker on a store without
conditional deletes (torch-free; the deleter writes it, the commit refuses to replace it).

Deleting a marker must not delete one an overwrite committed after the deleter listed it.
Where ``DeleteObject If-Match`` is not available, the deleter first replaces the marker it
planned to delete (``PUT If-Match: <planned ETag>``) by a tombstone, then deletes it. The
swap fails with 412 if the checkpoint changed, and an overwrite never compares-and-swaps
over a tombstone (it fails with :func:`being_deleted`), so once the tombstone is in place
nothing but the deleter touches the marker.
"""

from __future__ import annotations

import json

from s3ckpt.errors import CheckpointError

__all__ = ["TOMBSTONE_FORMAT", "being_deleted", "is_tombstone", "tombstone_body"]

TOMBSTONE_FORMAT = "s3ckpt.tombstone"


def tombstone_body(owner: str) -> bytes:
    """A tombstone naming its writer (so a write whose reply was lost is recognised)."""
    doc = {"format": TOMBSTONE_FORMAT, "version": 1, "owner": owner}
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def is_tombstone(raw: bytes | None) -> bool:
    """Whether a marker body is a tombstone."""
    if not raw or len(raw) > 4096:
        return False
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == TOMBSTONE_FORMAT


def being_deleted(
    url: object, *, bucket: str | None, key: str, rank: int | None
) -> CheckpointError:
    """The error of a save that met a tombstone at its prefix."""
    return CheckpointError(
        f"{url} is being deleted (rm or prune replaced its commit marker by a tombstone); "
        "this save was not committed. Save again in a moment; if the tombstone stays (a "
        "deleter died), `s3ckpt rm` the checkpoint or run prune / gc, which finish it",
        bucket=bucket,
        key=key,
        rank=rank,
    )
