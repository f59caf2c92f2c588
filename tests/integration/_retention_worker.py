"""A pruner in its own process, for the crash tests: prints one JSON line per progress
event (flushed), so the parent can SIGKILL it at a chosen point.

Usage: python -m tests.integration._retention_worker BUCKET RUN_PREFIX NOW_ISO BATCH
(the endpoint comes from AWS_ENDPOINT_URL, as the test fixtures export it).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any

from s3ckpt.retention import KeepBest, KeepEvery, KeepLast, Policy, RetentionOptions, prune
from s3ckpt.store import Location
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL

POLICY: Policy = KeepLast(3) | KeepEvery(500) | KeepBest(2, "loss")


def main(argv: list[str]) -> int:
    bucket, prefix, now_iso, batch = argv
    store = S3Store(bucket)
    run = StoreURL("s3", bucket, prefix)

    def progress(event: str, details: dict[str, Any]) -> None:
        print(json.dumps({"event": event, **details}), flush=True)

    result = prune(
        Location.of(run, store=store),
        POLICY,
        apply=True,
        options=RetentionOptions(
            now=datetime.fromisoformat(now_iso), batch_size=int(batch), on_progress=progress
        ),
    )
    print(json.dumps({"event": "result", "deleted": list(result.deleted), "ok": result.ok}))
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
