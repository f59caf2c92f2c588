"""``s3ckpt verify``'s checks that read no data: structure and the ``.metadata`` copies.

:func:`structure_problems` compares ``.metadata`` with ``s3ckpt.json`` (chunks inside and
covering each tensor, a stored item and a manifest row at the same place for every chunk,
every object committed); :func:`stock_metadata_problems` checks both copies of
``.metadata`` against the marker. :class:`Problem` is what every check reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from s3ckpt._commit import metadata_matches
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.errors import ObjectNotFoundError
from s3ckpt.format import MANIFEST_NAME, METADATA_NAME, Manifest
from s3ckpt.tools._common import Chunk, Entry

__all__ = ["Problem", "stock_metadata_problems", "structure_problems", "where"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint."""

    kind: str
    """``checksum`` (bytes changed), ``truncated`` (object too short for an item),
    ``missing_object``, ``object_size`` (differs from ``s3ckpt.json``), ``structure``
    (metadata and marker disagree, chunks do not cover a tensor), ``metadata`` (a copy of
    ``.metadata`` is missing or damaged), ``read_error``."""
    object: str | None
    """Object name relative to the checkpoint prefix."""
    item: str | None
    """State-dict key of the damaged tensor or value."""
    chunk: tuple[int, ...] | None
    """Offsets of the damaged chunk in the full tensor (sharded saves)."""
    message: str


def where(entry: Entry, chunk: Chunk) -> str:
    if chunk.offsets is not None and any(chunk.offsets):
        return f"{entry.name!r} (chunk at {list(chunk.offsets)})"
    return repr(entry.name)


def structure_problems(reader: S3StorageReader, entries: dict[str, Entry]) -> list[Problem]:
    problems: list[Problem] = []
    manifest = reader.manifest
    md = reader.metadata.state_dict_metadata
    for entry in entries.values():
        if not entry.chunks:
            problems.append(
                Problem("structure", None, entry.name, None, f"{entry.name!r} has no stored item")
            )
            continue
        meta = md[entry.name]
        if isinstance(meta, TensorStorageMetadata) and entry.shape is not None:
            stored = {c.offsets for c in entry.chunks}
            covered = 0
            for c in meta.chunks:
                offs, sizes = tuple(c.offsets), tuple(c.sizes)
                n = 1
                for s in sizes:
                    n *= s
                covered += n
                if any(o + s > d for o, s, d in zip(offs, sizes, entry.shape, strict=False)):
                    problems.append(
                        Problem(
                            "structure",
                            None,
                            entry.name,
                            offs,
                            f"{entry.name!r}: chunk at {list(offs)} of size {list(sizes)} "
                            f"lies outside the tensor's shape {list(entry.shape)}",
                        )
                    )
                if offs not in stored:
                    problems.append(
                        Problem(
                            "structure",
                            None,
                            entry.name,
                            offs,
                            f"{entry.name!r}: chunk at {list(offs)} has no stored item in "
                            ".metadata's storage_data",
                        )
                    )
            if covered != entry.numel:
                problems.append(
                    Problem(
                        "structure",
                        None,
                        entry.name,
                        None,
                        f"{entry.name!r}: saved chunks hold {covered} elements, the tensor "
                        f"has {entry.numel}",
                    )
                )
        if manifest is None:
            continue
        for c in entry.chunks:
            rec = c.record
            if rec is None:
                problems.append(
                    Problem(
                        "structure",
                        c.object,
                        entry.name,
                        c.offsets,
                        f"{where(entry, c)} has no row in {MANIFEST_NAME}",
                    )
                )
            elif (rec.object, rec.start, rec.length) != (c.object, c.start, c.length):
                problems.append(
                    Problem(
                        "structure",
                        c.object,
                        entry.name,
                        c.offsets,
                        f"{where(entry, c)}: .metadata places it at {c.object}"
                        f"[{c.start}:{c.start + c.length}], {MANIFEST_NAME} at "
                        f"{rec.object}[{rec.start}:{rec.start + rec.length}]",
                    )
                )
    if manifest is not None:
        committed = {o.name for o in manifest.objects}
        for name in sorted({c.object for e in entries.values() for c in e.chunks} - committed):
            problems.append(
                Problem(
                    "structure",
                    name,
                    None,
                    None,
                    f".metadata points into {name}, which {MANIFEST_NAME} does not list",
                )
            )
    return problems


def stock_metadata_problems(reader: S3StorageReader, manifest: Manifest) -> list[Problem]:
    """Both copies of ``.metadata`` must be the committed one.

    The committed ``.metadata.{tag}`` (the marker's) and the plain ``.metadata`` stock DCP
    readers open are each compared with the marker's CRC32C and size. The reader loaded
    whichever copy is intact; a damaged one is still a problem: a damaged plain copy breaks
    stock readers, a damaged ``.metadata.{tag}`` leaves the checkpoint one copy from loss.
    """
    if manifest.metadata_key == METADATA_NAME:
        return []  # a format-1 commit: one copy, checked when the reader opened it
    problems = []
    fixes = {
        manifest.metadata_key: "s3ckpt still loads from the plain .metadata while it is intact; "
        f"copy it over {manifest.metadata_key} (its CRC32C must match the marker's) or keep "
        "another checkpoint",
        METADATA_NAME: "`s3ckpt gc --apply`, or any s3ckpt load with write access, copies "
        f"{manifest.metadata_key} back over it",
    }
    for name, role in (
        (manifest.metadata_key, "the committed metadata"),
        (METADATA_NAME, "the copy stock DCP readers load"),
    ):
        try:
            raw: bytes | None = reader.store.get(reader.url.key(name))
        except ObjectNotFoundError:
            raw = None
        if metadata_matches(raw, manifest):
            continue
        state = "missing" if raw is None else "not the one the marker commits"
        problems.append(
            Problem(
                "metadata",
                name,
                None,
                None,
                f"{name} ({role}) is {state}: {fixes[name]}",
            )
        )
    return problems
