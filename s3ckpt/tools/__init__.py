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

The report is the subpackage :mod:`s3ckpt.tools.report` (prices, the model, collecting, the
page); the names users call are here too. An inspect result is an :class:`InspectResult`
(:class:`s3ckpt.retention.CheckpointInfo` is another thing, a catalog record).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from s3ckpt.errors import IncompleteRestoreError
from s3ckpt.tools._check import check, parse_read_data
from s3ckpt.tools._check_result import CheckpointCheck, CheckResult, Finding, SkippedCheckpoint
from s3ckpt.tools._doctor import Check, CheckStatus, DoctorReport, run_doctor
from s3ckpt.tools._restore import RestoreResult, restore_checkpoint
from s3ckpt.tools.report import (
    CheckpointRow,
    PriceTable,
    Report,
    RunReport,
    build_report,
    collect_report,
    render_html,
)

if TYPE_CHECKING:
    from s3ckpt.dcp.restore import check_restored, fill_nan, find_unrestored, load_verified
    from s3ckpt.tools._convert import Converter, load_converter
    from s3ckpt.tools._diff import DiffResult, TensorDiff, compare_tensors, diff_checkpoints
    from s3ckpt.tools._export import (
        INDEX_NAME,
        ExportedFile,
        ExportResult,
        SkippedItem,
        export_checkpoint,
    )
    from s3ckpt.tools._flatten import SCHEMA_KEY, flatten_state_dict, unflatten_state_dict
    from s3ckpt.tools._import import ImportResult, import_safetensors
    from s3ckpt.tools._inspect import (
        InspectResult,
        ObjectSummary,
        TensorSummary,
        inspect_checkpoint,
    )
    from s3ckpt.tools._safetensors import TORCH_TO_ST
    from s3ckpt.tools._structure import Problem
    from s3ckpt.tools._verify import VerifyResult, verify_checkpoint

# Name -> the module defining it: imported on first access (they need torch).
_LAZY: dict[str, str] = {
    "check_restored": "s3ckpt.dcp.restore",
    "fill_nan": "s3ckpt.dcp.restore",
    "find_unrestored": "s3ckpt.dcp.restore",
    "load_verified": "s3ckpt.dcp.restore",
    "Converter": "s3ckpt.tools._convert",
    "load_converter": "s3ckpt.tools._convert",
    "DiffResult": "s3ckpt.tools._diff",
    "TensorDiff": "s3ckpt.tools._diff",
    "compare_tensors": "s3ckpt.tools._diff",
    "diff_checkpoints": "s3ckpt.tools._diff",
    "INDEX_NAME": "s3ckpt.tools._export",
    "ExportedFile": "s3ckpt.tools._export",
    "ExportResult": "s3ckpt.tools._export",
    "SkippedItem": "s3ckpt.tools._export",
    "export_checkpoint": "s3ckpt.tools._export",
    "SCHEMA_KEY": "s3ckpt.tools._flatten",
    "flatten_state_dict": "s3ckpt.tools._flatten",
    "unflatten_state_dict": "s3ckpt.tools._flatten",
    "ImportResult": "s3ckpt.tools._import",
    "import_safetensors": "s3ckpt.tools._import",
    "TORCH_TO_ST": "s3ckpt.tools._safetensors",  # safetensors' dtype names (accelerate uses it)
    "InspectResult": "s3ckpt.tools._inspect",
    "ObjectSummary": "s3ckpt.tools._inspect",
    "TensorSummary": "s3ckpt.tools._inspect",
    "inspect_checkpoint": "s3ckpt.tools._inspect",
    "Problem": "s3ckpt.tools._structure",
    "VerifyResult": "s3ckpt.tools._verify",
    "verify_checkpoint": "s3ckpt.tools._verify",
}


def __getattr__(name: str) -> Any:
    """Import a torch-needing name on first access (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "INDEX_NAME",
    "SCHEMA_KEY",
    "TORCH_TO_ST",
    "Check",
    "CheckResult",
    "CheckStatus",
    "CheckpointCheck",
    "CheckpointRow",
    "Converter",
    "DiffResult",
    "DoctorReport",
    "ExportResult",
    "ExportedFile",
    "Finding",
    "ImportResult",
    "InspectResult",
    "IncompleteRestoreError",
    "ObjectSummary",
    "PriceTable",
    "Problem",
    "Report",
    "RestoreResult",
    "RunReport",
    "SkippedCheckpoint",
    "SkippedItem",
    "TensorDiff",
    "TensorSummary",
    "VerifyResult",
    "build_report",
    "check",
    "check_restored",
    "collect_report",
    "compare_tensors",
    "diff_checkpoints",
    "export_checkpoint",
    "fill_nan",
    "find_unrestored",
    "flatten_state_dict",
    "import_safetensors",
    "inspect_checkpoint",
    "load_converter",
    "load_verified",
    "parse_read_data",
    "render_html",
    "restore_checkpoint",
    "run_doctor",
    "unflatten_state_dict",
    "verify_checkpoint",
]
