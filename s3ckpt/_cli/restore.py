"""``s3ckpt restore URL``: a thin layer over :func:`s3ckpt.tools.restore_checkpoint` (no
torch): RestoreObject for every archived object of a checkpoint (or of every committed
checkpoint of a run), the objects per state on a terminal or as JSON, and with ``--wait``
a poll until every copy is readable.

Exit codes: 0 every restore asked for (or, with ``--wait``, every object readable); 1 some
requests failed (each named); 2 bad input (a URL with nothing to restore, a bad option).
"""

from __future__ import annotations

import argparse

from s3ckpt._cli import EXIT_OK, EXIT_PARTIAL, _seconds, error, open_location
from s3ckpt._cli._output import (
    ProgressBar,
    add_output_options,
    print_json,
    print_table,
    progress_enabled,
)
from s3ckpt._units import format_bytes, plural

__all__ = ["register"]

_TIERS = ("Standard", "Bulk", "Expedited")
_LABELS = {
    "started": "started",
    "in_progress": "in progress",
    "restored": "restored",
    "not_archived": "not archived",
    "archived": "failed",
}


def _days(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of days >= 1, got {text!r}")
    return value


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add ``restore``."""
    p = sub.add_parser(
        "restore",
        parents=[common],
        help="restore a checkpoint's GLACIER / DEEP_ARCHIVE objects so that it loads",
        description="Issue RestoreObject for every archived object (GLACIER, DEEP_ARCHIVE) "
        "of a checkpoint, or of every committed checkpoint under a run, and report each "
        "object's state. A load needs every object restored; --wait polls until it is.",
    )
    p.add_argument("url", metavar="URL", help="checkpoint or run URL")
    p.add_argument(
        "--days",
        type=_days,
        default=7,
        metavar="N",
        help="days the restored copies stay readable (default 7)",
    )
    p.add_argument(
        "--tier",
        choices=_TIERS,
        default="Standard",
        help="retrieval tier: Standard (GLACIER 3-5 h, DEEP_ARCHIVE 12 h), Bulk (cheaper, "
        "slower), Expedited (GLACIER only, minutes); default Standard",
    )
    p.add_argument("--wait", action="store_true", help="poll until every restored copy is readable")
    p.add_argument(
        "--poll-seconds",
        type=_seconds,
        default=300.0,
        metavar="S",
        help="with --wait: seconds between polls (one HEAD per object still restoring; "
        "default 300)",
    )
    add_output_options(p)
    p.set_defaults(func=_restore)


def _restore(args: argparse.Namespace) -> int:
    from s3ckpt.tools import restore_checkpoint

    location = open_location(args, args.url)
    bar = ProgressBar("restore", enabled=progress_enabled(args))
    try:
        res = restore_checkpoint(
            location,
            days=args.days,
            tier=args.tier,
            wait=args.wait,
            poll_seconds=args.poll_seconds,
            progress=bar,
        )
    finally:
        bar.close()
    if args.json:
        print_json(res.to_dict())
    else:
        counts, sizes = res.counts, res.bytes
        print(
            f"{res.url}: {plural(len(res.checkpoints), 'checkpoint')}, "
            f"{plural(len(res.objects), 'object')} ({res.tier} tier, {res.days} days)"
        )
        rows = [
            [f"  {_LABELS[state]}", plural(n, "object"), format_bytes(sizes[state])]
            for state, n in counts.items()
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
