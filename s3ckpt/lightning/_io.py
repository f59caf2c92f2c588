"""S3CheckpointIO: Lightning's CheckpointIO plug-in over s3ckpt; S3ModelParallelStrategy:
FSDP2 / TP sharded checkpoints through it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar, cast

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import CheckpointIO, TorchCheckpointIO
from lightning.pytorch.strategies import ModelParallelStrategy

from s3ckpt._plugin_common import Retention, dcp_errors, open_reader
from s3ckpt.checkpointer import RetentionRecord
from s3ckpt.checkpointer._latest import Candidate, load_newest_good
from s3ckpt.checkpointer._retention import resolve_policy
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp import S3StorageWriter
from s3ckpt.errors import CheckpointError
from s3ckpt.lightning._async import _REST, Removals, _is_remote, _metrics_of, remember
from s3ckpt.lightning._last import find_last, install_filesystem, setup
from s3ckpt.lightning._load import load_remote
from s3ckpt.retention import Policy, RetentionOptions, delete_checkpoint
from s3ckpt.retention._liveness import DEFAULT_GRACE
from s3ckpt.store import Location
from s3ckpt.tools.packing import pack_state, packed_destinations, unpack_state

_T = TypeVar("_T")


class S3ModelCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` for a folder on an object store (``s3://...``).

    Constructing it registers s3ckpt's fsspec file system for ``s3://`` when s3fs is not
    installed (a ``ModelCheckpoint`` lists its folder through fsspec and is usually built
    before the Trainer's :class:`S3CheckpointIO`), and its ``last*.ckpt`` keep their URL
    scheme for ``ckpt_path="last"`` (:func:`s3ckpt.lightning._last.find_last`). Arguments,
    and the key of its state in a checkpoint, are ``ModelCheckpoint``'s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        install_filesystem(None)
        super().__init__(*args, **kwargs)

    def _find_last_checkpoints(self, trainer: Any) -> set[str]:
        return find_last(self, trainer, super()._find_last_checkpoints)

    @property
    def state_key(self) -> str:
        # ModelCheckpoint's key, so a checkpoint of either restores the other's state.
        return "ModelCheckpoint" + super().state_key.removeprefix(type(self).__qualname__)


class S3CheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO`` that saves, loads and removes checkpoints through s3ckpt.

    Local paths are left to Lightning's ``TorchCheckpointIO``, so the same plug-in serves a
    run that also writes locally.

    Args:
        policy: Retention after each commit on rank 0: a
            :class:`~s3ckpt.retention.Policy`, a built-in policy name (``"pretraining"``)
            or a TOML policy file; ``None`` leaves pruning to ``save_top_k``. Whatever the
            policy, it never deletes a checkpoint a ``ModelCheckpoint`` tracks.
        s3_config: Endpoint, region, encryption (default: from the environment). Also
            what ``load_from_checkpoint`` and the fsspec file system use for the buckets
            this plug-in opens (docs/frameworks/lightning.md, "Which settings").
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
        fallback: ``ckpt_path="last"`` on an object store skips a checkpoint known damaged
            (``s3ckpt check`` found it) and, when the chosen one fails verification while
            loading (a checksum, a missing object), loads the newest good one before it (an
            older ``last*.ckpt``, else the folder's newest committed checkpoint), each with
            a WARNING naming it. ``False``: raise :class:`~s3ckpt.errors.CorruptCheckpointError`.

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
        fallback: bool = True,
    ) -> None:
        super().__init__()
        self.s3_config = s3_config or S3Config()
        self.transfer_config = transfer_config or TransferConfig()
        self.policy = resolve_policy(policy)
        self.safe_globals = tuple(safe_globals)
        self.verify_checksums = verify_checksums
        self.retention_grace = retention_grace
        self.fallback = fallback
        self._resume: list[Candidate] = []  # ckpt_path="last": the chosen one, then fallbacks
        self._retention = Retention()
        self._removals = Removals(self._delete)
        self._torch_io = TorchCheckpointIO()  # local paths
        remember(self.s3_config, self.transfer_config)
        setup(register_filesystem)

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
            self._torch_io.save_checkpoint(checkpoint, path, storage_options)
            return
        self._save(pack_state(checkpoint), path, checkpoint, None, True)

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
            return self._torch_io.load_checkpoint(path, map_location, weights_only)
        return self._resumed(path, lambda here: load_remote(here, map_location, weights_only, self))

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
            self._torch_io.remove_checkpoint(path)
            return
        self._removals.request(path)

    def teardown(self) -> None:
        """Wait for background retention passes, then carry out the removals still
        waiting (a last try: what cannot be deleted now is left, with a warning).
        Lightning calls it when ``fit`` (or ``validate``...) ends, also through
        ``AsyncCheckpointIO`` once its queued saves are done."""
        self._retention.wait()
        self._removals.flush(final=True)

    @property
    def retention_history(self) -> tuple[RetentionRecord, ...]:
        """This process's retention passes (the last 100 per run), oldest first: the step
        whose commit triggered each, its result or the exception it failed with."""
        return self._retention.history

    # -- sharded (used by S3ModelParallelStrategy) ----------------------------------------
    def save_sharded(
        self,
        sharded: dict[str, Any],
        rest: Mapping[str, Any],
        path: Any,
        process_group: dist.ProcessGroup | None,
    ) -> None:
        """Every rank: save ``sharded`` (DTensor state dicts) and ``rest`` as one checkpoint."""
        self._save({**sharded, _REST: pack_state(rest)}, path, rest, process_group, False)

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

        def read(here: Location) -> dict[str, Any]:
            reader = open_reader(here, self, allow_unsafe_pickle=weights_only is False)
            rest = packed_destinations(reader.metadata, _REST)
            if rest is None:
                raise CheckpointError(
                    f"{reader.url} is not a sharded checkpoint of S3ModelParallelStrategy (it "
                    "was saved in one process, or by another tool), so the strategy cannot "
                    "resume from it; its weights load with MyModule.load_from_checkpoint(...) "
                    "or S3CheckpointIO().load_checkpoint(...)",
                    bucket=reader.store.bucket,
                    key=reader.url.prefix,
                )
            state = {**sharded, _REST: rest}
            with dcp_errors("a checkpoint save or load"):
                dcp.load(state, storage_reader=reader, process_group=process_group)
            return cast(dict[str, Any], unpack_state(state[_REST]))

        return self._resumed(path, read)

    def resume_from(self, chain: Sequence[Candidate]) -> None:
        """The next load of ``chain[0]`` is ``ckpt_path="last"`` resolved
        (:mod:`s3ckpt.lightning._last`): with ``fallback``, it goes on along ``chain`` past
        a checkpoint whose read fails verification."""
        self._resume = list(chain)

    # -- internals -------------------------------------------------------------------------
    def _resumed(self, path: Any, read: Callable[[Location], _T]) -> _T:
        """``read`` the checkpoint at ``path``; when it is the one ``ckpt_path="last"``
        chose, falling back along the chain (:meth:`resume_from`)."""
        here = self._open(path)
        chain, self._resume = self._resume, []
        if not chain or self._open(chain[0].url).url != here.url:
            return read(here)
        found = load_newest_good(
            chain, lambda c: read(self._open(c.url)), fallback=self.fallback, run=here.url.parent
        )
        assert found is not None
        return found[1]

    def _open(self, path: Any) -> Location:
        """``path`` in the process's shared store for this plug-in's settings, which are
        registered for its bucket (for ``load_from_checkpoint`` and the file system)."""
        here = Location.of(
            str(path), s3_config=self.s3_config, transfer_config=self.transfer_config
        )
        remember(self.s3_config, self.transfer_config, here.url)
        return here

    def _save(
        self, state: dict[str, Any], path: Any, ckpt: Mapping[str, Any], pg: Any, one: bool
    ) -> None:
        """Save ``state`` at ``path`` on process group ``pg`` (``one``: in this process
        alone); then, on rank 0, the removals that waited for this commit and a retention
        pass that keeps what any ``ModelCheckpoint`` tracks."""
        here = self._open(path)
        step = ckpt.get("global_step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        self._removals.begin_save(str(here), ckpt)
        writer = S3StorageWriter(here, overwrite=True, step=step, metrics=_metrics_of(ckpt))
        try:
            with dcp_errors("a checkpoint save or load"):
                dcp.save(state, storage_writer=writer, process_group=pg, no_dist=one)
        finally:
            self._removals.end_save(str(here))
        if one or dist.get_rank(pg) == 0:
            self._removals.flush()
            if self.policy is not None:
                policy = self._removals.protect(self.policy, here.parent.url)
                self._retention.schedule(here.parent, policy, self.retention_grace, step)

    def _delete(self, path: str) -> None:
        delete_checkpoint(self._open(path), options=RetentionOptions(grace=self.retention_grace))


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        setup(None)  # what S3CheckpointIO installs when constructed, for a strategy without

    def _s3ckpt_io(self) -> S3CheckpointIO:
        if not isinstance(self.checkpoint_io, S3CheckpointIO):  # type: ignore[has-type]
            self.checkpoint_io = S3CheckpointIO()
        return self.checkpoint_io

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
        from torch.distributed.checkpoint import state_dict as tsd

        path = self.broadcast(str(checkpoint_path))
        assert self.model is not None and self.lightning_module is not None
        model, options = self.model, tsd.StateDictOptions(cpu_offload=True)
        sharded: dict[str, Any] = {"state_dict": tsd.get_model_state_dict(model, options=options)}
        for idx, opt in enumerate(self.optimizers):
            sharded[f"optimizer_{idx}"] = tsd.get_optimizer_state_dict(model, opt, options=options)
        rest = self._s3ckpt_io().load_sharded(sharded, path, self._s3ckpt_pg(), weights_only)
        strict = tsd.StateDictOptions(cpu_offload=True, strict=self.lightning_module.strict_loading)
        tsd.set_model_state_dict(model, sharded["state_dict"], options=strict)
        for idx, opt in enumerate(self.optimizers):
            tsd.set_optimizer_state_dict(model, opt, sharded[f"optimizer_{idx}"], options=options)
        return rest

    def remove_checkpoint(self, filepath: Any) -> None:
        """Rank 0: delete one checkpoint through s3ckpt (see :class:`S3CheckpointIO`)."""
        if not _is_remote(filepath):
            super().remove_checkpoint(filepath)
        elif self.is_global_zero:
            self._s3ckpt_io().remove_checkpoint(filepath)
