"""S3CheckpointIO: Lightning's CheckpointIO plug-in over s3ckpt."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from lightning.pytorch.plugins.io import CheckpointIO
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from s3ckpt.checkpointer import RetentionRecord, RetentionRunner, load_policy
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp import S3StorageReader, S3StorageWriter
from s3ckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    LeaseHeldError,
    ObjectNotFoundError,
    S3CkptError,
)
from s3ckpt.lightning._common import (
    _REST,
    _dcp_call,
    _is_remote,
    _metrics_of,
    _skeleton,
    _to_device,
    log,
)
from s3ckpt.lightning._fs import _install_filesystem
from s3ckpt.retention import DEFAULT_GRACE, Policy, delete_checkpoint
from s3ckpt.store import ObjectStore, open_store
from s3ckpt.tools import flatten_state_dict, unflatten_state_dict
from s3ckpt.uri import StoreURL, parse_url


class S3CheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO`` that saves, loads and removes checkpoints through s3ckpt.

    Local paths are left to Lightning's ``TorchCheckpointIO``, so the same plug-in serves a
    run that also writes locally.

    Args:
        policy: Retention after each commit on rank 0: a
            :class:`~s3ckpt.retention.Policy`, a built-in policy name (``"pretraining"``)
            or a TOML policy file; ``None`` leaves pruning to ``save_top_k``.
        s3_config: Endpoint, region, encryption (default: from the environment).
        transfer_config: Part size, concurrency, memory bound.
        safe_globals: Classes the safe loader may rebuild besides
            :data:`s3ckpt.dcp.SAFE_GLOBALS` (say your hyperparameters' dataclass).
        verify_checksums: Check every item's CRC32C on load (default on).
        register_filesystem: Register s3ckpt's fsspec file system for ``s3://`` so that
            ``ModelCheckpoint`` works without s3fs. ``None`` (default): only when s3fs is
            not installed; ``True``: also replace s3fs in this process.
        retention_grace: A prefix without a commit marker younger than this is a save in
            progress for retention and ``remove_checkpoint`` (never deleted).
    """

    def __init__(
        self,
        *,
        policy: Policy | str | None = None,
        s3_config: S3Config | None = None,
        transfer_config: TransferConfig | None = None,
        safe_globals: Sequence[Any] = (),
        verify_checksums: bool = True,
        register_filesystem: bool | None = None,
        retention_grace: timedelta = DEFAULT_GRACE,
    ) -> None:
        super().__init__()
        self.s3_config = s3_config or S3Config()
        self.transfer_config = transfer_config or TransferConfig()
        self.policy = load_policy(policy)
        self.safe_globals = tuple(safe_globals)
        self.verify_checksums = verify_checksums
        self.retention_grace = retention_grace
        self._stores: dict[tuple[str, str], ObjectStore] = {}
        self._runners: dict[str, RetentionRunner] = {}
        self._lock = threading.Lock()
        self._local: CheckpointIO | None = None
        _install_filesystem(self.s3_config, self.transfer_config, register_filesystem)

    # -- Lightning's CheckpointIO ------------------------------------------------------------
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Save ``checkpoint`` as one s3ckpt checkpoint at ``path`` (a prefix), safely
        overwriting what is there. Called by Lightning on rank 0."""
        if not _is_remote(path):
            self._torch_io().save_checkpoint(checkpoint, path, storage_options)
            return
        url, store = self._open(path)
        flat = flatten_state_dict(checkpoint, objects=True)
        self._save(flat, url, store, checkpoint, process_group=None, no_dist=True)
        self._after_commit(url, store, checkpoint)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The checkpoint dict saved at ``path``, exactly (container and key types too).

        ``weights_only=False`` (Lightning's "trusted source") unpickles non-tensor values
        with full pickle; ``True`` or ``None`` uses the safe loader and its allow-list.
        """
        if not _is_remote(path):
            return self._torch_io().load_checkpoint(path, map_location, weights_only)
        reader = self._reader(path, weights_only)
        flat = _skeleton(reader.metadata)
        with _dcp_call():
            dcp.load(flat, storage_reader=reader, planner=DefaultLoadPlanner(), no_dist=True)
        return _to_device(unflatten_state_dict(flat), map_location)

    def remove_checkpoint(self, path: Any) -> None:
        """Delete one checkpoint (``save_top_k``): marker first, under the run's lease.

        A checkpoint retention must keep (pinned, being written, the run's newest) or a
        run whose lease another pruner holds is left in place with a warning: training
        never fails over a cleanup.
        """
        if not _is_remote(path):
            self._torch_io().remove_checkpoint(path)
            return
        url, store = self._open(path)
        try:
            delete_checkpoint(store, url, grace=self.retention_grace)
        except (CheckpointNotFoundError, ObjectNotFoundError):
            log.debug("s3ckpt: %s is already gone (retention pruned it first)", url)
        except (CheckpointError, LeaseHeldError) as exc:
            log.warning("s3ckpt: left %s in place: %s", url, exc)
        except S3CkptError as exc:
            log.warning("s3ckpt: could not remove %s (retention will): %s", url, exc)

    def teardown(self) -> None:
        """Wait for background retention passes to finish."""
        for runner in list(self._runners.values()):
            runner.wait()

    @property
    def retention_history(self) -> tuple[RetentionRecord, ...]:
        """This process's retention passes (the last 100 per run), oldest first: the step
        whose commit triggered each, its result or the exception it failed with."""
        records = [r for runner in list(self._runners.values()) for r in runner.history]
        return tuple(sorted(records, key=lambda r: r.started))

    # -- sharded (used by S3ModelParallelStrategy) ----------------------------------------
    def save_sharded(
        self,
        sharded: dict[str, Any],
        rest: Mapping[str, Any],
        path: Any,
        process_group: dist.ProcessGroup | None,
    ) -> None:
        """Every rank: save ``sharded`` (DTensor state dicts) and ``rest`` as one checkpoint."""
        url, store = self._open(path)
        state = {**sharded, _REST: flatten_state_dict(rest, objects=True)}
        self._save(state, url, store, rest, process_group=process_group, no_dist=False)
        if dist.get_rank(process_group) == 0:
            self._after_commit(url, store, rest)

    def load_sharded(
        self,
        sharded: dict[str, Any],
        path: Any,
        process_group: dist.ProcessGroup | None,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Every rank: load into ``sharded`` in place; return the rest of the checkpoint."""
        reader = self._reader(path, weights_only)
        rest = _skeleton(reader.metadata, _REST + ".")
        state = {**sharded, _REST: rest}
        with _dcp_call():
            dcp.load(state, storage_reader=reader, process_group=process_group)
        return unflatten_state_dict(state[_REST])

    # -- internals -------------------------------------------------------------------------
    def _torch_io(self) -> CheckpointIO:
        if self._local is None:
            from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

            self._local = TorchCheckpointIO()
        return self._local

    def _open(self, path: Any) -> tuple[StoreURL, ObjectStore]:
        url = parse_url(str(path))
        with self._lock:
            store = self._stores.get((url.scheme, url.bucket))
            if store is None:
                store, _ = open_store(
                    url, s3_config=self.s3_config, transfer_config=self.transfer_config
                )
                self._stores[(url.scheme, url.bucket)] = store
        return url, store

    def _reader(self, path: Any, weights_only: bool | None) -> S3StorageReader:
        url, store = self._open(path)
        return S3StorageReader(
            url,
            s3_config=self.s3_config,
            transfer_config=self.transfer_config,
            verify_checksums=self.verify_checksums,
            allow_unsafe_pickle=weights_only is False,
            safe_globals=self.safe_globals,
            store=store,
        )

    @staticmethod
    def _step(checkpoint: Mapping[str, Any]) -> int | None:
        step = checkpoint.get("global_step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    def _save(
        self,
        state: dict[str, Any],
        url: StoreURL,
        store: ObjectStore,
        checkpoint: Mapping[str, Any],
        *,
        process_group: dist.ProcessGroup | None,
        no_dist: bool,
    ) -> None:
        writer = S3StorageWriter(
            url,
            s3_config=self.s3_config,
            transfer_config=self.transfer_config,
            overwrite=True,
            step=self._step(checkpoint),
            metrics=_metrics_of(checkpoint),
            store=store,
        )
        with _dcp_call():
            dcp.save(state, storage_writer=writer, process_group=process_group, no_dist=no_dist)

    def _after_commit(
        self, url: StoreURL, store: ObjectStore, checkpoint: Mapping[str, Any]
    ) -> None:
        if self.policy is None:
            return
        run = url.parent
        with self._lock:
            runner = self._runners.get(str(run))
            if runner is None:
                runner = self._runners[str(run)] = RetentionRunner(store, run)
        runner.schedule(self.policy, self.retention_grace, self._step(checkpoint))
