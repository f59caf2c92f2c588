"""The public faces (issue 39, item 7): what each public package exports, pinned.

A name added to or dropped from a face is an API change: it shows here first, and goes in
CHANGELOG.md. Everything else lives in private modules (``_name``), which may change freely.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import s3ckpt

FACES: dict[str, set[str]] = {
    "s3ckpt": {
        "Checkpointer",
        "SaveHandle",
        "S3StorageWriter",
        "S3StorageReader",
        "S3Config",
        "TransferConfig",
        "Location",
        "HashedPrefixes",
        # the policy rules a user names
        "KeepLast",
        "KeepEvery",
        "KeepBest",
        "KeepWithin",
        "KeepCalendar",
        "KeepPinned",
        "AllOf",
        "AnyOf",
        # the errors a training loop catches (every error class: s3ckpt.errors)
        "S3CkptError",
        "CheckpointError",
        "CheckpointNotFoundError",
        "CorruptCheckpointError",
        "ChecksumMismatchError",
        "ConfigError",
        "StoreError",
        "SaveInProgressError",
        "UnsafeCheckpointError",
        "__version__",
    },
    "s3ckpt.errors": {
        "S3CkptError",
        "ConfigError",
        "InvalidURLError",
        "PolicyError",
        "StoreError",
        "TransientStoreError",
        "EndpointError",
        "AccessDeniedError",
        "NoSuchBucketError",
        "ObjectNotFoundError",
        "PreconditionFailedError",
        "ConditionalWritesError",
        "ClockSkewError",
        "UnsupportedOperationError",
        "ArchivedObjectError",
        "CheckpointError",
        "CheckpointExistsError",
        "CheckpointNotFoundError",
        "UncommittedCheckpointError",
        "CorruptCheckpointError",
        "ChecksumMismatchError",
        "StateMismatchError",
        "UnsafeCheckpointError",
        "SaveInProgressError",
        "SaveFencedError",
        "IncompleteRestoreError",
        "LeaseHeldError",
        "LeaseLostError",
        "DeleteRefusedError",
        "unwrap_checkpoint_exception",
    },
    "s3ckpt.store": {
        "ObjectStore",
        "ArchiveStore",
        "S3Store",
        "MemoryStore",
        "FsspecStore",
        "CountingStore",
        "Location",
        "ObjectInfo",
        "Capabilities",
        "open_store",
        "create_bucket",
        "probe_capabilities",
    },
    "s3ckpt.tools": {
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
    },
    "s3ckpt.retention": {
        "Policy",
        "KeepLast",
        "KeepEvery",
        "KeepBest",
        "KeepWithin",
        "KeepCalendar",
        "KeepPinned",
        "AllOf",
        "AnyOf",
        "Tier",
        "PolicyFile",
        "load_policy",
        "parse_policy",
        "builtin_policies",
        "RetentionOptions",
        "prune",
        "prune_runs",
        "gc",
        "plan",
        "survey_plan",
        "list_checkpoints",
        "list_runs",
        "delete_checkpoint",
        "pin",
        "unpin",
        "CheckpointInfo",
        "PruneResult",
        "GcResult",
    },
    "s3ckpt.metrics": {
        "MetricsFile",
        "CheckMetricsFile",
        "OpenTelemetryMetrics",
        "OperationMetrics",
        "RunMetrics",
        "totals",
        "Totals",
        "capture",
        "subscribe",
        "write_textfile",
    },
    "s3ckpt.checkpointer": {"Checkpointer", "SaveHandle", "RetentionRecord"},
    "s3ckpt.dcp": {"S3StorageReader", "S3StorageWriter", "SafeGlobal", "SAFE_GLOBALS", "quiet_dcp"},
    "s3ckpt.format": {"HashedPrefixes"},
    "s3ckpt.testing": {
        "LocalS3",
        "local_s3",
        "assert_committed",
        "assert_clean",
        "assert_no_partial_uploads",
        "committed_steps",
    },
    "s3ckpt.demo": {"demo_server", "main"},
    "s3ckpt.lightning": {
        "S3CheckpointIO",
        "S3ModelCheckpoint",
        "S3ModelParallelStrategy",
        "install",
    },
    "s3ckpt.accelerate": {"S3Checkpointing", "use_s3ckpt"},
}
OPTIONAL = {"s3ckpt.lightning": "lightning", "s3ckpt.accelerate": "accelerate"}
BUDGET = 150  # names across every face (issue 39: "at most 150 public names")


def _public_packages() -> list[str]:
    """Every package of s3ckpt whose dotted name has no private part."""
    names = ["s3ckpt"]
    for mod in pkgutil.walk_packages(s3ckpt.__path__, "s3ckpt."):
        if mod.ispkg and not any(p.startswith("_") for p in mod.name.split(".")):
            names.append(mod.name)
    return names


@pytest.mark.parametrize("name", sorted(FACES))
def test_each_face_exports_exactly_its_names(name: str) -> None:
    if name in OPTIONAL:
        pytest.importorskip(OPTIONAL[name])
    module = importlib.import_module(name)
    assert set(module.__all__) == FACES[name]
    assert len(module.__all__) == len(set(module.__all__))
    for attr in module.__all__:
        value = getattr(module, attr)  # importable (lazy names too)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), f"{name}.{attr} has no docstring"


def test_every_public_package_is_a_pinned_face() -> None:
    assert set(_public_packages()) - {"s3ckpt.torchtitan"} <= set(FACES)


def test_the_faces_stay_within_the_budget() -> None:
    total = sum(len(names) for names in FACES.values()) + 1  # + s3ckpt.torchtitan's one
    assert total <= BUDGET, total
