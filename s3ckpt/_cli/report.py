"""``s3ckpt report``: one self-contained HTML page about the checkpoints under a prefix.

A dry run: it lists (like ``ls``) and, with ``--policy``, plans (like ``prune`` without
``--apply``); it takes no lease and deletes nothing. Needs no torch. Exit codes are those of
:mod:`s3ckpt._cli`: 0 written, 1 written with damaged checkpoints (a marker that cannot be
read: its own row, a warning on stderr), 2 bad input (policy, prices, a storage class without
a price, an output file that cannot be written), 3 store error.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from s3ckpt._cli import EXIT_OK, Command, CommandError
from s3ckpt._cli._args import STEP_PATTERN_HELP, add_options, commands, refusing, retention_options
from s3ckpt._cli._output import add_output_options, print_json
from s3ckpt._units import format_bytes, plural
from s3ckpt.errors import ConfigError
from s3ckpt.retention import PolicyFile
from s3ckpt.retention._duration import format_duration
from s3ckpt.retention._liveness import DEFAULT_GRACE, MIN_GRACE
from s3ckpt.tools._report import (
    PriceTable,
    Report,
    collect_report,
    format_usd,
    parse_price,
    render_html,
)

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add report."""
    add = commands(sub, common)
    p = add(
        "report",
        _report,
        "write one self-contained HTML page: every checkpoint per run on a step/time "
        "chart, sizes, storage cost, and (with --policy) what a plan keeps or deletes and why",
        "Scan PATH (a run, or a prefix holding runs) as ls does and write an HTML "
        "report that opens from disk (no network, no server). With --policy, overlay a dry-run "
        "plan as prune makes it (no lease taken, nothing deleted). Costs use S3 list prices "
        "(us-east-1, USD per GB-month, GB = 2^30 bytes) by storage class unless --prices or "
        "--price says otherwise. Prints a one-line summary.",
    )
    p.add_argument("path", metavar="PATH")
    h = "the page to write (replaced atomically); - writes it to stdout and the summary to stderr"
    p.add_argument("--html", required=True, metavar="FILE", help=h)
    h = (
        "overlay this policy's plan: a policy TOML file, or the name of a ready-made one "
        "(e.g. pretraining)"
    )
    p.add_argument("--policy", metavar="POLICY", help=h)
    h = (
        "a TOML file of storage prices, CLASS = USD per GB-month under [prices] "
        "(classes it does not name keep the defaults)"
    )
    p.add_argument("--prices", metavar="FILE", help=h)
    h = (
        "the price of one storage class in USD per GB-month, e.g. STANDARD=0.021 (repeatable; "
        "wins over --prices)"
    )
    price = refusing(parse_price, ConfigError)
    p.add_argument("--price", action="append", type=price, default=[], metavar="CLASS=USD", help=h)
    p.add_argument("--title", help="the page's title (default: s3ckpt report: PATH)")
    h = (
        "a save is in progress while any of its objects, heartbeats or open uploads is "
        "younger than this; with --policy raised to at least "
        f"{format_duration(MIN_GRACE)}, as prune does (default {format_duration(DEFAULT_GRACE)})"
    )
    add_options(p, "--grace", help=h)
    add_options(p, "--now", help="report (and plan) as of this ISO time (default: now)")
    h = "let the plan treat stock-DCP checkpoints (.metadata but no s3ckpt.json) as committed"
    add_options(p, "--include-foreign", help=h)
    h = "plan at most N deletions per run (the oldest first), as prune --max-delete"
    add_options(p, "--max-delete", help=h)
    add_options(
        p, "--step-pattern", help=STEP_PATTERN_HELP + " (default: the policy file's step_pattern)"
    )
    add_output_options(p)


def _write(path: str, page: str) -> None:
    """Write ``page`` to ``path`` atomically (a reader never sees half a page)."""
    target = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise CommandError(f"{path}: cannot write the report: {exc.strerror or exc}") from None


def _summary_line(report: Report, where: str) -> str:
    doc: dict[str, Any] = report.summary()
    runs, n = plural(doc["runs"], "run"), plural(doc["checkpoints"], "checkpoint")
    line = (
        f"wrote {where}: {runs}, {n}, {format_bytes(doc['total_size'])}, "
        f"{format_usd(doc['cost_month'])}/month"
    )
    if report.policy is not None:
        line += (
            f"; the plan deletes {doc['delete']} ({format_bytes(doc['bytes_freed'])} freed), "
            f"{format_usd(doc['cost_month_after'])}/month after"
        )
    return line


def _report(args: argparse.Namespace) -> int:
    to_stdout = args.html == "-"
    if to_stdout and args.json:
        raise CommandError("--json prints on stdout: write the page to a file (--html FILE)")
    policy = PolicyFile.load(args.policy) if args.policy else None  # bad: exit 2, no request
    prices = PriceTable.load(args.prices) if args.prices else PriceTable()
    if args.price:
        prices = prices.with_prices(dict(args.price), f"{prices.source}; --price")
    options = retention_options(args)
    target = Path(args.html)
    if not to_stdout:  # before the scan, which may take minutes on a big bucket
        if target.is_dir():
            raise CommandError(f"{args.html}: is a directory: name the HTML file to write")
        if not target.parent.is_dir():
            raise CommandError(
                f"{args.html}: cannot write the report: directory {target.parent} does not exist"
            )
    cmd = Command(args, args.path)
    with cmd.working():
        report = collect_report(
            cmd.location, policy=policy, options=options, prices=prices, title=args.title
        )
    page = render_html(report)
    if to_stdout:
        print(page, end="", flush=True)
        print(_summary_line(report, "the page to stdout"), file=sys.stderr)
    else:
        _write(args.html, page)
        if args.json:
            print_json({"html": str(args.html), **report.to_dict()}, strict=True)
        else:
            print(_summary_line(report, args.html))
        sys.stdout.flush()
    # A damaged checkpoint is on the page as its own row, and named on stderr: exit 1.
    return cmd.finish(EXIT_OK, damaged=(row.info for run in report.runs for row in run.rows))
