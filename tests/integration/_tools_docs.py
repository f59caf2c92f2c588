"""Regenerate the example output in docs/tools.md: start a moto server, save a small model at
two steps in the Checkpointer's layout, and print what the tools say.

    .venv/bin/python -m tests.integration._tools_docs > /tmp/tools-output.md

Each block is printed under a ``<!-- OUTPUT_NAME -->`` heading, to paste into the docs.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import time
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from s3ckpt import S3StorageWriter
from s3ckpt.cli import main
from s3ckpt.tools import load_verified
from tests._http import free_port

BUCKET = "ml-checkpoints"


def run_cli(*argv: str) -> None:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        code = main(list(argv))
    print("```")
    print(f"$ s3ckpt {shlex.join(argv)}")
    print(buf.getvalue().rstrip())
    print(f"$ echo $?\n{code}")
    print("```\n")


def model_and_optim() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(1000, 256), nn.Linear(256, 1024), nn.Linear(1024, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x = torch.randint(0, 1000, (8, 16))
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def state(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "train_state": {"step": step}}


def main_() -> None:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        raw = boto3.client("s3", endpoint_url=endpoint)
        raw.create_bucket(Bucket=BUCKET)
        model, opt = model_and_optim()
        train(model, opt, 3)
        a = f"s3://{BUCKET}/run/step_000000100"
        b = f"s3://{BUCKET}/run/step_000000200"
        wa = S3StorageWriter(a, step=100, metrics={"loss": 2.31})
        dcp.save(state(model, opt, 100), storage_writer=wa, no_dist=True)
        # Change the second Linear only: the embedding and the last layer stay identical.
        with torch.no_grad():
            model[1].weight.add_(1e-3 * torch.randn_like(model[1].weight))
        wb = S3StorageWriter(b, step=200, metrics={"loss": 2.07})
        dcp.save(state(model, opt, 200), storage_writer=wb, no_dist=True)

        print("<!-- OUTPUT_INSPECT -->")
        run_cli("inspect", a)
        run_cli("inspect", a, "--summary", "--json")

        print("<!-- OUTPUT_VERIFY -->")
        run_cli("verify", a)
        # Flip one byte of one object and truncate another, then verify again.
        listing = raw.list_objects_v2(Bucket=BUCKET, Prefix="run/step_000000200/")["Contents"]
        objs = sorted(o["Key"] for o in listing if o["Key"].endswith(".distcp"))
        first = raw.get_object(Bucket=BUCKET, Key=objs[0])["Body"].read()
        flipped = bytearray(first)
        flipped[len(flipped) // 2] ^= 0xFF
        raw.put_object(Bucket=BUCKET, Key=objs[0], Body=bytes(flipped))
        if len(objs) > 1:
            second = raw.get_object(Bucket=BUCKET, Key=objs[1])["Body"].read()
            raw.put_object(Bucket=BUCKET, Key=objs[1], Body=second[: len(second) // 2])
        run_cli("verify", b)
        # Put the original bytes back for the other examples.
        raw.put_object(Bucket=BUCKET, Key=objs[0], Body=first)
        if len(objs) > 1:
            raw.put_object(Bucket=BUCKET, Key=objs[1], Body=second)

        print("<!-- OUTPUT_DIFF -->")
        run_cli("diff", a, b, "--include", "model.*")
        run_cli("diff", a, b, "--include", "model.*", "--json")

        print("<!-- OUTPUT_EXPORT -->")
        t0 = time.perf_counter()
        run_cli(
            "export",
            a,
            f"s3://{BUCKET}/hf/step_100",
            "--only",
            "model",
            "--dtype",
            "bf16",
            "--max-shard-size",
            "1MB",
            "--no-progress",
        )
        print(f"<!-- export took {time.perf_counter() - t0:.1f}s -->\n")

        print("<!-- OUTPUT_IMPORT -->")
        run_cli("import", f"s3://{BUCKET}/hf/step_100", f"s3://{BUCKET}/finetune/step_000000000")

        print("<!-- OUTPUT_RESTORE -->")
        fresh, _ = model_and_optim()
        sd = {"model": fresh.state_dict(), "extra": {"head.weight": torch.zeros(4, 4)}}
        try:
            load_verified(sd, a)
        except Exception as exc:
            print("```")
            print(f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
            print("```")
    finally:
        server.stop()


if __name__ == "__main__":
    main_()
