"""The screenshot in docs/report.md: a demo bucket on an embedded moto S3 server, reported
with the ready-made ``pretraining`` policy, opened in headless Chromium.

Run from the repository root (needs ``moto[server]``, Playwright and /usr/bin/chromium)::

    .venv/bin/python scripts/report_screenshot.py                  # writes docs/img/report.png
    .venv/bin/python scripts/report_screenshot.py --html /tmp/demo.html --dark

The bucket holds an 8B-parameter pre-training run (a checkpoint every 500 steps over nine
days, a loss curve with a spike, one pinned checkpoint, a save in progress and a save whose
writer died) and its fine-tuning run in STANDARD_IA. Checkpoints of that size cannot sit in
an in-memory server, so each stored byte stands for a MiB: the listing's sizes are scaled by
2^20 (:class:`MiBPerByte`, a store wrapper) before the report sees them. Everything else (the
scan, the states, the plan, the page) is the real path over S3's API.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._chromium import launch  # noqa: E402
from s3ckpt._commit import pid_namespace  # noqa: E402
from s3ckpt.config import S3Config  # noqa: E402
from s3ckpt.format._manifest import Manifest, ObjectRecord  # noqa: E402
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME, data_name, heartbeat_name  # noqa: E402
from s3ckpt.retention import load_policy, pin  # noqa: E402
from s3ckpt.store.base import ObjectInfo  # noqa: E402
from s3ckpt.store.s3 import S3Store  # noqa: E402
from s3ckpt.tools import build_report  # noqa: E402
from s3ckpt.uri import StoreURL  # noqa: E402

HOUR = 3600.0


class MiBPerByte:
    """An ObjectStore whose listings report every stored byte as a MiB (the demo's scale)."""

    def __init__(self, store: S3Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for o in self._store.list(prefix):
            yield replace(o, size=o.size * 2**20)


def save(
    store: S3Store, run: StoreURL, step: int, created: float, mib: int, metrics: dict[str, float]
) -> StoreURL:
    """One committed checkpoint of ``mib`` (scaled) bytes in 8 data objects."""
    tag = uuid.uuid4().hex[:8]
    ckpt = run.child(f"step_{step:09d}")
    recs = []
    for r in range(8):
        size = mib // 8
        store.put(ckpt.key(data_name(r, 0, tag)), b"\0" * size)
        recs.append(ObjectRecord(data_name(r, 0, tag), size, r))
    store.put(ckpt.key(METADATA_NAME), b"m")
    m = Manifest(tag + uuid.uuid4().hex[8:], created, 8, METADATA_NAME, 0, 1, tuple(recs), ())
    m = replace(m, step=step, metrics=metrics)
    store.put(ckpt.key(MANIFEST_NAME), m.to_json(), if_none_match=True)
    return ckpt


def demo_bucket(bucket: str) -> None:
    rng = random.Random(7)
    now = time.time()
    store = S3Store(bucket)
    pre = StoreURL("s3", bucket, "runs/llama-8b/pretrain/")
    n = 48
    for i in range(n):
        step = (i + 1) * 500
        created = now - (n - i) * 4.5 * HOUR - rng.uniform(0, 0.5) * HOUR
        loss = 2.1 + 2.4 / math.sqrt(i + 1) + rng.gauss(0, 0.03) + (0.35 if i in (29, 30) else 0)
        save(store, pre, step, created, 96 * 1024, {"val_loss": loss, "lr": 3e-4})
    pin(store, pre.child("step_000010000"), "paper: table 2 evals")
    # A save in progress (fresh objects, no marker yet) and a save whose writer died.
    tag = uuid.uuid4().hex[:8]
    live = pre.child(f"step_{(n + 1) * 500:09d}")
    for r in range(3):
        store.put(live.key(data_name(r, 0, tag)), b"\0" * (12 * 1024))
    died = StoreURL("s3", bucket, "runs/llama-8b/sft-v1/").child("step_000002000")
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    tag = uuid.uuid4().hex[:8]
    beat = {
        "tag": tag,
        "rank": 0,
        "host": os.uname().nodename,
        "pidns": pid_namespace(),
        "pid": int(gone.stdout),
    }
    store.put(died.key(heartbeat_name(tag, 0)), json.dumps(beat).encode())
    store.put(died.key(data_name(0, 0, tag)), b"\0" * (5 * 1024))
    sft = StoreURL("s3", bucket, "runs/llama-8b/sft-v1/")
    ia = S3Store(bucket, S3Config(storage_class="STANDARD_IA"))
    for i in range(9):
        step = (i + 1) * 200
        created = now - (9 - i) * 2 * HOUR
        acc = 0.62 + 0.2 * (1 - math.exp(-i / 3)) + rng.gauss(0, 0.006)
        save(ia, sft, step, created, 16 * 1024, {"eval_accuracy": acc})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "report.png"))
    ap.add_argument("--html", default=None, help="also keep the page here")
    ap.add_argument("--dark", action="store_true", help="prefers-color-scheme: dark")
    args = ap.parse_args()

    import boto3
    from moto.server import ThreadedMotoServer
    from playwright.sync_api import sync_playwright

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ["AWS_ENDPOINT_URL"] = f"http://{host}:{port}"
    for var, value in (("AWS_ACCESS_KEY_ID", "demo"), ("AWS_SECRET_ACCESS_KEY", "demo")):
        os.environ.setdefault(var, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    try:
        bucket = "ml-checkpoints"
        boto3.client("s3").create_bucket(Bucket=bucket)
        demo_bucket(bucket)
        store = MiBPerByte(S3Store(bucket))
        page = build_report(
            store,
            StoreURL("s3", bucket, "runs/llama-8b/"),
            policy=load_policy("pretraining"),
            title="Checkpoints of llama-8b",
        )
    finally:
        server.stop()
    html_path = Path(args.html) if args.html else Path(args.out).with_suffix(".html")
    html_path.write_text(page, encoding="utf-8")
    with sync_playwright() as p:
        browser = launch(p)
        ctx = browser.new_context(
            viewport={"width": 1360, "height": 1180},
            device_scale_factor=1,
            color_scheme="dark" if args.dark else "light",
        )
        tab = ctx.new_page()
        tab.goto(html_path.resolve().as_uri())
        tab.hover("#r0-p29")  # the loss spike: its row lit, its details under the chart
        tab.screenshot(path=args.out)
        browser.close()
    if not args.html:
        html_path.unlink()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
