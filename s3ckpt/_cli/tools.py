"""``s3ckpt inspect | verify | diff | export | import | restore``: thin wrappers over
:mod:`s3ckpt.tools` (imported only when one of these commands runs, since it needs torch;
without torch the command says how to install it and exits 2; ``restore`` needs none).

``--json`` prints the result's ``to_dict()`` (stable keys) on stdout. Progress bars go to
stderr, and only when stderr is a terminal (never with ``--json`` / ``--no-progress``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from s3ckpt._cli import (
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_STORE,
    CommandError,
    error,
    open_location,
    s3_config_from_args,
    transfer_config_from_args,
)
from s3ckpt._cli._args import commands, days, seconds
from s3ckpt._cli._output import (
    ProgressBar,
    add_output_options,
    format_shape,
    print_json,
    print_table,
    printable,
    progress_enabled,
)
from s3ckpt._time import utc
from s3ckpt._units import format_bytes, plural

if TYPE_CHECKING:
    from s3ckpt.tools._verify import InspectResult

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add inspect, verify, diff, export, import and restore."""
    add = commands(sub, common)
    p = add(
        "inspect",
        _inspect,
        "list tensors, sizes, step and metrics (reads metadata only)",
        "Describe a checkpoint from .metadata and s3ckpt.json alone: no tensor "
        "data is downloaded. Works on any DCP checkpoint.",
    )
    p.add_argument("checkpoint", metavar="CKPT", help="checkpoint URL or local path")
    _filters(p)
    p.add_argument("--summary", action="store_true", help="totals only, no per-tensor list")
    add_output_options(p, progress=False)

    p = add(
        "verify",
        _verify,
        "re-read every byte and check every CRC32C",
        "Check structure, object sizes and (s3ckpt checkpoints) every item's "
        "CRC32C with parallel ranged GETs. Exit 1 naming each bad tensor and object.",
    )
    p.add_argument("checkpoint", metavar="CKPT", help="checkpoint URL or local path")
    h = "also read every byte of checkpoints without checksums (other DCP writers)"
    p.add_argument("--read-data", action="store_true", help=h)
    add_output_options(p)

    p = add(
        "diff",
        _diff,
        "compare two checkpoints tensor by tensor",
        "Per key: identical (by checksum, nothing downloaded, when both have checksums), changed "
        "(max and mean absolute difference), shape/dtype changed, only in A, only in B.",
    )
    p.add_argument("a", metavar="A", help="first checkpoint")
    p.add_argument("b", metavar="B", help="second checkpoint")
    _filters(p)
    p.add_argument("--all", action="store_true", help="list identical keys too")
    p.add_argument("--exit-code", action="store_true", help="exit 1 when the checkpoints differ")
    add_output_options(p)

    p = add(
        "export",
        _export,
        "write full tensors as Hugging Face safetensors shards (or one torch.save file)",
        "Stream a full (unsharded) state dict to S3, any fsspec URL or a local "
        "folder, without holding the model in memory or on local disk.",
    )
    p.add_argument("checkpoint", metavar="CKPT", help="checkpoint URL or local path")
    p.add_argument("dest", metavar="DEST", help="destination prefix / folder (or .pt file)")
    p.add_argument("--format", choices=("safetensors", "torch"), default="safetensors")
    p.add_argument("--dtype", help="cast floating-point tensors (bf16, fp16, fp32)")
    h = "largest shard, e.g. 5GB, 500MiB (default 5GB)"
    p.add_argument("--max-shard-size", default="5GB", help=h)
    h = "keep this top-level key's subtree and strip it from names (e.g. model)"
    p.add_argument("--only", metavar="KEY", help=h)
    _filters(p)
    h = "callable (name, tensor) -> iterable of (new_name, tensor) renaming/reshaping keys"
    p.add_argument("--converter", metavar="MODULE:FUNCTION", help=h)
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export")
    add_output_options(p)

    p = add(
        "import",
        _import,
        "turn Hugging Face safetensors into an s3ckpt checkpoint",
        "Read a .safetensors file, an index.json, or a folder/prefix of shards "
        "(local: memory-mapped; remote: ranged reads) and write a DCP checkpoint that loads "
        "at any world size.",
    )
    p.add_argument("src", metavar="SRC", help="safetensors file, index.json, folder or prefix")
    p.add_argument("dest", metavar="DEST", help="checkpoint URL or local path to write")
    g = p.add_mutually_exclusive_group()
    h = "top-level key to save tensors under (default: model, the Checkpointer's layout)"
    g.add_argument("--prefix", default="model", help=h)
    g.add_argument("--no-prefix", action="store_true", help="keep names as they are")
    p.add_argument("--step", type=int, help="step to record in s3ckpt.json")
    p.add_argument("--overwrite", action="store_true", help="replace a committed checkpoint")
    add_output_options(p)

    p = add(
        "restore",
        _restore,
        "restore a checkpoint's GLACIER / DEEP_ARCHIVE objects so that it loads",
        "Issue RestoreObject for every archived object (GLACIER, DEEP_ARCHIVE) "
        "of a checkpoint, or of every committed checkpoint under a run, and report each "
        "object's state. A load needs every object restored; --wait polls until it is.",
    )
    p.add_argument("url", metavar="URL", help="checkpoint or run URL")
    h = "days the restored copies stay readable (default 7)"
    p.add_argument("--days", type=days, default=7, metavar="N", help=h)
    h = (
        "retrieval tier: Standard (GLACIER 3-5 h, DEEP_ARCHIVE 12 h), Bulk (cheaper, "
        "slower), Expedited (GLACIER only, minutes); default Standard"
    )
    p.add_argument("--tier", choices=("Standard", "Bulk", "Expedited"), default="Standard", help=h)
    p.add_argument("--wait", action="store_true", help="poll until every restored copy is readable")
    h = "with --wait: seconds between polls (one HEAD per object still restoring; default 300)"
    p.add_argument("--poll-seconds", type=seconds, default=300.0, metavar="S", help=h)
    add_output_options(p)


def _filters(p: argparse.ArgumentParser) -> None:
    h = "only names matching this glob (repeatable), e.g. 'model.*'"
    p.add_argument("--include", action="append", metavar="GLOB", help=h)
    p.add_argument("--exclude", action="append", metavar="GLOB", help="skip matching names")


# -- commands --------------------------------------------------------------------------------
def _tool(args: argparse.Namespace, name: str) -> Any:
    """``name`` from :mod:`s3ckpt.tools` (which imports torch for it); without PyTorch (or
    with a broken install), a one-line error saying how to get it."""
    try:
        import s3ckpt.tools

        return getattr(s3ckpt.tools, name)
    except ImportError as exc:
        name = (getattr(exc, "name", None) or "").split(".")[0]
        what = f"{name} is not installed" if name in ("torch", "numpy") else f"{exc}"
        raise CommandError(
            f"'s3ckpt {args.command}' needs PyTorch ({what}): "
            'pip install "s3ckpt[torch]" (ls, prune, pin, unpin and gc run without it)'
        ) from None


def _run(
    args: argparse.Namespace, name: str, *targets: str, names: Iterable[str] = (), **kwargs: Any
) -> Any:
    """Tool ``name``'s result on the command's ``targets`` (each opened), with the arguments
    ``names`` and ``kwargs``, under the command's progress bar; with ``--json`` it is
    printed."""
    tool = _tool(args, name)
    locations = [open_location(args, target) for target in targets]
    with ProgressBar(args.command, enabled=progress_enabled(args)) as bar:
        res = tool(*locations, **{n: getattr(args, n) for n in names}, **kwargs, progress=bar)
    if args.json:
        print_json(res.to_dict())
    return res


def _inspect(args: argparse.Namespace) -> int:
    info = _tool(args, "inspect_checkpoint")(
        open_location(args, args.checkpoint), include=args.include, exclude=args.exclude
    )
    if args.json:
        skip = ("tensors", "objects") if args.summary else ()  # totals only: no such lists
        print_json({k: v for k, v in info.to_dict().items() if k not in skip})
    else:
        _print_inspect(info, summary=args.summary)
    if info.damage is None:
        return EXIT_OK
    # Exit 1 with a warning naming the damage when the catalog calls it damaged, as ``ls``.
    print(
        f"s3ckpt inspect: warning: damaged checkpoint {printable(info.url)}: "
        f"{printable(info.damage)}; load(step='latest') skips it (docs/troubleshooting.md)",
        file=sys.stderr,
    )
    return EXIT_PARTIAL


_NO_CRC = "dcp (no s3ckpt.json: no checksums)"


def _print_inspect(info: InspectResult, *, summary: bool) -> None:
    """``inspect``'s table of what the checkpoint is, then (unless ``summary``) its tensors."""
    life = info.life and (f"{info.life}: {printable(info.damage)}" if info.damage else info.life)
    created = info.created is not None and utc(info.created).strftime("%Y-%m-%d %H:%M:%S UTC")
    layout = info.layout and (
        f"hashed prefixes: {info.layout['fanout']} {info.layout['dir']}/ folders"
    )
    meta = f" incl. {format_bytes(info.metadata_bytes)} metadata" if info.metadata_bytes else ""
    others = plural(info.other_count, "other value")
    stored = f"{format_bytes(info.stored_bytes)} in {plural(len(info.objects), 'object')}{meta}"
    head = [
        ("checkpoint", info.url),
        ("format", "s3ckpt (committed; CRC32C per item)" if info.checksums else _NO_CRC),
        ("life", life),
        ("step", None if info.step is None else str(info.step)),
        ("created", created),
        ("world size", "?" if info.world_size is None else str(info.world_size)),
        ("layout", layout),
        ("metrics", ", ".join(f"{k}={v:g}" for k, v in info.metrics.items())),
        ("written by", ", ".join(f"{k} {v}" for k, v in info.versions.items())),
        ("tensors", f"{info.tensor_count} ({format_bytes(info.tensor_bytes)}), {others}"),
        ("stored", stored),
    ]
    print_table([[k, str(v)] for k, v in head if v])
    if summary:
        return
    print()
    rows = [["name", "dtype", "shape", "size", "chunks", "objects"]]
    for t in info.tensors:
        size = format_bytes(t.nbytes) if t.kind == "tensor" else f"({format_bytes(t.stored_bytes)})"
        objs = t.objects[0] if len(t.objects) == 1 else f"{len(t.objects)} objects"
        rows.append([t.name, t.dtype or t.kind, format_shape(t.shape), size, str(t.chunks), objs])
    print_table(rows, right={3, 4})


def _verify(args: argparse.Namespace) -> int:
    res = _run(args, "verify_checkpoint", args.checkpoint, read_data=args.read_data or None)
    if not args.json:
        what = "CRC32C checked" if res.checksums else "no checksums: structure and sizes"
        print(
            f"{res.url}: {plural(res.items, 'item')} in {plural(res.objects, 'object')}, "
            f"{res.items_read} read ({format_bytes(res.bytes_read)}, {what}) in {res.seconds:.1f} s"
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


_DIFF_LABELS = {"kind_changed": "type changed", "only_in_a": "only in A", "only_in_b": "only in B"}


def _label(status: str, labels: dict[str, str]) -> str:
    """How a state (``shape_changed`` ...) prints: its entry in ``labels``, else its words."""
    return labels.get(status, status.replace("_", " "))


def _diff(args: argparse.Namespace) -> int:
    res = _run(args, "diff_checkpoints", args.a, args.b, names=("include", "exclude"))
    if not args.json:
        print(f"A  {res.a}\nB  {res.b}")
        rows = []
        for e in res.entries:
            if e.status == "identical" and not args.all:
                continue
            in_a = f"{e.dtype_a or 'value'} {format_shape(e.shape_a)}"
            in_b = f"{e.dtype_b or 'value'} {format_shape(e.shape_b)}"
            detail = {"only_in_a": in_a, "only_in_b": in_b}.get(
                e.status, f"by {e.method}" if e.method else ""
            )
            if e.status in ("shape_changed", "dtype_changed", "kind_changed"):
                detail = f"{in_a} -> {in_b}"
            elif e.status == "changed" and e.max_abs_diff is not None:
                detail = (
                    f"max |a-b| {e.max_abs_diff:.6g}  mean {e.mean_abs_diff:.6g}  "
                    f"({e.changed_elements} elements)"
                )
            rows.append([_label(e.status, _DIFF_LABELS), e.name, detail])
        if rows:
            print()
            print_table(rows)
        by_crc = sum(1 for e in res.entries if e.method == "checksum")
        print(
            "\n"
            + ", ".join(f"{v} {_label(k, _DIFF_LABELS)}" for k, v in res.counts.items() if v)
            + f" ({by_crc} decided by checksum, "
            f"{format_bytes(res.bytes_compared)} compared by value)"
        )
    return EXIT_PARTIAL if args.exit_code and not res.identical else EXIT_OK


def _export(args: argparse.Namespace) -> int:
    if args.converter and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `--converter mymodule:fn` from the current folder
    names = ("format", "dtype", "max_shard_size", "only", "include", "exclude", "converter")
    res = _run(args, "export_checkpoint", args.checkpoint, args.dest, names=(*names, "overwrite"))
    if args.json:
        return EXIT_OK
    print(
        f"exported {plural(res.tensors, 'tensor')} ({format_bytes(res.tensor_bytes)}) from "
        f"{res.source} to {res.dest} in {res.seconds:.1f} s"
    )
    rows = [
        ["  " + f.name, format_bytes(f.size), plural(f.tensors, "tensor") if f.tensors else ""]
        for f in res.files
    ]
    print_table(rows, right={1})
    for s in res.skipped:
        print(f"skipped {s.name}: {s.reason}")
    for n in res.notes:
        print(f"note: {n}")
    return EXIT_OK


def _import(args: argparse.Namespace) -> int:
    import_safetensors = _tool(args, "import_safetensors")
    # SRC names a file, an index or a folder as typed (its text is recorded in the
    # checkpoint), so it is opened by import_safetensors; DEST is a checkpoint prefix.
    dest = open_location(args, args.dest)
    with ProgressBar(args.command, enabled=progress_enabled(args)) as bar:
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
    if args.json:
        print_json(res.to_dict())
        return EXIT_OK
    under = f" under '{res.prefix}.'" if res.prefix else ""
    print(
        f"imported {plural(res.tensors, 'tensor')} ({format_bytes(res.tensor_bytes)}) from "
        f"{plural(len(res.files), 'file')}{under} into {res.dest} in {res.seconds:.1f} s"
    )
    return EXIT_OK


_RESTORE_LABELS = {"archived": "failed"}  # a restore request that failed


def _restore(args: argparse.Namespace) -> int:
    """``s3ckpt restore URL``: a thin layer over :func:`s3ckpt.tools.restore_checkpoint` (no
    torch): RestoreObject for every archived object of a checkpoint (or of every committed
    checkpoint of a run), the objects per state on a terminal or as JSON, and with ``--wait``
    a poll until every copy is readable.

    Exit codes: 0 every restore asked for (or, with ``--wait``, every object readable); 1 some
    requests failed (each named); 2 bad input (a URL with nothing to restore, a bad option).
    """
    res = _run(args, "restore_checkpoint", args.url, names=("days", "tier", "wait", "poll_seconds"))
    if not args.json:
        print(
            f"{res.url}: {plural(len(res.checkpoints), 'checkpoint')}, "
            f"{plural(len(res.objects), 'object')} ({res.tier} tier, {res.days} days)"
        )
        rows = [
            [f"  {_label(s, _RESTORE_LABELS)}", plural(n, "object"), format_bytes(res.bytes[s])]
            for s, n in res.counts.items()
            if n
        ]
        print_table(rows, right={1, 2})
        for o in res.failed:
            print(f"  failed  {o.key}: {o.error}")
        if res.readable:
            print("every object reads now: load the checkpoint")
        elif not res.failed:
            print(
                "restores asked for: the checkpoint loads once every object is restored "
                f"(`s3ckpt restore {res.url} --wait` waits)"
            )
    if res.failed:
        error(
            f"{plural(len(res.failed), 'restore request')} failed; fix the cause and run "
            "`s3ckpt restore` again (the others go on)"
        )
        return EXIT_PARTIAL
    return EXIT_OK
