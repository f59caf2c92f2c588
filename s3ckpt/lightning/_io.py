"""S3CheckpointIO: Lightning's CheckpointIO plug-in over s3ckpt."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from lightning.pytorch.plugins.io import CheckpointIO

from s3ckpt.checkpointer import RetentionRecord, RetentionRunner, load_policy
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp import S3StorageReader, S3StorageWriter
from s3ckpt.errors import CheckpointError
from s3ckpt.lightning._async import Removals
from s3ckpt.lightning._common import (
    _REST,
    _dcp_call,
    _is_remote,
    _metrics_of,
    _skeleton,
)
from s3ckpt.lightning._fs import _install_filesystem
from s3ckpt.lightning._load import LoadSettings, load_remote, open_reader
from s3ckpt.lightning._tracked import Tracking, protect
from s3ckpt.retention import DEFAULT_GRACE, Policy, delete_checkpoint
from s3ckpt.store import ObjectStore, open_store
from s3ckpt.tools import SCHEMA_KEY, flatten_state_dict, unflatten_state_dict
from s3ckpt.uri import StoreURL, parse_url


class S3CheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO`` that saves, loads and removes checkpoints through s3ckpt.

    Local paths are left to Lightning's ``TorchCheckpointIO``, so the same plug-in serves a
    run that also writes locally.

    Args:
        policy: Retention after each commit on rank 0: a
            :class:`~s3ckpt.retention.Policy`, a built-in policy name (``"pretraining"``)
            or a TOML policy file; ``None`` leaves pruning to ``save_top_k``. Whatever the
            policy, it never deletes a checkpoint a ``ModelCheckpoint`` tracks.
        s3_config: Endpoint, region, encryption (default: from the environment).
        transfer_config: Part size, concurrency, memory bound.
        safe_globals: Classes the safe loader may rebuild besides
            :data:`s3ckpt.dcp.SAFE_GLOBALS` (say your hyperparameters' dataclass).
        verify_checksums: Check every item's CRC32C on load (default on).
        register_filesystem: Register s3ckpt's fsspec file system for ``s3://`` so that
            ``ModelCheckpoint`` works without s3fs. ``None`` (default): only when s3fs is
            not installed and no other file system is registered for ``s3://``; ``True``:
            also replace s3fs (or the other) in this process.
        retention_grace: A prefix without a commit marker younger than this is a save in
            progress for retention and ``remove_checkpoint`` (never deleted).

    Works inside Lightning's ``AsyncCheckpointIO``: see :meth:`remove_checkpoint`.
    """

    _s3ckpt_plugin = True  # how Lightning fixes and wrappers recognise the plug-in

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
        self._tracking = Tracking()
        self._removals = Removals(self._tracking, self._delete)
        _install_filesystem(self.s3_config, self.transfer_config, register_filesystem)

    # -- Lightning's CheckpointIO ------------------------------------------------------------
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Save ``checkpoint`` as one s3ckpt checkpoint at ``path`` (a prefix), safely
        overwriting what is there. Called by Lightning on rank 0.

        Raises:
            TypeError: ``storage_options`` is given (as Lightning's ``TorchCheckpointIO``):
                configure the store with ``S3CheckpointIO(s3_config=...)`` instead.
        """
        if storage_options is not None:
            raise TypeError(
                "`Trainer.save_checkpoint(..., storage_options=...)` with `storage_options` arg"
                f" is not supported for `{type(self).__name__}`: configure the store with "
                "S3CheckpointIO(s3_config=..., transfer_config=...) instead."
            )
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
        """The checkpoint dict saved at ``path``, in Lightning's normal shape, on every
        rank, without a process group.

        * A checkpoint this plug-in saved comes back exactly (container and key types
          too: ``state_dict`` is the ``OrderedDict`` it was, with its ``_metadata``).
        * One :class:`S3ModelParallelStrategy` saved (sharded) comes back with full
          tensors: ``state_dict`` by parameter name, ``optimizer_states`` as torch's
          ``get_optimizer_state_dict`` gives them, the rest at the top level.
        * A stock Lightning checkpoint, one ``torch.save`` object at ``path`` (written
          through s3fs before the move to s3ckpt), is streamed and loaded with the same
          ``weights_only`` rules; a committed s3ckpt checkpoint at ``path/`` wins over it.

        ``weights_only=False`` (Lightning's "trusted source") unpickles non-tensor values
        with full pickle; ``True`` or ``None`` uses the safe loader and its allow-list.
        ``map_location`` places tensors as ``torch.load`` does (s3ckpt reads them into CPU
        memory first). See :mod:`s3ckpt.lightning._load`.

        Raises:
            CheckpointNotFoundError: nothing at ``path`` (also a ``FileNotFoundError``).
            UnsafeCheckpointError: a value outside the allow-list (``weights_only`` not
                False).
        """
        if not _is_remote(path):
            return self._torch_io().load_checkpoint(path, map_location, weights_only)
        url, store = self._open(path)
        return load_remote(
            url, store, self._settings(), map_location=map_location, weights_only=weights_only
        )

    def remove_checkpoint(self, path: Any) -> None:
        """Delete one checkpoint (``save_top_k``): marker first, under the run's lease.

        Carried out now when no save of ``path`` is uploading and no ``ModelCheckpoint``
        tracks it any more; otherwise (``AsyncCheckpointIO``: its save is queued or
        uploading) after that save commits and the save that displaced it has reached the
        plug-in (:mod:`s3ckpt.lightning._async`). A checkpoint retention must keep is not
        deleted: pinned (left in place with a warning), or the run's newest, being
        written, or a run whose lease another pruner holds (retried after each later
        commit and at :meth:`teardown`). Training never fails over a cleanup.
        """
        if not _is_remote(path):
            self._torch_io().remove_checkpoint(path)
            return
        self._removals.request(path)

    def teardown(self) -> None:
        """Wait for background retention passes, then carry out the removals still
        waiting (a last try: what cannot be deleted now is left, with a warning).
        Lightning calls it when ``fit`` (or ``validate``...) ends, also through
        ``AsyncCheckpointIO`` once its queued saves are done."""
        for runner in list(self._runners.values()):
            runner.wait()
        self._removals.flush(final=True)

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
        """Every rank: load into ``sharded`` in place; return the rest of the checkpoint.

        Raises:
            CheckpointError: ``path`` is not a sharded checkpoint of
                :class:`S3ModelParallelStrategy` (one this plug-in saved in one process, or
                a stock Lightning file): the strategy cannot resume from it.
        """
        reader = self._reader(path, weights_only)
        if f"{_REST}.{SCHEMA_KEY}" not in reader.metadata.state_dict_metadata:
            raise CheckpointError(
                f"{reader.url} is not a sharded checkpoint of S3ModelParallelStrategy (it was "
                "saved in one process, or by another tool), so the strategy cannot resume "
                "from it; its weights load with MyModule.load_from_checkpoint(...) or "
                "S3CheckpointIO().load_checkpoint(...)",
                bucket=reader.store.bucket,
                key=reader.url.prefix,
            )
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
        return open_reader(url, store, self._settings(), weights_only)

    def _settings(self) -> LoadSettings:
        return LoadSettings(
            self.s3_config, self.transfer_config, self.safe_globals, self.verify_checksums
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
        self._removals.begin_save(str(url), checkpoint)
        writer = S3StorageWriter(
            url,
            s3_config=self.s3_config,
            transfer_config=self.transfer_config,
            overwrite=True,
            step=self._step(checkpoint),
            metrics=_metrics_of(checkpoint),
            store=store,
        )
        try:
            with _dcp_call():
                dcp.save(state, storage_writer=writer, process_group=process_group, no_dist=no_dist)
        finally:
            self._removals.end_save(str(url))

    def _delete(self, path: str) -> None:
        url, store = self._open(path)
        delete_checkpoint(store, url, grace=self.retention_grace)

    def _after_commit(
        self, url: StoreURL, store: ObjectStore, checkpoint: Mapping[str, Any]
    ) -> None:
        """Rank 0, after a commit: the removals that waited for it, then a retention pass
        that keeps what any ``ModelCheckpoint`` tracks."""
        self._removals.flush()
        if self.policy is None:
            return
        run = url.parent
        with self._lock:
            runner = self._runners.get(str(run))
            if runner is None:
                runner = self._runners[str(run)] = RetentionRunner(store, run)
        self._tracking.warn_if_unknown(run)
        policy = protect(self.policy, self._tracking.names_in(run))
        runner.schedule(policy, self.retention_grace, self._step(checkpoint))
