"""Deterministic training state for benchmarks/chaos.py (shared by the harness and its workers).

Everything here is a pure function of ``(seed, step, variant)``, so any process can rebuild
the exact state a (possibly killed) writer saved and compare a load against it bit for bit.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

# One weight of 1344 x 1024 float32 = 5.25 MiB (> the 5 MiB part size): multipart uploads.
_IN, _HID, _OUT = 1024, 1344, 16


def _gen(seed: int, step: int, variant: int) -> torch.Generator:
    h = hashlib.sha256(f"chaos:{seed}:{step}:{variant}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(h[:8], "little") & ((1 << 63) - 1))


def build_model(
    seed: int, step: int, variant: int = 0
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small model and an SGD-with-momentum optimizer whose state is fixed by the args."""
    torch.manual_seed(0)
    g = _gen(seed, step, variant)
    model = torch.nn.Sequential(
        torch.nn.Linear(_IN, _HID), torch.nn.ReLU(), torch.nn.Linear(_HID, _OUT)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=False)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def model_digest(model: torch.nn.Module, opt: torch.optim.Optimizer) -> str:
    return digest({"model": model.state_dict(), "optim": opt.state_dict()})


def flat_state(seed: int, step: int, variant: int = 0) -> dict[str, Any]:
    """A plain state dict for S3StorageWriter saves: tensors (one > 5 MiB) and non-tensors."""
    g = _gen(seed, step, variant)
    return {
        "big": torch.randn(_HID, _IN, generator=g),
        "small": torch.randn(77, generator=g).to(torch.float16),
        "ints": torch.randint(-(2**40), 2**40, (129,), generator=g, dtype=torch.int64),
        "extra": {"step": step, "variant": variant, "note": f"s{seed}v{variant}"},
    }


def blank_flat_state() -> dict[str, Any]:
    """Destinations for loading a :func:`flat_state` (all values junk)."""
    return {
        "big": torch.full((_HID, _IN), -7.0),
        "small": torch.full((77,), -7.0, dtype=torch.float16),
        "ints": torch.full((129,), -7, dtype=torch.int64),
        "extra": {"step": -1, "variant": -1, "note": "blank"},
    }


def digest(obj: Any) -> str:
    """SHA-256 over every tensor's dtype, shape and bytes and every other value's repr."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()[:24]


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, dict):
        h.update(b"{")
        for k in sorted(obj, key=repr):
            h.update(repr(k).encode())
            _feed(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for v in obj:
            _feed(h, v)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())
