"""The server process: one asyncio event loop, the store, shaping, stats and control API.

Run it with ``python -m benchmarks.s3sim`` (see :func:`main` and README.md) or through
:class:`benchmarks.s3sim.S3Sim`. Control endpoints live under ``/_s3sim/`` (not a valid
bucket name, so they never shadow S3 paths) and are never shaped:

* ``GET /_s3sim/stats`` — JSON stats (schema in README.md);
* ``POST /_s3sim/reset`` — zero the stats (data and partition layout stay);
* ``GET|POST /_s3sim/config`` — read or change shaping and options (JSON object of knobs);
* ``POST /_s3sim/clear`` — drop every bucket and object.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import resource
import signal
import sys
import time
import traceback
from typing import Any

from . import _s3api
from ._errors import S3Error
from ._http import Connection, Request, Response
from ._options import Options
from ._shaping import READ, PartitionMap, Shaping, Throttle
from ._store import Store

__all__ = ["Server", "Stats", "main"]

#: Distinct prefixes the per-prefix counts keep; later ones are summed under "<other>".
MAX_PREFIXES = 10_000
_JSON = ("Content-Type", "application/json")


def _cpu() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


class Stats:
    """Counters since the last reset."""

    def __init__(self) -> None:
        self.started = time.time()
        self.reset()

    def reset(self) -> None:
        """Zero everything (not the process-lifetime CPU figures)."""
        self.t_reset = time.time()
        self.cpu_reset = sum(_cpu())
        self.ops: dict[str, list[int]] = {}
        self.prefixes: dict[str, list[int]] = {}
        self.accepted = 0

    def record(self, op: str, status: int, bytes_in: int, bytes_out: int) -> None:
        """One answered request."""
        row = self.ops.get(op)
        if row is None:
            row = self.ops[op] = [0, 0, 0, 0, 0]
        row[0] += 1
        if status == 503:
            row[1] += 1
        elif status >= 400:
            row[2] += 1
        row[3] += bytes_in
        row[4] += bytes_out

    def count_prefix(self, path: str, kind: str, depth: int) -> None:
        """One request on the first ``depth`` segments of ``path``."""
        parts = path.split("/", depth)
        name = "/".join(parts[:depth])
        row = self.prefixes.get(name)
        if row is None:
            if len(self.prefixes) >= MAX_PREFIXES:
                name = "<other>"
                row = self.prefixes.setdefault(name, [0, 0])
            else:
                row = self.prefixes[name] = [0, 0]
        row[0 if kind == READ else 1] += 1


class Server:
    """The :class:`~benchmarks.s3sim._http.App` of every connection."""

    def __init__(self, shaping: Shaping, options: Options, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.options = options
        self.store = Store(options)
        self.stats = Stats()
        self.open_connections = 0
        self.shaping = shaping
        self.partitions = PartitionMap(shaping, self.loop.time())

    # -- App -----------------------------------------------------------------------------------

    def on_headers(self, req: Request) -> Response | None:
        if req.path.startswith("/_s3sim/"):
            req.op = "_control"
            return None
        try:
            _s3api.route(req)
            if not req.kind:
                return None
            path = _s3api.partition_path(req)
            self.stats.count_prefix(path, req.kind, self.options.prefix_depth)
            if not self.partitions.admit(path, req.kind, self.loop.time()):
                return _s3api.error_response(S3Error.slow_down(), req)
        except Exception as exc:  # a bug: answer 500 (after the body) and say where
            traceback.print_exc()
            err = S3Error(500, "InternalError", f"We encountered an internal error: {exc!r}")
            return _s3api.error_response(err, req)
        return None

    def handle(self, req: Request) -> Response:
        if self.options.log_requests:
            hs = {k: v for k, v in req.headers.items() if k not in ("authorization",)}
            print(
                f"s3sim: {req.method} {req.target} {req.op} {hs} trailers={req.trailers}",
                file=sys.stderr,
            )
        try:
            if req.op == "_control":
                return self._control(req)
            return _s3api.handle(self.store, req)
        except Exception as exc:  # a bug: answer 500 and say where
            traceback.print_exc()
            err = S3Error(500, "InternalError", f"We encountered an internal error: {exc!r}")
            return _s3api.error_response(err, req)

    def ttfb(self, req: Request) -> float:
        return 0.0 if req.op == "_control" else self.shaping.ttfb_s

    def conn_rate(self) -> float | None:
        return self.shaping.conn_bytes_per_s

    def done(self, req: Request, resp: Response) -> None:
        if req.op == "_control":
            return
        out = 0 if resp.no_body else resp.length
        self.stats.record(req.op, resp.status, req.raw_len, out)
        if self.options.log_requests:
            print(f"s3sim: -> {resp.status} {resp.headers}", file=sys.stderr)

    def connection_change(self, delta: int) -> None:
        self.open_connections += delta
        if delta > 0:
            self.stats.accepted += 1

    # -- control -------------------------------------------------------------------------------

    def _control(self, req: Request) -> Response:
        name = req.path[len("/_s3sim/") :].strip("/")
        try:
            if name == "stats" and req.method == "GET":
                return _json(self.snapshot())
            if name == "reset" and req.method == "POST":
                self.stats.reset()
                self.partitions.reset_counts()
                return _json({"ok": True})
            if name == "clear" and req.method == "POST":
                self.store.clear()
                return _json({"ok": True})
            if name == "config" and req.method == "GET":
                return _json(self.config())
            if name == "config" and req.method == "POST":
                knobs = json.loads(bytes(req.body) or b"{}")
                if not isinstance(knobs, dict):
                    raise ValueError("config body must be a JSON object")
                self.configure(knobs)
                return _json(self.config())
        except (ValueError, TypeError, KeyError) as exc:
            return _json({"error": str(exc)}, 400)
        return _json({"error": f"no control endpoint {req.method} {req.path}"}, 404)

    def config(self) -> dict[str, Any]:
        """The current shaping and options."""
        return {"shaping": self.shaping.to_json(), "options": self.options.to_json()}

    def configure(self, knobs: dict[str, Any]) -> None:
        """Apply knobs (shaping fields, option fields, ``profile``). Any shaping knob, even
        one that changes nothing, starts a fresh partition layout (one per bucket)."""
        names = Options.names()
        opts = {k: v for k, v in knobs.items() if k in names}
        shaping = {k: v for k, v in knobs.items() if k not in names}
        # Both are validated before either is applied: a bad knob changes nothing.
        options = dataclasses.replace(self.options, **opts)
        new = Shaping.from_json(shaping, base=self.shaping) if shaping else self.shaping
        self.options = self.store.options = options
        if shaping:
            self.shaping = new
            self.partitions = PartitionMap(new, self.loop.time())

    def snapshot(self) -> dict[str, Any]:
        """The stats JSON (see README.md for the schema)."""
        s = self.stats
        user, system = _cpu()
        now = time.time()
        ops = {
            op: {
                "count": r[0],
                "slowdown": r[1],
                "errors": r[2],
                "bytes_in": r[3],
                "bytes_out": r[4],
            }
            for op, r in sorted(s.ops.items())
        }
        return {
            "pid": os.getpid(),
            "uptime_s": round(now - s.started, 3),
            "since_reset_s": round(now - s.t_reset, 3),
            "cpu_user_s": user,
            "cpu_system_s": system,
            "cpu_s": user + system,
            "cpu_s_since_reset": user + system - s.cpu_reset,
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "requests": sum(r[0] for r in s.ops.values()),
            "slowdowns": sum(r[1] for r in s.ops.values()),
            "errors": sum(r[2] for r in s.ops.values()),
            "bytes_in": sum(r[3] for r in s.ops.values()),
            "bytes_out": sum(r[4] for r in s.ops.values()),
            "ops": ops,
            "connections": {"open": self.open_connections, "accepted": s.accepted},
            "partitions": self.partitions.snapshot(self.loop.time()),
            "splits": list(self.partitions.splits),
            "prefixes": {p: {"reads": r[0], "writes": r[1]} for p, r in sorted(s.prefixes.items())},
            "store": {
                "buckets": len(self.store.buckets),
                "objects": self.store.objects,
                "bytes": self.store.bytes,
                "uploads": sum(len(b.uploads) for b in self.store.buckets.values()),
            },
            **self.config(),
        }


def _json(data: Any, status: int = 200) -> Response:
    return Response(status, [_JSON], [json.dumps(data).encode()])


# -- command line ----------------------------------------------------------------------------


def _size(text: str) -> int:
    units = {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "kb": 1000, "mb": 1000**2, "gb": 1000**3}
    t = text.strip().lower()
    for suffix, mult in units.items():
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


def _opt_float(text: str) -> float | None:
    return None if text.lower() in ("none", "off", "-") else float(text)


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m benchmarks.s3sim`` argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.s3sim",
        description="In-memory S3-compatible endpoint for benchmarks (path-style, no auth).",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000, help="0: any free port (printed)")
    p.add_argument(
        "--profile", choices=("none", "s3"), default="none", help="shaping preset (default none)"
    )
    # Shaping flags default to "not given" (absent from the namespace), so that "none" can
    # switch a knob of the profile off.
    g = p.add_argument_group(
        "shaping (each overrides the profile)", argument_default=argparse.SUPPRESS
    )
    g.add_argument("--ttfb-ms", type=float, help="time to first byte per request, ms (s3: 30)")
    g.add_argument(
        "--conn-mb-per-s", type=_opt_float, help="per-connection bandwidth, MB/s (s3: 85)"
    )
    g.add_argument(
        "--read-rate", type=_opt_float, help="GET/HEAD/LIST per second per partition (s3: 5500)"
    )
    g.add_argument(
        "--write-rate", type=_opt_float, help="PUT/POST/DELETE per second per partition (s3: 3500)"
    )
    g.add_argument("--burst-s", type=float, help="token bucket capacity in seconds of rate (1)")
    g.add_argument("--rate-scale", type=float, help="factor on read/write rates (1)")
    g.add_argument(
        "--split-after-s", type=_opt_float, help="hot seconds before a split (s3: 60; none: never)"
    )
    g.add_argument(
        "--split-load", type=float, help="fraction of a rate that makes a window hot (0.5)"
    )
    g.add_argument(
        "--throttle",
        action="append",
        metavar="BUCKET/PREFIX=READS/WRITES",
        help="fixed-rate partition ('-' for unlimited), repeatable",
    )
    o = p.add_argument_group("options")
    o.add_argument(
        "--min-part-size", type=_size, help="EntityTooSmall below this for non-last parts (5MiB)"
    )
    o.add_argument(
        "--md5-etags", action="store_true", default=None, help="ETag = MD5 of the body (costs CPU)"
    )
    o.add_argument("--checksums", choices=("fast", "all", "off"), help="checksums to verify (fast)")
    o.add_argument("--prefix-depth", type=int, help="path segments of the per-prefix stats (2)")
    o.add_argument(
        "--log-requests", action="store_true", default=None, help="one stderr line per request"
    )
    p.add_argument(
        "--bucket", action="append", default=[], help="create this bucket at start (repeatable)"
    )
    p.add_argument(
        "--config", help="JSON {'shaping': {...}, 'options': {...}} applied before the flags"
    )
    p.add_argument(
        "--ready-line", action="store_true", help="print one JSON line to stdout when listening"
    )
    return p


def config_from_args(args: argparse.Namespace) -> tuple[Shaping, Options]:
    """Shaping and options from the parsed command line."""
    cfg = json.loads(args.config) if args.config else {}
    shaping = Shaping.profile(args.profile)
    if cfg.get("shaping"):
        shaping = Shaping.from_json(cfg["shaping"], base=shaping)
    given = vars(args)
    changes: dict[str, Any] = {}
    if "ttfb_ms" in given:
        changes["ttfb_s"] = args.ttfb_ms / 1000
    for name in (
        "conn_mb_per_s", "read_rate", "write_rate", "split_after_s", "burst_s", "rate_scale",
        "split_load",
    ):  # fmt: skip
        if name in given:
            changes[name] = given[name]
    if "throttle" in given:
        changes["throttles"] = shaping.throttles + tuple(Throttle.parse(t) for t in args.throttle)
    shaping = shaping.replace(**changes)
    options = Options(**cfg.get("options", {}))
    ochanges = {
        k: getattr(args, k)
        for k in ("min_part_size", "md5_etags", "checksums", "prefix_depth", "log_requests")
        if getattr(args, k) is not None
    }
    return shaping, dataclasses.replace(options, **ochanges)


async def _serve(args: argparse.Namespace, shaping: Shaping, options: Options) -> None:
    loop = asyncio.get_running_loop()
    server = Server(shaping, options, loop)
    for b in args.bucket:
        server.store.create_bucket(b)
    srv = await loop.create_server(
        lambda: Connection(server, loop), args.host, args.port, backlog=1024, reuse_address=True
    )
    port = srv.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"s3sim: listening on http://{args.host}:{port} (pid {os.getpid()})", file=sys.stderr)
    if args.ready_line:
        sys.stdout.write(
            json.dumps({"s3sim": "ready", "host": args.host, "port": port, "pid": os.getpid()})
            + "\n"
        )
        sys.stdout.flush()
        # Nothing else may go to a pipe the parent stops reading: stdout joins stderr.
        os.dup2(2, 1)
    # Objects here are long-lived and acyclic: freeze what exists and collect rarely.
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    await stop.wait()
    srv.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.s3sim``."""
    args = build_parser().parse_args(argv)
    try:
        shaping, options = config_from_args(args)
    except (ValueError, TypeError) as exc:
        print(f"s3sim: {exc}", file=sys.stderr)
        return 2
    asyncio.run(_serve(args, shaping, options))
    return 0
