"""Tools people reach for: inspect, verify, diff, export, import, flatten, restore checks.

Each ``s3ckpt`` command has a function here returning a typed, frozen result (with
``to_dict()`` for stable JSON); the CLI is a thin layer on top::

    from s3ckpt.tools import inspect_checkpoint, verify_checkpoint, diff_checkpoints
    from s3ckpt.tools import export_checkpoint, import_safetensors

    info = inspect_checkpoint("s3://bucket/run/step_100")          # no data downloaded
    result = verify_checkpoint("s3://bucket/run/step_100")         # every CRC32C
    report = diff_checkpoints("s3://b/run/step_100", "s3://b/run/step_200", include="model.*")
    export_checkpoint("s3://b/run/step_100", "s3://b/hf/llama", only="model", dtype="bf16")
    import_safetensors("s3://b/hf/llama", "s3://b/run/step_0")      # under "model."

    flat = flatten_state_dict(optimizer.state_dict())              # Dict[str, Tensor]
    nested = unflatten_state_dict(flat)                            # == the original, exactly

    load_verified(state_dict, "s3://b/run/step_100")               # NaN-fill, load, check

    html = build_report("s3://bucket/runs/", policy=load_policy("pretraining"))  # no torch
    doctor = run_doctor("s3://bucket/runs/")                         # no torch needed
    restore_checkpoint("s3://b/run/step_100", days=3, wait=True)    # GLACIER: no torch
    scrub = check("s3://bucket/runs/", read_data="5%")               # no torch needed

Everything here but the report, the doctor, the check and the restore needs torch (the
retention layer never imports it). Those names are imported on first use, so ``s3ckpt
report``, ``s3ckpt doctor``, ``s3ckpt check``, ``s3ckpt restore`` and :func:`build_report`
work in an image without torch; any other name raises ``ImportError`` there (naming torch).

The functions return typed results (``VerifyResult``, ``InspectResult``, ``CheckResult``,
``Report`` ...) whose fields and ``to_dict()`` are documented on each function; the result
classes live in private modules (only the functions above are the face).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from s3ckpt.tools._check import check
from s3ckpt.tools._doctor import run_doctor
from s3ckpt.tools._report import build_report, collect_report, render_html
from s3ckpt.tools._restore import restore_checkpoint

if TYPE_CHECKING:
    from s3ckpt.dcp.restore import check_restored, fill_nan, load_verified
    from s3ckpt.tools._diff import diff_checkpoints
    from s3ckpt.tools._export import export_checkpoint
    from s3ckpt.tools._import import import_safetensors
    from s3ckpt.tools._verify import inspect_checkpoint, verify_checkpoint
    from s3ckpt.tools.packing import flatten_state_dict, unflatten_state_dict

# The module defining each name: imported on first access (they need torch).
_LAZY: dict[str, str] = {
    name: module
    for module, names in {
        "s3ckpt.dcp.restore": "check_restored fill_nan load_verified",
        "s3ckpt.tools._diff": "diff_checkpoints",
        "s3ckpt.tools._export": "export_checkpoint",
        "s3ckpt.tools.packing": "flatten_state_dict unflatten_state_dict",
        "s3ckpt.tools._import": "import_safetensors",
        "s3ckpt.tools._verify": "verify_checkpoint inspect_checkpoint",
    }.items()
    for name in names.split()
}


def __getattr__(name: str) -> Any:
    """Import a torch-needing name on first access (PEP 562)."""
    if (module := _LAZY.get(name)) is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # Kept in the module's globals: the next access is a plain lookup.
    value = globals()[name] = getattr(importlib.import_module(module), name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "check",
    "verify_checkpoint",
    "inspect_checkpoint",
    "diff_checkpoints",
    "export_checkpoint",
    "import_safetensors",
    "restore_checkpoint",
    "load_verified",
    "check_restored",
    "fill_nan",
    "flatten_state_dict",
    "unflatten_state_dict",
    "run_doctor",
    "collect_report",
    "build_report",
    "render_html",
]
