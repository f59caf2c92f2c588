"""A healthy training job and its retention cron, in a process of its own, so that the
process-wide ``s3ckpt.metrics.totals()`` it prints count its requests and nothing a test
before it left running.

Usage: python -m tests.integration._healthy_job BUCKET PROM_PATH   (AWS_ENDPOINT_URL set)

Prints one JSON document: the totals by operation and every event captured.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch

import s3ckpt.metrics as metrics
from s3ckpt import Checkpointer
from s3ckpt.cli import main as cli
from s3ckpt.retention import KeepLast


def run(bucket: str, prom: str) -> dict[str, object]:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    url = f"s3://{bucket}/healthy"
    with metrics.capture() as events:
        with Checkpointer(url, policy=KeepLast(1)) as ckpt:
            assert ckpt.load(model, opt) is None  # a new run: no pointer yet (404)
            ckpt.save(1, model, opt)
            ckpt.save(2, model, opt)
            ckpt.async_save(3, model, opt).wait()
            assert ckpt.latest() == 3
            assert ckpt.load(torch.nn.Linear(64, 32), None) == 3
        code = cli(["prune", url, "--policy", "pretraining", "--apply", "--metrics-file", prom])
    totals = metrics.totals()
    return {
        "cli": code,
        "operations": {op: dataclasses.asdict(c) for op, c in totals.operations.items()},
        "failed": totals.failed,
        "not_found": totals.not_found,
        "precondition_failed": totals.precondition_failed,
        "events": [dataclasses.asdict(e) for e in events],
    }


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2])))
