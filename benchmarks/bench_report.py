"""``s3ckpt report`` benchmark (not a test): how long the page takes to build, how big it
is, and how long headless Chromium takes to load and render it, for 100 / 1,000 / 10,000
checkpoints in one run.

Run from the repository root::

    .venv/bin/python benchmarks/bench_report.py
    .venv/bin/python benchmarks/bench_report.py --sizes 100,1000,10000,30000 --repeat 3

What it measures, for each size N (one run of N committed checkpoints with two metrics, a
pin every 1,000th, in ``MemoryStore``, built outside the timing):

1. ``collect``: :func:`s3ckpt.tools.collect_report` with the ``pretraining`` policy (the
   scan: one listing and N marker GETs in memory, and ``plan()``): best of ``--repeat``.
2. ``render``: :func:`s3ckpt.tools.render_html` of that report: best of ``--repeat``.
3. ``size``: the page's bytes (and gzip-compressed, for a page served or mailed).
4. ``load``: Chromium (``/usr/bin/chromium``, Playwright) from ``goto`` of the file to the
   second animation frame after ``load`` (the page painted): best of ``--repeat``, a fresh
   page each time. ``toggle``: clicking the x-axis toggle to commit time (every point
   moved) until the next frame. ``sort``: clicking the size column (every row re-ordered)
   until the next frame.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._chromium import launch  # noqa: E402
from s3ckpt.format._manifest import Manifest, ObjectRecord  # noqa: E402
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME, PIN_NAME  # noqa: E402
from s3ckpt.retention import RetentionOptions, load_policy  # noqa: E402
from s3ckpt.store import Location, MemoryStore  # noqa: E402
from s3ckpt.tools import collect_report, render_html  # noqa: E402
from s3ckpt.uri import StoreURL  # noqa: E402

T0 = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
NEXT_FRAME = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"


def bucket(n: int) -> tuple[MemoryStore, StoreURL]:
    """One run of ``n`` committed checkpoints (3 data objects each), one every 10 minutes."""
    store = MemoryStore("bench")
    run = StoreURL("s3", "bench", "runs/bench/")
    for i in range(n):
        step = (i + 1) * 100
        ckpt = run.child(f"step_{step:09d}")
        recs = []
        for r in range(3):
            store.put(ckpt.key(f"__{r}_0.distcp"), b"x" * (1000 + i % 97))
            recs.append(ObjectRecord(f"__{r}_0.distcp", 1000 + i % 97, r))
        store.put(ckpt.key(METADATA_NAME), b"m")
        m = Manifest(
            "s",
            T0 + 600 * i,
            3,
            METADATA_NAME,
            0,
            1,
            tuple(recs),
            (),
            step,
            metrics={"val_loss": 2.0 / (1 + i) ** 0.3 + 0.01 * (i % 13), "lr": 3e-4},
            format_version=2,  # item records inline (none here): no records object to write
        )
        store.put(ckpt.key(MANIFEST_NAME), m.to_json())
        if i % 1000 == 0:
            store.put(ckpt.key(PIN_NAME), b'{"reason": "eval"}')
    return store, StoreURL("s3", "bench", "runs/")


def best(fn: Any, repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def browser_times(browser: Any, path: Path, repeat: int) -> tuple[float, float, float]:
    loads, toggles, sorts = [], [], []
    for _ in range(repeat):
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        t = time.perf_counter()
        page.goto(path.as_uri(), wait_until="load")
        page.evaluate(NEXT_FRAME)
        loads.append(time.perf_counter() - t)
        t = time.perf_counter()
        page.click('#r0 button[data-xmode="time"]')
        page.evaluate(NEXT_FRAME)
        toggles.append(time.perf_counter() - t)
        t = time.perf_counter()
        page.click('#r0 th[data-sort="size"]')
        page.evaluate(NEXT_FRAME)
        sorts.append(time.perf_counter() - t)
        page.close()
    return min(loads), min(toggles), min(sorts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,1000,10000", help="checkpoint counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per size (best is shown)")
    ap.add_argument("--no-browser", action="store_true", help="skip the Chromium timings")
    args = ap.parse_args()
    policy = load_policy("pretraining")
    now = datetime.fromtimestamp(T0 + 600 * 40_000, UTC)
    sizes = [int(s) for s in args.sizes.split(",")]
    pw = browser = None
    if not args.no_browser:
        from playwright.sync_api import sync_playwright

        pw = sync_playwright().start()
        browser = launch(pw)
    rows = [["checkpoints", "collect", "render", "size", "gzip", "load", "toggle", "sort"]]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in sizes:
                store, root = bucket(n)
                t_collect, report = best(
                    lambda store=store, root=root: collect_report(
                        Location(root, store), policy=policy, options=RetentionOptions(now=now)
                    ),
                    args.repeat,
                )
                t_render, page = best(lambda report=report: render_html(report), args.repeat)
                data = page.encode("utf-8")
                path = Path(tmp) / f"report-{n}.html"
                path.write_bytes(data)
                load = toggle = sort = float("nan")
                if browser is not None:
                    load, toggle, sort = browser_times(browser, path, args.repeat)
                rows.append(
                    [
                        f"{n:,}",
                        f"{t_collect * 1000:.0f} ms",
                        f"{t_render * 1000:.0f} ms",
                        f"{len(data) / 2**20:.2f} MiB",
                        f"{len(gzip.compress(data, 6)) / 2**20:.2f} MiB",
                        f"{load * 1000:.0f} ms",
                        f"{toggle * 1000:.0f} ms",
                        f"{sort * 1000:.0f} ms",
                    ]
                )
                print(f"  {n:,} done", file=sys.stderr)
    finally:
        if browser is not None:
            browser.close()
        if pw is not None:
            pw.stop()
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"## s3ckpt report, policy pretraining, best of {args.repeat}")
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
