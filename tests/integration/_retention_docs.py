"""Regenerate the example plans in docs/retention.md: start a moto server, write two
example runs, and print what `s3ckpt ls` and `s3ckpt prune --policy ...` say.

    .venv/bin/python -m tests.integration._retention_docs
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import time
from datetime import UTC, datetime, timedelta

from s3ckpt._time import iso_z
from s3ckpt.cli import main
from s3ckpt.retention import pin
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL
from tests._retention_util import write_checkpoint

BUCKET = "ml-checkpoints"


def run_cli(*argv: str) -> None:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        code = main(list(argv))
    shown = " ".join(argv)
    print(f"$ s3ckpt {shown}")
    print(buf.getvalue().rstrip())
    print(f"[exit {code}]\n")


def main_() -> None:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ["AWS_ENDPOINT_URL"] = f"http://{host}:{port}"
    store = S3Store(BUCKET)
    store.client.create_bucket(Bucket=BUCKET)

    # A pre-training run: a checkpoint every 2,500 steps, every 6 hours, for 5.5 days.
    llm = StoreURL("s3", BUCKET, "runs/llama-8b/")
    t0 = datetime(2025, 3, 1, tzinfo=UTC)
    for i in range(22):
        step = 2500 * (i + 1)
        loss = 2.0 + 3.0 / math.sqrt(i + 1) + (0.15 if i % 5 == 3 else 0.0)
        metrics = {} if i == 17 else {"eval_loss": round(loss, 3)}
        created = (t0 + timedelta(hours=6 * i)).timestamp()
        write_checkpoint(store, llm, step, created=created, metrics=metrics, data_objects=2)
    pin(store, llm.child("step_000010000"), "ablation baseline")
    write_checkpoint(store, llm, 57500, created=time.time(), commit=False, data_objects=1)
    now_llm = iso_z(t0 + timedelta(hours=6 * 21 + 1))

    # A finished run kept for the record: one checkpoint in the middle of each month.
    old = StoreURL("s3", BUCKET, "runs/resnet-2023/")
    for i in range(21):
        month = datetime(2023 + (5 + i) // 12, (5 + i) % 12 + 1, 15, tzinfo=UTC)
        write_checkpoint(store, old, 1000 * (i + 1), created=month.timestamp(), data_objects=1)
    pin(store, old.child("step_000004000"), "release v1")
    now_old = iso_z(datetime(2025, 3, 1, tzinfo=UTC))

    run_cli("ls", f"s3://{BUCKET}/runs/llama-8b/")
    for name in ("keep-last-3", "pretraining", "finetuning"):
        run_cli("prune", str(llm), "--policy", name, "--now", now_llm)
    run_cli("prune", str(old), "--policy", "archive", "--now", now_old)
    run_cli("prune", str(llm), "--policy", "keep-last-3", "--now", now_llm, "--apply")
    server.stop()


if __name__ == "__main__":
    main_()
