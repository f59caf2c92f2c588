"""Item serialisation (not a test): ``torch.save`` against s3ckpt's writer path, which
skips the zip CRC-32 that ``torch.load`` never checks (see ``s3ckpt/dcp/_serialize.py``).

Run from the repository root::

    .venv/bin/python benchmarks/bench_serialize.py

For each tensor size, both serialise the same tensor into a reused in-memory sink
(``io.BytesIO`` rewound, so allocation is out of the timing), interleaved, ``--repeat``
times; the table gives seconds per GiB (best and median) and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from s3ckpt.dcp._serialize import fast_path_available, save_item

GiB = 1 << 30


def _time(
    fn: Callable[[torch.Tensor, io.BytesIO], object], t: torch.Tensor, sink: io.BytesIO
) -> float:
    sink.seek(0)
    start = time.perf_counter()
    fn(t, sink)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mib", default="0.125,4,32", help="comma-separated tensor sizes")
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    print(f"torch {torch.__version__}; CRC-free path available: {fast_path_available()}\n")
    print(
        "| tensor | torch.save s/GiB (best, median) | s3ckpt item s/GiB (best, median) "
        "| median ratio s3ckpt / torch.save |"
    )
    print("|---|---:|---:|---:|")
    for mib in (float(x) for x in args.sizes_mib.split(",")):
        t = torch.rand(int(mib * (1 << 20)) // 4)
        sink = io.BytesIO()
        stock: list[float] = []
        ours: list[float] = []
        for _ in range(args.repeat):
            stock.append(_time(torch.save, t, sink))
            ours.append(_time(save_item, t, sink))
        scale = GiB / (t.numel() * 4)
        print(
            f"| {mib:g} MiB | {min(stock) * scale:.2f}, {statistics.median(stock) * scale:.2f} "
            f"| {min(ours) * scale:.2f}, {statistics.median(ours) * scale:.2f} "
            f"| {statistics.median(ours) / statistics.median(stock):.2f} |"
        )


if __name__ == "__main__":
    main()
