"""``s3ckpt doctor URL``: will this store keep checkpoints safe, as configured?

Runs :func:`s3ckpt.tools.run_doctor` and prints one row per check (✔ ok, ✘ failed,
! warning, an en dash skipped), each ✘ and ! followed by what it means and what to do; ``--json``
prints one object with every check and the verdict. Needs no torch (without it the round
trip is a raw put / multipart one, and a row says so).
"""

from __future__ import annotations

import argparse
import sys

from s3ckpt._cli import EXIT_OK, EXIT_PARTIAL, open_location
from s3ckpt._cli._args import commands
from s3ckpt._cli._output import add_output_options, print_json
from s3ckpt._units import plural
from s3ckpt.tools import run_doctor
from s3ckpt.tools._doctor_report import Check, CheckStatus, DoctorReport

__all__ = ["register"]

EXIT_CODES_HELP = (
    "exit codes: 0 every check passed (warnings allowed); 1 a check failed: the store will "
    "not keep checkpoints safe as configured; 2 bad input (URL, options, unknown profile); "
    "3 the store cannot be reached or refused the credentials (no such bucket, endpoint "
    "down, bad keys); 130 interrupted (the scratch prefix is removed first)"
)

_SYMBOLS = {
    CheckStatus.OK: ("✔", "ok"),
    CheckStatus.FAIL: ("✘", "FAIL"),
    CheckStatus.WARN: ("!", "!"),
    CheckStatus.SKIP: ("\u2013", "-"),  # an en dash
}
_NAME_WIDTH = 23  # the longest check name, "permission list uploads"


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add doctor."""
    add = commands(sub, common)
    p = add(
        "doctor",
        _doctor,
        "check that a store will keep checkpoints safe: credentials, endpoint, clock "
        "skew, conditional writes, checksums, permissions and a save/load round trip",
        "Check the store at URL as a training job and a pruner would use it: "
        "credentials and their source, region, endpoint and addressing, clock skew against "
        "the store, conditional writes (If-None-Match, If-Match, conditional delete), "
        "checksum echo, ListMultipartUploads, every permission the trainer and pruner need "
        "(each exercised for real), and a small save/load round trip. Everything it writes "
        "goes under URL/s3ckpt-doctor-RANDOM/ and is removed at the end.",
        epilog=EXIT_CODES_HELP,
    )
    p.add_argument("url", metavar="URL", help="where checkpoints go, e.g. s3://bucket/runs/")
    add_output_options(p, progress=False)


def _symbol(status: CheckStatus) -> str:
    """The row's mark: ✔ ✘ ! or an en dash where stdout can encode them, else ASCII."""
    fancy, plain = _SYMBOLS[status]
    try:
        fancy.encode(sys.stdout.encoding or "ascii")
        return fancy
    except (UnicodeEncodeError, LookupError):
        return plain


def _print_row(check: Check) -> None:
    print(f"{_symbol(check.status)} {check.name.ljust(_NAME_WIDTH)}  {check.detail}", flush=True)
    if check.meaning and check.status in (CheckStatus.FAIL, CheckStatus.WARN):
        print(f"  {' ' * _NAME_WIDTH}  -> {check.meaning}", flush=True)


def _verdict(report: DoctorReport) -> str:
    if report.ok:
        warned = sum(c.status is CheckStatus.WARN for c in report.checks)
        tail = f" ({plural(warned, 'warning')})" if warned else ""
        return f"verdict: this store will keep checkpoints safe as configured{tail}"
    names = ", ".join(c.name for c in report.failed)
    return f"verdict: NOT SAFE as configured: {plural(len(report.failed), 'check')} failed: {names}"


def _doctor(args: argparse.Namespace) -> int:
    location = open_location(args, args.url, folder=True)
    rows: list[Check] = []

    def on_check(check: Check) -> None:
        # The header waits for the first row: a store that cannot be reached ends the
        # command with its one error line, nothing on stdout.
        if not rows and not args.json:
            print(f"s3ckpt doctor {location}", flush=True)
        rows.append(check)
        if not args.json:
            _print_row(check)

    try:
        report = run_doctor(location, on_check=on_check)
    except KeyboardInterrupt:
        # The cleanup ran first; on a terminal its row is printed, with --json say it here.
        if args.json and rows and rows[-1].name == "cleanup":
            print(f"s3ckpt: cleanup: {rows[-1].detail}", file=sys.stderr)
        raise
    code = EXIT_OK if report.ok else EXIT_PARTIAL
    if args.json:
        print_json({**report.to_dict(), "exit_code": code})
    else:
        print(_verdict(report))
    return code
