"""``make demo`` / ``s3ckpt demo``: save a small model to S3 and load it back.

With no endpoint configured (neither ``S3CKPT_DEMO_URL`` nor ``AWS_ENDPOINT_URL``), the
demo starts an embedded S3 server (moto's ThreadedMotoServer) on 127.0.0.1 with dummy
credentials, so it runs on a fresh machine with no AWS account. Point it at a real bucket
with ``S3CKPT_DEMO_URL=s3://bucket/prefix`` (credentials from boto3's default chain).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["main"]


@contextmanager
def _embedded_s3() -> Iterator[str]:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:  # pragma: no cover - only without the test extra
        raise SystemExit(
            "the demo's embedded S3 server needs moto: pip install 's3ckpt[test]' "
            "(or set S3CKPT_DEMO_URL=s3://bucket/prefix to use a real bucket)"
        ) from exc
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {
        k: os.environ.get(k)
        for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    }
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "demo")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "demo")
    try:
        yield endpoint
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _model(width: int, depth: int):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Embedding(8192, width)]
    for _ in range(depth):
        layers += [
            torch.nn.LayerNorm(width),
            torch.nn.Linear(width, 4 * width),
            torch.nn.GELU(),
            torch.nn.Linear(4 * width, width),
        ]
    return torch.nn.Sequential(*layers)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def run(url: str, width: int, depth: int) -> None:
    """Save, list, load and compare; print what happened."""
    import torch
    import torch.distributed.checkpoint as dcp

    from s3ckpt import S3StorageReader, S3StorageWriter
    from s3ckpt.store import open_store

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    model = _model(width, depth)
    sd = model.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    print(
        f"model: {sum(t.numel() for t in sd.values()):,} parameters, {_fmt_bytes(nbytes)}, "
        f"{len(sd)} tensors"
    )
    print(f"saving to {url}")
    writer = S3StorageWriter(url, step=0, metrics={"demo": 1.0})
    t0 = time.perf_counter()
    dcp.save({"model": sd}, storage_writer=writer)
    save_s = time.perf_counter() - t0

    store, parsed = open_store(url)
    print("\nwritten:")
    for obj in store.list(parsed.prefix):
        print(f"  {obj.key[len(parsed.prefix) :]:<32} {_fmt_bytes(obj.size):>12}")

    fresh = _model(width, depth)
    for p in fresh.parameters():
        torch.nn.init.zeros_(p)
    target = {"model": fresh.state_dict()}
    reader = S3StorageReader(url)
    t0 = time.perf_counter()
    dcp.load(target, storage_reader=reader)
    load_s = time.perf_counter() - t0
    fresh.load_state_dict(target["model"])
    same = all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True)
    )
    mb = nbytes / 1e6
    print(
        f"\nsave: {save_s:.2f} s ({mb / save_s:.0f} MB/s)   "
        f"load: {load_s:.2f} s ({mb / load_s:.0f} MB/s, every item's CRC32C verified)"
    )
    print(f"loaded model identical to the saved one: {same}")
    if not same:
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m s3ckpt.demo`` and ``s3ckpt demo``."""
    parser = argparse.ArgumentParser(
        prog="s3ckpt demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--width", type=int, default=512, help="model width (default 512)")
    parser.add_argument("--depth", type=int, default=6, help="number of blocks (default 6)")
    args = parser.parse_args(argv)
    url = os.environ.get("S3CKPT_DEMO_URL")
    if url or os.environ.get("AWS_ENDPOINT_URL"):
        url = url or f"s3://s3ckpt-demo/runs/{uuid.uuid4().hex[:8]}/step_0"
        print(f"using configured endpoint {os.environ.get('AWS_ENDPOINT_URL', 'AWS S3')}")
        run(url, args.width, args.depth)
        return
    with _embedded_s3() as endpoint:
        import boto3

        print(f"no S3 endpoint configured: started an embedded S3 server (moto) at {endpoint}")
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="s3ckpt-demo"
        )
        run("s3://s3ckpt-demo/runs/demo/step_0", args.width, args.depth)


if __name__ == "__main__":
    main(sys.argv[1:])
