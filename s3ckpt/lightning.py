"""Lightning on s3ckpt: a ``CheckpointIO`` plug-in, and a sharded strategy for FSDP2 / TP.

::

    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    from s3ckpt.lightning import S3CheckpointIO

    ckpt = ModelCheckpoint(dirpath="s3://bucket/runs/exp1", monitor="val_loss",
                           save_top_k=2, save_last=True)
    trainer = Trainer(callbacks=[ckpt], plugins=[S3CheckpointIO(policy="pretraining")])
    trainer.fit(model, ckpt_path="last")          # resumes when there is a last.ckpt

What happens to Lightning's calls:

* ``save_checkpoint(checkpoint, "s3://.../epoch=0-step=4.ckpt")`` (rank 0): the checkpoint
  dict is flattened exactly (:func:`s3ckpt.tools.flatten_state_dict` with ``objects=True``:
  container and key types survive, so the optimizer's int-keyed state comes back as it
  was) and saved as one DCP checkpoint under that name, a prefix, by
  :class:`~s3ckpt.dcp.S3StorageWriter`: parallel multipart upload, CRC32C per item, the
  commit marker ``s3ckpt.json`` last, the step (``global_step``) and each
  ``ModelCheckpoint``'s monitored score recorded in it (so ``s3ckpt ls`` shows the step and
  ``KeepBest`` can rank by the metric). Lightning rewrites ``last.ckpt`` on every save and
  names are reused after a resume, so every save is a **safe overwrite**
  (``overwrite=True``): the checkpoint already there stays loadable until the new one has
  committed, and a failed save leaves it intact.
* ``load_checkpoint(path, weights_only=...)`` (every rank): read back with parallel ranged
  GETs, every CRC32C checked. Non-tensor values (hyperparameters, loop state) are
  unpickled by the safe loader with s3ckpt's allow-list (:data:`s3ckpt.dcp.SAFE_GLOBALS`)
  plus ``safe_globals``; Lightning's ``weights_only=False`` means "I trust this bucket"
  and loads them with full pickle instead.
* ``remove_checkpoint(path)`` (``save_top_k`` dropping a checkpoint; rank 0):
  :func:`s3ckpt.retention.delete_checkpoint`: marker first, under the run's lease; a
  checkpoint that is pinned, being written or the run's newest is refused with a warning
  and left to retention, never deleted by force.
* ``policy``: a retention policy run on rank 0 after each commit, in the background, over
  the run (the checkpoint's parent prefix); its passes are kept in
  :attr:`S3CheckpointIO.retention_history`. Choose one that keeps what ``save_top_k``
  tracks (say ``KeepLast(2) | KeepBest(3, "val_loss")``) or Lightning's ``ckpt_path="best"``
  may name a pruned checkpoint.

``ModelCheckpoint`` itself lists, checks and time-stamps its folder through fsspec. When s3fs
is not installed, the plug-in registers a small s3ckpt-backed fsspec file system for
``s3://`` (``register_filesystem``), so an ``s3://`` dirpath works without s3fs; it also
fixes ``ckpt_path="last"`` for object-store folders (Lightning normalises ``s3://b/x`` to
``s3:/b/x`` and then finds nothing).

Sharded strategies (``ModelParallelStrategy``, i.e. FSDP2 and tensor parallelism) do not use
``CheckpointIO`` for sharded state: use :class:`S3ModelParallelStrategy`, which saves every
rank's shards through s3ckpt into one checkpoint (and loads it back at any world size).

Needs ``pip install "s3ckpt[lightning]"``.
"""

from __future__ import annotations

import io
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fsspec import AbstractFileSystem, register_implementation
from fsspec.core import split_protocol
from lightning.pytorch.callbacks.model_checkpoint import ModelCheckpoint
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from s3ckpt.checkpointer import RetentionRecord, RetentionRunner, load_policy
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp import S3StorageReader, S3StorageWriter, quiet_dcp
from s3ckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    LeaseHeldError,
    ObjectNotFoundError,
    S3CkptError,
    find_s3ckpt_error,
)
from s3ckpt.format import MANIFEST_NAME
from s3ckpt.retention import DEFAULT_GRACE, Policy, delete_checkpoint
from s3ckpt.store import ObjectStore, open_store
from s3ckpt.tools import flatten_state_dict, unflatten_state_dict
from s3ckpt.uri import StoreURL, parse_url

__all__ = ["S3CheckpointIO", "S3ModelParallelStrategy"]

log = logging.getLogger("s3ckpt.lightning")

# Keys of a sharded checkpoint: the model's and optimizers' DTensor state dicts as DCP
# saves them, and everything else Lightning saves, flattened, under this key.
_REST = "lightning"


def _is_remote(path: Any) -> bool:
    protocol, _ = split_protocol(str(path))
    return protocol not in (None, "file", "local")


def _metrics_of(checkpoint: Mapping[str, Any]) -> dict[str, float]:
    """Each ModelCheckpoint's monitored value at this save, by its metric name."""
    out: dict[str, float] = {}
    callbacks = checkpoint.get("callbacks")
    if not isinstance(callbacks, Mapping):
        return out
    for state in callbacks.values():
        if not isinstance(state, Mapping):
            continue
        monitor, score = state.get("monitor"), state.get("current_score")
        if isinstance(monitor, str) and score is not None:
            try:
                value = float(score)
            except (TypeError, ValueError):
                continue
            if value == value and abs(value) != float("inf"):
                out[monitor] = value
    return out


def _skeleton(metadata: Metadata, prefix: str = "") -> dict[str, Any]:
    """Destinations for every saved item whose name starts with ``prefix`` (``prefix``
    stripped): empty tensors of the saved dtype and shape, ``None`` for objects."""
    out: dict[str, Any] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if not fqn.startswith(prefix):
            continue
        name = fqn[len(prefix) :]
        if isinstance(md, TensorStorageMetadata):
            out[name] = torch.empty(md.size, dtype=md.properties.dtype)
        else:
            out[name] = None
    return out


@contextmanager
def _dcp_call() -> Iterator[None]:
    """DCP's logging quietened, and the s3ckpt error (naming the object and rank) raised
    instead of DCP's ``CheckpointException`` wrapper around it."""
    try:
        with quiet_dcp():
            yield
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        found = find_s3ckpt_error(exc)
        if found is None or found is exc:
            raise
        raise found from exc


def _to_device(obj: Any, map_location: Any) -> Any:
    if map_location is None or not isinstance(map_location, (str, torch.device)):
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.to(map_location)
    if isinstance(obj, dict):
        return {k: _to_device(v, map_location) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_device(v, map_location) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_device(v, map_location) for v in obj)
    return obj


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


class S3ModelParallelStrategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2 / tensor parallel) saving its sharded
    checkpoints through s3ckpt.

    ``ModelParallelStrategy`` bypasses ``CheckpointIO`` and writes shards with a local
    ``FileSystemWriter``; this subclass sends an ``s3://`` path to s3ckpt instead: every
    rank streams its own shards into one DCP checkpoint (committed once, by rank 0), and
    loading reads back only each rank's part, at any world size (save on 2, resume on 4).
    The configuration (endpoint, retention policy, safe globals) is the trainer's
    :class:`S3CheckpointIO` plug-in when one is given, else a default one. Local paths keep
    the stock behaviour. Checkpoint traffic runs on a gloo group of its own.

    Only ``save_distributed_checkpoint=True`` (the default) is handled here; a full
    (gathered) checkpoint goes through the ``CheckpointIO`` plug-in as usual.
    """

    _s3ckpt_group: dist.ProcessGroup | None = None

    def _s3ckpt_io(self) -> S3CheckpointIO:
        io_: CheckpointIO = self.checkpoint_io  # type: ignore[has-type]
        if not isinstance(io_, S3CheckpointIO):
            io_ = S3CheckpointIO()
            self.checkpoint_io = io_
        return io_

    def _s3ckpt_pg(self) -> dist.ProcessGroup | None:
        if dist.get_backend() == "gloo":
            return None
        if self._s3ckpt_group is None:
            self._s3ckpt_group = dist.new_group(backend="gloo")
        return self._s3ckpt_group

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Every rank: save the sharded state and the rest of ``checkpoint`` to S3."""
        if not _is_remote(filepath) or not self._save_distributed_checkpoint:
            super().save_checkpoint(checkpoint, filepath, storage_options)
            return
        path = self.broadcast(str(filepath))
        sharded = {"state_dict": checkpoint.pop("state_dict")}
        for idx, state in enumerate(checkpoint.pop("optimizer_states", [])):
            sharded[f"optimizer_{idx}"] = state
        self._s3ckpt_io().save_sharded(sharded, checkpoint, path, self._s3ckpt_pg())

    def load_checkpoint(
        self, checkpoint_path: Any, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Every rank: load the model's and optimizers' shards in place; return the rest."""
        if not _is_remote(checkpoint_path):
            return super().load_checkpoint(checkpoint_path, weights_only)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        path = self.broadcast(str(checkpoint_path))
        assert self.model is not None and self.lightning_module is not None
        options = StateDictOptions(cpu_offload=True)
        sharded: dict[str, Any] = {"state_dict": get_model_state_dict(self.model, options=options)}
        for idx, optimizer in enumerate(self.optimizers):
            sharded[f"optimizer_{idx}"] = get_optimizer_state_dict(
                self.model, optimizer, options=options
            )
        rest = self._s3ckpt_io().load_sharded(sharded, path, self._s3ckpt_pg(), weights_only)
        strict = self.lightning_module.strict_loading
        set_model_state_dict(
            self.model,
            sharded["state_dict"],
            options=StateDictOptions(cpu_offload=True, strict=strict),
        )
        for idx, optimizer in enumerate(self.optimizers):
            set_optimizer_state_dict(
                self.model, optimizer, sharded[f"optimizer_{idx}"], options=options
            )
        return rest

    def remove_checkpoint(self, filepath: Any) -> None:
        """Rank 0: delete one checkpoint through s3ckpt (see :class:`S3CheckpointIO`)."""
        if not _is_remote(filepath):
            super().remove_checkpoint(filepath)
            return
        if self.is_global_zero:
            self._s3ckpt_io().remove_checkpoint(filepath)


# -- fsspec: ModelCheckpoint's view of an s3:// folder, without s3fs --------------------------

# The configuration the file system opens stores with: the environment's until an
# S3CheckpointIO names its own (the last one constructed wins), and the stores opened.
_FS_CONFIG: dict[str, Any] = {}
_FS_STORES: dict[tuple[str, int], ObjectStore] = {}
_FS_LOCK = threading.Lock()


def _s3fs_installed() -> bool:
    try:
        import s3fs  # noqa: F401
    except ImportError:
        return False
    return True


def _install_filesystem(
    s3_config: S3Config | None, transfer_config: TransferConfig | None, register: bool | None
) -> None:
    """Register the file system for ``s3://`` (``register=None``: when s3fs is missing).

    Done once when this module is imported, since a ``ModelCheckpoint`` is usually built
    before the Trainer and its plug-in, and again by each :class:`S3CheckpointIO` to pass
    its configuration on."""
    if register is None:
        register = not _s3fs_installed()
    if not register:
        return
    with _FS_LOCK:
        if s3_config is not None:
            _FS_CONFIG.update(s3_config=s3_config, transfer_config=transfer_config)
    for protocol in ("s3", "s3a"):
        register_implementation(protocol, _S3CkptFileSystem, clobber=True)


def _fs_store(bucket: str) -> ObjectStore:
    with _FS_LOCK:
        s3_config = _FS_CONFIG.get("s3_config")
        cache_key = (bucket, id(s3_config))
        store = _FS_STORES.get(cache_key)
        if store is None:
            store, _ = open_store(
                f"s3://{bucket}/",
                s3_config=s3_config,
                transfer_config=_FS_CONFIG.get("transfer_config"),
            )
            _FS_STORES[cache_key] = store
        return store


class _S3CkptFileSystem(AbstractFileSystem):
    """The part of an fsspec file system Lightning's ModelCheckpoint uses (exists, ls,
    isdir, modified, small files), over s3ckpt's store. A checkpoint is a directory; its
    modification time is its commit marker's. Deleting is not offered here: checkpoints
    are removed through :func:`s3ckpt.retention.delete_checkpoint`."""

    protocol = ("s3", "s3a")
    root_marker = ""

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path)
        for p in ("s3://", "s3a://"):
            if text.startswith(p):
                text = text[len(p) :]
        return text.rstrip("/")

    def _split(self, path: Any) -> tuple[ObjectStore, str, str]:
        bucket, _, key = self._strip_protocol(path).partition("/")
        return _fs_store(bucket), bucket, key

    def info(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        store, bucket, key = self._split(path)
        if not key:
            return {"name": bucket, "size": 0, "type": "directory"}
        head = store.head(key)
        if head is not None:
            return {
                "name": f"{bucket}/{key}",
                "size": head.size,
                "type": "file",
                "mtime": head.last_modified,
            }
        for _ in store.list(key + "/"):
            return {"name": f"{bucket}/{key}", "size": 0, "type": "directory"}
        raise FileNotFoundError(str(path))

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> list[Any]:
        store, bucket, key = self._split(path)
        prefix = key + "/" if key else ""
        entries: list[dict[str, Any]] = [
            {"name": f"{bucket}/{p.rstrip('/')}", "size": 0, "type": "directory"}
            for p in store.list_prefixes(prefix)
        ]
        for obj in store.list(prefix):
            if "/" not in obj.key[len(prefix) :]:
                entries.append(
                    {
                        "name": f"{bucket}/{obj.key}",
                        "size": obj.size,
                        "type": "file",
                        "mtime": obj.last_modified,
                    }
                )
        if not entries:
            entries = [self.info(path)]  # a file, or FileNotFoundError
        entries.sort(key=lambda e: e["name"])
        return entries if detail else [e["name"] for e in entries]

    def modified(self, path: Any) -> datetime:
        store, _, key = self._split(path)
        marker = store.head(f"{key}/{MANIFEST_NAME}") if key else None
        head = marker or (store.head(key) if key else None)
        stamps: Iterable[float | None]
        if head is not None:
            stamps = [head.last_modified]
        else:
            stamps = [o.last_modified for o in store.list(key + "/" if key else "")]
        known = [s for s in stamps if s is not None]
        if not known:
            raise FileNotFoundError(str(path))
        return datetime.fromtimestamp(max(known), UTC)

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        """Nothing to do: prefixes exist once an object is written under them."""

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        """Nothing to do: prefixes exist once an object is written under them."""

    def _open(self, path: Any, mode: str = "rb", **kwargs: Any) -> Any:
        store, _, key = self._split(path)
        if "r" in mode:
            return io.BytesIO(store.get(key))
        return _PutOnClose(store, key)


class _PutOnClose(io.BytesIO):
    """A small file written with one PUT when closed (best_k_models.yaml, hparams)."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        super().__init__()
        self._store, self._key = store, key

    def close(self) -> None:
        if not self.closed:
            self._store.put(self._key, self.getvalue())
        super().close()


# -- ckpt_path="last" on an object store --------------------------------------------------------


def _fix_find_last_checkpoints() -> None:
    """Give ``ModelCheckpoint._find_last_checkpoints`` back its URL scheme for remote
    folders: upstream passes fsspec's scheme-less names through ``os.path.normpath``, so
    ``s3://b/run/last.ckpt`` becomes ``b/run/last.ckpt`` (a local path) and
    ``ckpt_path="last"`` finds nothing on S3."""
    original = ModelCheckpoint._find_last_checkpoints
    if getattr(original, "_s3ckpt_fixed", False):
        return

    def _find_last_checkpoints(self: ModelCheckpoint, trainer: Any) -> set[str]:
        found: set[str] = original(self, trainer)
        protocol, _ = split_protocol(str(self.dirpath or ""))
        if protocol in (None, "file", "local"):
            return found
        prefix = f"{protocol}://"
        return {p if p.startswith(prefix) else prefix + p.replace(os.sep, "/") for p in found}

    _find_last_checkpoints._s3ckpt_fixed = True  # type: ignore[attr-defined]
    ModelCheckpoint._find_last_checkpoints = _find_last_checkpoints


_install_filesystem(None, None, None)
_fix_find_last_checkpoints()
