"""The state dicts bench_dcp.py saves and loads: its shapes, how they are built, their digests.

A shape is a number of large 2-D fp32 tensors holding 3/4 of the bytes and a number of small
1-D ones holding the rest, plus a non-tensor ``step``:

- ``mix`` (the default, the history's shape): 4 large + 2000 small tensors
  (at 1024 MiB: 4 x 192 MiB + 2000 x 128 KiB);
- ``large5`` (issue 30's outside benchmark): 5 large + 512 small tensors
  (at 1024 MiB: 5 x ~153.6 MiB + 512 x 512 KiB);
- ``tiny`` (issue 40's many-small-tensors case): 200,000 tensors of 4 fp32 each and no large
  ones, a fixed ~3 MiB whatever ``size_mib`` says (``BENCH_DCP_TINY_COUNT`` overrides the
  count, for quick checks; the workers inherit it).

Decisions: tensor sizes come from one pure function (:func:`shape_numels`) so that the source
(:func:`build_state_dict`, seeded) and the destination (:func:`blank_state_dict`, zero-filled,
never generated from the source) always agree; a large tensor's element count is a multiple
of 1024 (its rows are 1024 wide). A shape with a fixed ``small_numel`` has fixed sizes and
ignores ``size_mib``. torch and crc32c are imported inside the functions, so the
orchestrator and the tests of the pure parts never import torch.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MiB",
    "SHAPES",
    "Shape",
    "blank_like",
    "blank_state_dict",
    "build_state_dict",
    "checksum_blob",
    "checksum_state_dict",
    "shape_numels",
    "state_dict_mib",
    "tensor_bytes",
    "tensors_in_order",
]

MiB = 1024 * 1024
_FP32 = 4


@dataclass(frozen=True)
class Shape:
    """How many large and small tensors a state dict has (large ones: 3/4 of the bytes), or,
    with ``small_numel`` set, exactly ``n_small`` tensors of ``small_numel`` fp32 each (then
    ``n_large`` must be 0 and the size is fixed)."""

    name: str
    n_large: int
    n_small: int
    small_numel: int | None = None

    def __post_init__(self) -> None:
        if self.small_numel is not None and self.n_large:
            raise ValueError("a shape with a fixed small_numel has no large tensors")
        if self.small_numel is None and not self.n_large:
            raise ValueError("a shape without large tensors needs a fixed small_numel")

    @property
    def fixed(self) -> bool:
        """Whether the sizes are fixed (``size_mib`` ignored)."""
        return self.small_numel is not None

    def describe(self) -> str:
        """``'4 large + 2000 small tensors'`` or ``'200000 tensors of 4 fp32'``."""
        if self.small_numel is not None:
            return f"{self.n_small} tensors of {self.small_numel} fp32, no large ones"
        return f"{self.n_large} large + {self.n_small} small tensors"


#: The shapes ``--shape`` accepts, by name.
SHAPES: dict[str, Shape] = {
    "mix": Shape("mix", 4, 2000),
    "large5": Shape("large5", 5, 512),
    "tiny": Shape("tiny", 0, int(os.environ.get("BENCH_DCP_TINY_COUNT", "200000")), 4),
}


def shape_numels(size_mib: int, shape: str = "mix") -> tuple[int, int]:
    """(elements per large tensor, elements per small tensor) of a ``size_mib`` state dict
    (a fixed shape: ``(0, small_numel)`` whatever ``size_mib``).

    Raises:
        KeyError: ``shape`` is not one of :data:`SHAPES`.
    """
    s = SHAPES[shape]
    if s.small_numel is not None:
        return 0, s.small_numel
    total = size_mib * MiB
    large_numel = max(1024, (total * 3 // 4) // s.n_large // _FP32 // 1024 * 1024)
    small_numel = max(1, (total - s.n_large * large_numel * _FP32) // s.n_small // _FP32)
    return large_numel, small_numel


def state_dict_mib(size_mib: int, shape: str = "mix") -> float:
    """MiB of tensor data a ``size_mib`` state dict of ``shape`` holds."""
    s = SHAPES[shape]
    large_numel, small_numel = shape_numels(size_mib, shape)
    return (s.n_large * large_numel + s.n_small * small_numel) * _FP32 / MiB


def _names(shape: str) -> tuple[list[str], list[str]]:
    s = SHAPES[shape]
    large = [f"layers.{i}.mlp.weight" for i in range(s.n_large)]
    small = [f"layers.{j // 20}.small.{j % 20}" for j in range(s.n_small)]
    return large, small


def build_state_dict(size_mib: int, seed: int = 0, shape: str = "mix") -> dict[str, Any]:
    """~``size_mib`` MiB of seeded random fp32 in the given shape, plus ``step = 1``."""
    import torch

    large_numel, small_numel = shape_numels(size_mib, shape)
    large, small = _names(shape)
    g = torch.Generator().manual_seed(seed)
    model: dict[str, Any] = {}
    for name in large:
        model[name] = torch.rand(large_numel // 1024, 1024, generator=g)
    for name in small:
        model[name] = torch.rand(small_numel, generator=g)
    return {"model": model, "step": 1}


def blank_like(sd: dict[str, Any]) -> dict[str, Any]:
    """Destination state dict: same shapes, zero-filled (pages touched), step 0."""
    import torch

    return {"model": {k: torch.zeros_like(v) for k, v in sd["model"].items()}, "step": 0}


def blank_state_dict(size_mib: int, shape: str = "mix") -> dict[str, Any]:
    """Like ``blank_like(build_state_dict(size_mib, shape=shape))`` without the source."""
    import torch

    large_numel, small_numel = shape_numels(size_mib, shape)
    large, small = _names(shape)
    model: dict[str, Any] = {}
    for name in large:
        model[name] = torch.zeros(large_numel // 1024, 1024)
    for name in small:
        model[name] = torch.zeros(small_numel)
    return {"model": model, "step": 0}


def tensors_in_order(sd: dict[str, Any]) -> list[tuple[str, Any]]:
    """The model's (name, tensor) pairs sorted by name."""
    return sorted(sd["model"].items())


def tensor_bytes(sd: dict[str, Any]) -> int:
    """Bytes of tensor data in the state dict."""
    return sum(t.numel() * t.element_size() for _, t in tensors_in_order(sd))


def checksum_state_dict(sd: dict[str, Any]) -> str:
    """Order-independent digest of every tensor's bytes (CRC32C each) and the step."""
    import crc32c

    h = hashlib.sha256()
    for name, t in tensors_in_order(sd):
        view = memoryview(t.detach().contiguous().numpy()).cast("B")
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}:{crc32c.crc32c(view):08x}\n".encode())
    h.update(f"step={sd['step']!r}".encode())
    return h.hexdigest()


def checksum_blob(buf: Any) -> str:
    """Digest of one contiguous blob (the raw boto3 baseline)."""
    import crc32c

    return f"blob:{len(buf)}:{crc32c.crc32c(buf):08x}"
