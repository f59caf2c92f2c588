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

Everything here needs torch; the retention layer never imports it.
"""

from s3ckpt.dcp.restore import check_restored, fill_nan, find_unrestored, load_verified
from s3ckpt.errors import IncompleteRestoreError
from s3ckpt.tools._common import NameFilter, parse_dtype, parse_size
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
    CheckpointInfo,
    ObjectSummary,
    TensorSummary,
    inspect_checkpoint,
)
from s3ckpt.tools._structure import Problem
from s3ckpt.tools._verify import VerifyResult, verify_checkpoint

__all__ = [
    "INDEX_NAME",
    "SCHEMA_KEY",
    "CheckpointInfo",
    "Converter",
    "DiffResult",
    "ExportResult",
    "ExportedFile",
    "ImportResult",
    "IncompleteRestoreError",
    "NameFilter",
    "ObjectSummary",
    "Problem",
    "SkippedItem",
    "TensorDiff",
    "TensorSummary",
    "VerifyResult",
    "check_restored",
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
    "parse_dtype",
    "parse_size",
    "unflatten_state_dict",
    "verify_checkpoint",
]
