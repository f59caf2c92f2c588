"""``s3ckpt inspect | verify | diff | export | import``: thin wrappers over
:mod:`s3ckpt.tools` (imported only when one of these commands runs, since it needs torch;
without torch the command says how to install it and exits 2).

``--json`` prints the result's ``to_dict()`` (stable keys) on stdout. Progress bars go to
stderr, and only when stderr is a terminal (never with ``--json`` / ``--no-progress``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from s3ckpt._cli import (
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_STORE,
    EXIT_USAGE,
    CommandError,
    error,
    open_location,
    s3_config_from_args,
    transfer_config_from_args,
)
from s3ckpt._cli._damaged import printable
from s3ckpt._cli._output import (
    ProgressBar,
    add_output_options,
    format_shape,
    print_json,
    print_table,
    progress_enabled,
)
from s3ckpt._time import utc
from s3ckpt._units import format_bytes, plural

if TYPE_CHECKING:
    from s3ckpt.tools import InspectResult

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add inspect, verify, diff, export and import."""
    p = sub.add_parser(
        "inspect",
        parents=[common],
        help="list tensors, sizes, step and metrics (reads metadata only)",
        description="Describe a checkpoint from .metadata and s3ckpt.json alone: no tensor "
        "data is downloaded. Works on any DCP checkpoint.",
    )
    p.add_argument("checkpoint", metavar="CKPT", help="checkpoint URL or local path")
    _filters(p)
    p.add_argument("--summary", action="store_true", help="totals only, no per-tensor list")
    add_output_options(p, progress=False)
    p.set_defaults(func=_inspect)

    p = sub.add_parser(
        "verify",
        parents=[common],
        help="re-read every byte and check every CRC32C",
        description="Check structure, object sizes and (s3ckpt checkpoints) every item's "
        "CRC32C with parallel ranged GETs. Exit 1 naming each bad tensor and object.",
    )
    p.add_argument("checkpoint", metavar="CKPT", help="checkpoint URL or local path")
    p.add_argument(
        "--read-data",
        action="store_true",
        help="also read every byte of checkpoints without checksums (other DCP writers)",
    )
    add_output_options(p)
    p.set_defaults(func=_verify)

    p = sub.add_parser(
        "diff",
        parents=[common],
        help="compare two checkpoints tensor by tensor",
        description="Per key: identical (by checksum, nothing downloaded, when both have "
        "checksums), changed (max and mean absolute difference), shape/dtype changed, only "
        "in A, only in B.",
    )
    p.add_argument("a", metavar="A", help="first checkpoint")
    p.add_argument("b", metavar="B", help="second checkpoint")
    _filters(p)
    p.add_argument("--all", action="store_true", help="list identical keys too")
    p.add_argument("--exit-code", action="store_true", help="exit 1 when the checkpoints differ")
    add_output_options(p)
    p.set_defaults(func=_diff)

    p = sub.add_parser(
        "export",
        parents=[common],
        help="write full tensors as Hugging Face safetensors shards (or one torch.save file)",
        description="Stream a full (unsharded) state dict to S3, any fsspec URL or a local "
        "folder, without holding the model in memory or on local disk.",
    )
    p.add_argument("checkpoint", metavar="CKPT", help="checkpoint URL or local path")
    p.add_argument("dest", metavar="DEST", help="destination prefix / folder (or .pt file)")
    p.add_argument("--format", choices=("safetensors", "torch"), default="safetensors")
    p.add_argument("--dtype", default=None, help="cast floating-point tensors (bf16, fp16, fp32)")
    p.add_argument(
        "--max-shard-size", default="5GB", help="largest shard, e.g. 5GB, 500MiB (default 5GB)"
    )
    p.add_argument(
        "--only",
        default=None,
        metavar="KEY",
        help="keep this top-level key's subtree and strip it from names (e.g. model)",
    )
    _filters(p)
    p.add_argument(
        "--converter",
        default=None,
        metavar="MODULE:FUNCTION",
        help="callable (name, tensor) -> iterable of (new_name, tensor) renaming/reshaping keys",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export")
    add_output_options(p)
    p.set_defaults(func=_export)

    p = sub.add_parser(
        "import",
        parents=[common],
        help="turn Hugging Face safetensors into an s3ckpt checkpoint",
        description="Read a .safetensors file, an index.json, or a folder/prefix of shards "
        "(local: memory-mapped; remote: ranged reads) and write a DCP checkpoint that loads "
        "at any world size.",
    )
    p.add_argument("src", metavar="SRC", help="safetensors file, index.json, folder or prefix")
    p.add_argument("dest", metavar="DEST", help="checkpoint URL or local path to write")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--prefix",
        default="model",
        help="top-level key to save tensors under (default: model, the Checkpointer's layout)",
    )
    g.add_argument("--no-prefix", action="store_true", help="keep names as they are")
    p.add_argument("--step", type=int, default=None, help="step to record in s3ckpt.json")
    p.add_argument("--overwrite", action="store_true", help="replace a committed checkpoint")
    add_output_options(p)
    p.set_defaults(func=_import)


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--include",
        action="append",
        default=None,
        metavar="GLOB",
        help="only names matching this glob (repeatable), e.g. 'model.*'",
    )
    p.add_argument(
        "--exclude", action="append", default=None, metavar="GLOB", help="skip matching names"
    )


# -- commands --------------------------------------------------------------------------------
@contextmanager
def _needs_torch(command: str) -> Iterator[None]:
    """Around the import of :mod:`s3ckpt.tools`: without PyTorch (or with a broken
    install), a one-line error saying how to get it."""
    try:
        yield
    except ImportError as exc:
        name = (getattr(exc, "name", None) or "").split(".")[0]
        what = f"{name} is not installed" if name in ("torch", "numpy") else f"{exc}"
        raise CommandError(
            f"'s3ckpt {command}' needs PyTorch ({what}): "
            'pip install "s3ckpt[torch]" (ls, prune, pin, unpin and gc run without it)',
            EXIT_USAGE,
        ) from None


def _inspect(args: argparse.Namespace) -> int:
    with _needs_torch("inspect"):
        from s3ckpt.tools import inspect_checkpoint

    info = inspect_checkpoint(
        open_location(args, args.checkpoint), include=args.include, exclude=args.exclude
    )
    if args.json:
        doc = info.to_dict()
        if args.summary:  # totals only: no per-tensor / per-object lists
            doc = {k: v for k, v in doc.items() if k not in ("tensors", "objects")}
        print_json(doc)
        return _damaged(info)
    fmt = (
        "s3ckpt (committed; CRC32C per item)"
        if info.checksums
        else "dcp (no s3ckpt.json: no checksums)"
    )
    head = [["checkpoint", info.url], ["format", fmt]]
    if info.life is not None:
        life = f"{info.life}: {printable(info.damage)}" if info.damage else info.life
        head.append(["life", life])
    if info.step is not None:
        head.append(["step", str(info.step)])
    if info.created is not None:
        head.append(["created", utc(info.created).strftime("%Y-%m-%d %H:%M:%S UTC")])
    head.append(["world size", "?" if info.world_size is None else str(info.world_size)])
    if info.layout:
        head.append(
            ["layout", f"hashed prefixes: {info.layout['fanout']} {info.layout['dir']}/ folders"]
        )
    if info.metrics:
        head.append(["metrics", ", ".join(f"{k}={v:g}" for k, v in info.metrics.items())])
    if info.versions:
        head.append(["written by", ", ".join(f"{k} {v}" for k, v in info.versions.items())])
    head.append(
        [
            "tensors",
            f"{info.tensor_count} ({format_bytes(info.tensor_bytes)}), "
            f"{plural(info.other_count, 'other value')}",
        ]
    )
    meta = f" incl. {format_bytes(info.metadata_bytes)} metadata" if info.metadata_bytes else ""
    n_obj = len(info.objects)
    head.append(
        [
            "stored",
            f"{format_bytes(info.stored_bytes)} in {n_obj} object{'s' if n_obj != 1 else ''}{meta}",
        ]
    )
    print_table(head)
    if args.summary:
        return _damaged(info)
    print()
    rows = [["name", "dtype", "shape", "size", "chunks", "objects"]]
    for t in info.tensors:
        size = format_bytes(t.nbytes) if t.kind == "tensor" else f"({format_bytes(t.stored_bytes)})"
        objs = t.objects[0] if len(t.objects) == 1 else f"{len(t.objects)} objects"
        rows.append([t.name, t.dtype or t.kind, format_shape(t.shape), size, str(t.chunks), objs])
    print_table(rows, right={3, 4})
    return _damaged(info)


def _damaged(info: InspectResult) -> int:
    """Exit 1 with a warning naming the damage when the catalog calls it damaged, as ``ls``."""
    if info.damage is None:
        return EXIT_OK
    print(
        f"s3ckpt inspect: warning: damaged checkpoint {printable(info.url)}: "
        f"{printable(info.damage)}; load(step='latest') skips it (docs/troubleshooting.md)",
        file=sys.stderr,
    )
    return EXIT_PARTIAL


def _verify(args: argparse.Namespace) -> int:
    with _needs_torch("verify"):
        from s3ckpt.tools import verify_checkpoint

    checkpoint = open_location(args, args.checkpoint)
    bar = ProgressBar("verify", enabled=progress_enabled(args))
    try:
        res = verify_checkpoint(
            checkpoint, read_data=True if args.read_data else None, progress=bar
        )
    finally:
        bar.close()
    if args.json:
        print_json(res.to_dict())
    else:
        what = "CRC32C checked" if res.checksums else "no checksums: structure and sizes"
        print(
            f"{res.url}: {plural(res.items, 'item')} in {plural(res.objects, 'object')}, "
            f"{res.items_read} read "
            f"({format_bytes(res.bytes_read)}, {what}) in {res.seconds:.1f} s"
        )
        if res.ok:
            print("OK")
        for p in res.problems:
            print(f"  {p.kind:<14} {p.message}")
        if not res.ok:
            print(f"bad tensors: {', '.join(res.bad_items) or '-'}")
            print(f"bad objects: {', '.join(res.bad_objects) or '-'}")
    if res.ok:
        return EXIT_OK
    if all(p.kind == "read_error" for p in res.problems):  # no bad data, only failed reads
        error(
            f"could not read {plural(len(res.problems), 'item')} (no bad data found in what "
            f"was read): {res.problems[0].message}; check access to the store and run it again"
        )
        return EXIT_STORE
    error(
        f"{plural(len(res.problems), 'problem')}: {plural(len(res.bad_items), 'bad tensor')} in "
        f"{plural(len(res.bad_objects), 'object')}; restore the objects or use another checkpoint"
    )
    return EXIT_PARTIAL


def _diff(args: argparse.Namespace) -> int:
    with _needs_torch("diff"):
        from s3ckpt.tools import diff_checkpoints

    a, b = open_location(args, args.a), open_location(args, args.b)
    bar = ProgressBar("diff", enabled=progress_enabled(args))
    try:
        res = diff_checkpoints(a, b, include=args.include, exclude=args.exclude, progress=bar)
    finally:
        bar.close()
    if args.json:
        print_json(res.to_dict())
    else:
        print(f"A  {res.a}\nB  {res.b}")
        rows = []
        labels = {
            "identical": "identical",
            "changed": "changed",
            "shape_changed": "shape changed",
            "dtype_changed": "dtype changed",
            "kind_changed": "type changed",
            "only_in_a": "only in A",
            "only_in_b": "only in B",
        }
        for e in res.entries:
            if e.status == "identical" and not args.all:
                continue
            if e.status in ("shape_changed", "dtype_changed", "kind_changed"):
                detail = (
                    f"{e.dtype_a or 'value'} {format_shape(e.shape_a)} -> "
                    f"{e.dtype_b or 'value'} {format_shape(e.shape_b)}"
                )
            elif e.status == "changed" and e.max_abs_diff is not None:
                detail = (
                    f"max |a-b| {e.max_abs_diff:.6g}  mean {e.mean_abs_diff:.6g}  "
                    f"({e.changed_elements} elements)"
                )
            elif e.status == "only_in_a":
                detail = f"{e.dtype_a or 'value'} {format_shape(e.shape_a)}"
            elif e.status == "only_in_b":
                detail = f"{e.dtype_b or 'value'} {format_shape(e.shape_b)}"
            else:
                detail = f"by {e.method}" if e.method else ""
            rows.append([labels[e.status], e.name, detail])
        if rows:
            print()
            print_table(rows)
        counts = {k: v for k, v in res.counts.items() if v}
        by_crc = sum(1 for e in res.entries if e.method == "checksum")
        print(
            "\n"
            + ", ".join(f"{v} {labels[k]}" for k, v in counts.items())
            + f" ({by_crc} decided by checksum, "
            f"{format_bytes(res.bytes_compared)} compared by value)"
        )
    return EXIT_PARTIAL if args.exit_code and not res.identical else EXIT_OK


def _export(args: argparse.Namespace) -> int:
    with _needs_torch("export"):
        from s3ckpt.tools import export_checkpoint

    if args.converter and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `--converter mymodule:fn` from the current folder
    checkpoint, dest = open_location(args, args.checkpoint), open_location(args, args.dest)
    bar = ProgressBar("export", enabled=progress_enabled(args))
    try:
        res = export_checkpoint(
            checkpoint,
            dest,
            format=args.format,
            dtype=args.dtype,
            max_shard_size=args.max_shard_size,
            only=args.only,
            include=args.include,
            exclude=args.exclude,
            converter=args.converter,
            overwrite=args.overwrite,
            progress=bar,
        )
    finally:
        bar.close()
    if args.json:
        print_json(res.to_dict())
        return EXIT_OK
    print(
        f"exported {plural(res.tensors, 'tensor')} ({format_bytes(res.tensor_bytes)}) from "
        f"{res.source} to "
        f"{res.dest} in {res.seconds:.1f} s"
    )
    print_table(
        [
            ["  " + f.name, format_bytes(f.size), plural(f.tensors, "tensor") if f.tensors else ""]
            for f in res.files
        ],
        right={1},
    )
    for s in res.skipped:
        print(f"skipped {s.name}: {s.reason}")
    for n in res.notes:
        print(f"note: {n}")
    return EXIT_OK


def _import(args: argparse.Namespace) -> int:
    with _needs_torch("import"):
        from s3ckpt.tools import import_safetensors

    # SRC names a file, an index or a folder as typed (its text is recorded in the
    # checkpoint), so it is opened by import_safetensors; DEST is a checkpoint prefix.
    dest = open_location(args, args.dest)
    bar = ProgressBar("import", enabled=progress_enabled(args))
    try:
        res = import_safetensors(
            args.src,
            dest,
            prefix=None if args.no_prefix else args.prefix,
            step=args.step,
            overwrite=args.overwrite,
            s3_config=s3_config_from_args(args),
            transfer_config=transfer_config_from_args(args),
            progress=bar,
        )
    finally:
        bar.close()
    if args.json:
        print_json(res.to_dict())
        return EXIT_OK
    under = f" under '{res.prefix}.'" if res.prefix else ""
    print(
        f"imported {plural(res.tensors, 'tensor')} ({format_bytes(res.tensor_bytes)}) from "
        f"{plural(len(res.files), 'file')}{under} into {res.dest} in {res.seconds:.1f} s"
    )
    return EXIT_OK
