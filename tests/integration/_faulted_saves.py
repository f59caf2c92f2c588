"""What the tests of faulted saves (lost replies, replies cut short, bytes flipped in transit)
share: a small transfer config that makes two-part objects and retries fast, a state dict
with one two-part tensor, and a bit-exact load check."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3Config, S3StorageReader
from s3ckpt.config import MiB
from tests._helpers import SMALL

TC = dataclasses.replace(
    SMALL, target_object_size=4 * MiB, retry_initial_delay=0.01, retry_max_delay=0.05
)
"""Objects of at most 4 MiB in 5 MiB-minimum parts, and retries 10 ms to 50 ms apart."""


def small_state(seed: int) -> dict[str, torch.Tensor]:
    """A 6 MiB tensor (two parts), a small one and an integer one, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return {
        "big": torch.randn(1536 * 1024, generator=g),  # 6 MiB: two parts
        "small": torch.randn(100, generator=g),
        "ints": torch.arange(17),
    }


def assert_loads(url: str, sd: dict[str, torch.Tensor], endpoint: str) -> None:
    """``url`` loads (directly from ``endpoint``, no proxy) bit for bit as ``sd``."""
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    reader = S3StorageReader(url, s3_config=S3Config(endpoint_url=endpoint), transfer_config=TC)
    dcp.load(out, storage_reader=reader)
    for k in sd:
        assert torch.equal(out[k], sd[k]), k
