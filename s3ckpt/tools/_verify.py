"""``s3ckpt verify``: re-read every byte and check every CRC32C.

What is checked, in order:

1. Structure (from ``.metadata`` and ``s3ckpt.json``): every tensor's saved chunks lie
   inside the tensor and cover it, every chunk has a stored item, every item has its
   ``s3ckpt.json`` row at the same place, every object it names is committed.
2. Objects (one HEAD each, in parallel): each exists, has the size ``s3ckpt.json``
   recorded, and is long enough for every byte range ``.metadata`` points into it.
3. Data (s3ckpt checkpoints): every item is read back with coalesced, parallel ranged
   GETs (whole objects where they fit in ``TransferConfig.read_request_size``) and its
   CRC32C compared. Memory: ``max_concurrency * read_chunk_size`` (56 MiB by default).
   Checkpoints of other DCP writers carry no checksums; steps 1 and 2 still run, and
   ``read_data=True`` reads every range back too.

Nothing stops at the first problem: the result names every bad tensor and object.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import torch

from s3ckpt import _crc
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.format import (
    FRAMING_HEAD,
    FRAMING_TAIL,
    MANIFEST_NAME,
    tensor_framing_error,
)
from s3ckpt.metrics.instrument import in_context, record_checksum_failure
from s3ckpt.store import LocationLike, ObjectInfo, ObjectStore
from s3ckpt.tools._common import Chunk, Entry, index_checkpoint, open_reader
from s3ckpt.tools._open import as_location
from s3ckpt.tools._structure import Problem, stock_metadata_problems, structure_problems, where
from s3ckpt.transfer import RangeWalk, ReadFailure, SpanReader
from s3ckpt.transfer import Span as WalkSpan

__all__ = ["Problem", "VerifyResult", "verify_checkpoint"]

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class VerifyResult:
    """What :func:`verify_checkpoint` found."""

    url: str
    format: str
    """``s3ckpt`` (checksums checked) or ``dcp`` (another writer: structure and sizes)."""
    checksums: bool
    items: int
    """Saved items (tensor chunks and values) in the checkpoint."""
    items_read: int
    """Items read back (and, with checksums, checked)."""
    bytes_read: int
    objects: int
    problems: tuple[Problem, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_items(self) -> list[str]:
        """Every damaged state-dict key, sorted."""
        return sorted({p.item for p in self.problems if p.item is not None})

    @property
    def bad_objects(self) -> list[str]:
        """Every object holding damage, sorted."""
        return sorted({p.object for p in self.problems if p.object is not None})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (stable keys)."""
        d = asdict(self)
        d["ok"] = self.ok
        d["bad_items"] = self.bad_items
        d["bad_objects"] = self.bad_objects
        return d


_Span = tuple[Entry, Chunk]


def verify_checkpoint(
    checkpoint: LocationLike | S3StorageReader,
    *,
    read_data: bool | None = None,
    progress: Progress | None = None,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    store: ObjectStore | None = None,
) -> VerifyResult:
    """Check ``checkpoint`` end to end; see the module docs.

    Args:
        checkpoint: URL (``s3://...``, fsspec URL, local path), a
            :class:`~s3ckpt.store.Location` or an open reader.
        read_data: Read every item back. Default: yes when the checkpoint has checksums
            (``s3ckpt.json``), no for other writers' checkpoints (HEADs only).
        progress: Called with ``(bytes_read, bytes_total)`` from worker threads.
        s3_config / transfer_config / store: How to open a URL ``checkpoint`` (a Location
            carries its own).

    Raises:
        CheckpointNotFoundError / CorruptCheckpointError: the marker or ``.metadata``
            itself is missing, malformed or does not match (nothing else can be checked).
    """
    t0 = time.perf_counter()
    if not isinstance(checkpoint, S3StorageReader):
        checkpoint = as_location(
            checkpoint, s3_config=s3_config, transfer_config=transfer_config, store=store
        )
    # No roll-forward: verify reports a stale .metadata copy rather than repairing it.
    reader = open_reader(checkpoint, roll_forward=False)
    tc = transfer_config or reader.transfer_config
    entries = index_checkpoint(reader)
    manifest = reader.manifest
    has_crc = manifest is not None
    if read_data is None:
        read_data = has_crc
    problems = structure_problems(reader, entries)
    if manifest is not None:
        problems += stock_metadata_problems(reader, manifest)

    per_object: dict[str, list[_Span]] = defaultdict(list)
    for entry in entries.values():
        for c in entry.chunks:
            per_object[c.object].append((entry, c))
    expected = {o.name: o.size for o in manifest.objects} if manifest is not None else {}
    names = sorted(set(per_object) | set(expected))
    infos = _head_all(reader.store, [reader.object_key(n) for n in names], tc.max_concurrency)

    readable: dict[str, list[_Span]] = {}
    for name, info in zip(names, infos, strict=True):
        spans = per_object.get(name, [])
        if info is None:
            problems.append(
                Problem(
                    "missing_object",
                    name,
                    None,
                    None,
                    f"object {name} is missing ({len(spans)} items in it)",
                )
            )
            problems += [
                Problem(
                    "missing_object", name, e.name, c.offsets, f"{where(e, c)}: {name} is missing"
                )
                for e, c in spans
            ]
            continue
        want = expected.get(name)
        if want is not None and info.size != want:
            problems.append(
                Problem(
                    "object_size",
                    name,
                    None,
                    None,
                    f"object {name} has {info.size} bytes, {MANIFEST_NAME} recorded {want}"
                    + ("; it was truncated" if info.size < want else "; it was changed"),
                )
            )
        ok: list[_Span] = []
        for e, c in spans:
            if c.start + c.length > info.size:
                problems.append(
                    Problem(
                        "truncated",
                        name,
                        e.name,
                        c.offsets,
                        f"{where(e, c)} needs bytes {c.start}-{c.start + c.length - 1} of "
                        f"{name}, which has {info.size}; the object is truncated",
                    )
                )
            else:
                ok.append((e, c))
        readable[name] = ok

    items_read = bytes_read = 0
    if read_data:
        items_read, bytes_read, found = _read_back(reader, readable, has_crc, tc, progress)
        problems += found

    return VerifyResult(
        url=reader.checkpoint_id,
        format="s3ckpt" if has_crc else "dcp",
        checksums=has_crc,
        items=sum(len(e.chunks) for e in entries.values()),
        items_read=items_read,
        bytes_read=bytes_read,
        objects=len(names),
        problems=tuple(problems),
        seconds=round(time.perf_counter() - t0, 3),
    )


class _Framing:
    """Collects the bytes around a tensor's data while an item streams past, to check that
    its zip framing puts the tensor where the manifest says (a resealed manifest with a
    moved ``data_offset`` must not pass)."""

    def __init__(self, data_offset: int, nbytes: int) -> None:
        self.head_from = max(0, data_offset - FRAMING_HEAD)
        self.data_offset = data_offset
        self.tail_from = data_offset + nbytes
        self.nbytes = nbytes
        self.head = bytearray(data_offset - self.head_from)
        self.tail = bytearray(FRAMING_TAIL)
        self.tail_len = 0

    @classmethod
    def of(cls, entry: Entry, chunk: Chunk) -> _Framing | None:
        rec = chunk.record
        if rec is None or rec.data_offset is None or entry.dtype is None or chunk.sizes is None:
            return None
        numel = 1
        for n in chunk.sizes:
            numel *= n
        if numel == 0:
            return None
        return cls(rec.data_offset, numel * torch.empty((), dtype=entry.dtype).element_size())

    def feed(self, at: int, data: memoryview) -> None:
        """Bytes ``[at, at + len(data))`` of the item."""
        end = at + len(data)
        lo, hi = max(at, self.head_from), min(end, self.data_offset)
        if lo < hi:
            self.head[lo - self.head_from : hi - self.head_from] = data[lo - at : hi - at]
        lo, hi = max(at, self.tail_from), min(end, self.tail_from + FRAMING_TAIL)
        if lo < hi:
            self.tail[lo - self.tail_from : hi - self.tail_from] = data[lo - at : hi - at]
            self.tail_len = max(self.tail_len, hi - self.tail_from)

    def error(self) -> str | None:
        return tensor_framing_error(self.head, self.tail[: self.tail_len], self.nbytes)


def _head_all(store: ObjectStore, keys: list[str], concurrency: int) -> list[ObjectInfo | None]:
    if len(keys) <= 1:
        return [store.head(k) for k in keys]
    with ThreadPoolExecutor(min(concurrency, len(keys))) as pool:
        return list(pool.map(in_context(store.head), keys))


def _read_back(
    reader: S3StorageReader,
    spans: dict[str, list[_Span]],
    has_crc: bool,
    tc: TransferConfig,
    progress: Progress | None,
) -> tuple[int, int, list[Problem]]:
    """Read every span back with coalesced ranged GETs and check each item; never raises
    for data. Returns (items read, bytes read, problems in request order)."""
    lock = threading.Lock()
    state = {"bytes": 0, "items": 0}
    found: dict[int, list[Problem]] = defaultdict(list)

    def on_bytes(n: int) -> None:
        with lock:
            state["bytes"] += n
            done = state["bytes"]
        if progress is not None:
            progress(done, total)

    def on_span(span: WalkSpan[_Span], stream: SpanReader) -> None:
        entry, chunk = span.payload
        crc = 0
        framing = _Framing.of(entry, chunk)
        at = 0  # offset inside the item
        for piece in stream.chunks(entry.name):
            crc = _crc.crc32c(piece, crc)
            if framing is not None:
                framing.feed(at, piece)
            at += len(piece)
        checked = _check_item(span, crc, framing, has_crc)
        with lock:
            state["items"] += 1
            found[span.job] += checked

    def on_failure(failure: ReadFailure[_Span]) -> None:
        if failure.kind == "truncated":
            lost = [
                Problem(
                    "truncated",
                    s.name,
                    e.name,
                    c.offsets,
                    f"{where(e, c)}: {s.name} ended early while reading it back; "
                    "the object is truncated",
                )
                for s in failure.spans
                for e, c in [s.payload]
            ]
        else:
            lost = [
                Problem("read_error", s.name, e.name, c.offsets, f"{where(e, c)}: {failure.error}")
                for s in failure.spans
                for e, c in [s.payload]
            ]
        with lock:
            found[failure.job] += lost

    walk: RangeWalk[_Span] = RangeWalk(
        reader.store,
        reader.object_key,
        config=tc,
        on_span=on_span,
        on_failure=on_failure,
        on_bytes=on_bytes,
        thread_name_prefix="s3ckpt-verify",
    )
    jobs = walk.plan(
        {name: [(c.start, c.start + c.length, (e, c)) for e, c in ok] for name, ok in spans.items()}
    )
    total = sum(req.size for _, req in jobs)
    walk.run(jobs)
    problems = [p for job in range(len(jobs)) for p in found.get(job, [])]
    return state["items"], state["bytes"], problems


def _check_item(
    span: WalkSpan[_Span], crc: int, framing: _Framing | None, has_crc: bool
) -> list[Problem]:
    """The problems of one item read back: its framing and its CRC32C."""
    entry, chunk = span.payload
    name, start, end = span.name, span.start, span.end
    problems = []
    why = framing.error() if framing is not None else None
    if why is not None:
        problems.append(
            Problem(
                "structure",
                name,
                entry.name,
                chunk.offsets,
                f"{where(entry, chunk)}: {why} (bytes {start}-{end - 1} of {name}); "
                f"{MANIFEST_NAME} does not describe the bytes stored",
            )
        )
    rec = chunk.record
    if has_crc and rec is not None and crc != rec.crc32c:
        record_checksum_failure()
        problems.append(
            Problem(
                "checksum",
                name,
                entry.name,
                chunk.offsets,
                f"{where(entry, chunk)}: crc32c {crc:08x}, recorded {rec.crc32c:08x} "
                f"(bytes {start}-{end - 1} of {name}); the data changed after it was "
                "saved",
            )
        )
    return problems
