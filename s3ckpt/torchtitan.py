"""torchtitan on s3ckpt: a ``CheckpointManager`` whose ``s3://`` folder goes through s3ckpt.

::

    from torchtitan.models.llama3.config_registry import llama3_8b
    from s3ckpt.torchtitan import S3CheckpointManager

    def llama3_8b_s3():                    # a config_registry function (--config llama3_8b_s3)
        config = llama3_8b()
        config.checkpoint = S3CheckpointManager.Config(
            enable=True,
            folder="s3://bucket/runs/llama3-8b",
            interval=500,
            keep_latest_k=3,               # or retention_policy="pretraining"
            async_mode="async",
        )
        return config

What changes against torchtitan's own ``CheckpointManager`` when ``checkpoint.folder`` is an
``s3://`` URL (any other folder behaves exactly as stock):

* **Save**: ``dcp.save`` / ``dcp.async_save`` (both async modes) write ``{folder}/step-{N}``
  through :class:`~s3ckpt.dcp.S3StorageWriter`: parallel multipart uploads, CRC32C per
  item, the step recorded in the commit marker ``s3ckpt.json``, which is written last. A
  step saved again (a run restarted from an older ``load_step``) replaces the committed one
  safely: the old one stays loadable until the new one commits.
* **Resume**: the latest step is the newest ``step-N`` whose commit marker exists, found by
  one listing on rank 0 and broadcast (stock torchtitan lists on every rank and takes any
  folder with a ``.metadata`` for finished, so a save killed after its ``.metadata``, or one
  still uploading, can be picked). A step ``s3ckpt check`` found damaged is skipped, and a
  step whose read fails verification falls back to the newest good one, each with a WARNING
  naming it (``load_fallback=False``: raise instead). An explicit ``load_step`` must name a
  committed checkpoint and is read as asked. Every item read is checked against its CRC32C.
* **Retention**: after a checkpoint commits (for async saves: when its upload finishes),
  rank 0 runs :func:`s3ckpt.retention.prune` in a background thread, with
  ``KeepLast(keep_latest_k)`` or the ``retention_policy`` named in the config, instead of
  torchtitan's ``rm -r`` of all but the newest ``keep_latest_k`` folders. Pinned
  checkpoints, the newest committed one and saves in progress are never deleted, and the
  deletes are crash-safe and leased against a concurrent ``s3ckpt prune`` cron.
* No s3fs: nothing goes through fsspec for an ``s3://`` folder. ``initial_load_path`` may be
  a local folder, an s3ckpt checkpoint or a stock DCP checkpoint on ``s3://``.

Importing this module imports torchtitan (``pip install torchtitan``; written against
0.3.0, whose manager lives in ``torchtitan.components.checkpointer``).
"""

from __future__ import annotations

import logging
import posixpath
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torchtitan.components.checkpointer import MODEL, AsyncMode, CheckpointManager
from torchtitan.tools import filesystem
from torchtitan.tools.utils import GarbageCollection

from s3ckpt._plugin_common import agree, dcp_errors, rank_of, together
from s3ckpt._step_names import checkpoint_step
from s3ckpt.checkpointer._latest import Candidate, load_newest_good
from s3ckpt.checkpointer._retention import RetentionRunner, resolve_policy
from s3ckpt.dcp import S3StorageReader, S3StorageWriter
from s3ckpt.errors import CheckpointNotFoundError
from s3ckpt.retention import KeepLast, Policy, PruneResult, list_checkpoints
from s3ckpt.retention._liveness import DEFAULT_GRACE
from s3ckpt.store import Location

__all__ = ["S3CheckpointManager"]

log = logging.getLogger("s3ckpt")


def _is_s3(path: object) -> bool:
    return str(path).startswith(("s3://", "s3a://"))


class S3CheckpointManager(CheckpointManager):
    """torchtitan's ``CheckpointManager`` with s3ckpt for an ``s3://`` ``checkpoint.folder``.

    Built by torchtitan's ``Trainer`` from :class:`S3CheckpointManager.Config` (put one in
    ``Trainer.Config.checkpoint``); the constructor's arguments are the stock manager's.
    See the module docstring for what changes. The endpoint, region and credentials come
    from boto3's default chain (``AWS_ENDPOINT_URL`` for an S3-compatible server).

    Attributes:
        policy: The retention policy run after each commit on an ``s3://`` folder, or None
            (keep everything). Set from the config; assign another
            :class:`~s3ckpt.retention.Policy` after construction to use one built in Python.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        """The stock checkpoint settings, plus the retention policy for an ``s3://`` folder."""

        retention_policy: str | None = None
        """Retention for an s3:// folder, run by rank 0 after each checkpoint commits: a
        built-in policy name (pretraining, keep-last-3, ...) or a policy TOML file. Default:
        keep the last keep_latest_k committed checkpoints (all of them when it is 0)."""

        load_fallback: bool = True
        """Resuming from the newest step of an s3:// folder (no load_step): skip a step
        s3ckpt check found damaged, or whose read fails verification (a checksum, a missing
        object), with a WARNING naming it, and load the newest good one. False: raise
        s3ckpt's CorruptCheckpointError instead. An explicit load_step is always strict."""

    def __init__(self, config: S3CheckpointManager.Config, **kwargs: Any) -> None:
        self._retention: RetentionRunner | None = None  # set iff the folder is s3://
        self._group: dist.ProcessGroup | None = None
        self._location: Location | None = None  # set iff the folder is s3://
        self.policy: Policy | None = None
        self.load_fallback = config.load_fallback
        super().__init__(config, **kwargs)
        if not self.enable or not _is_s3(self.folder):
            return
        # The folder in the process's shared store (environment settings), for every save,
        # load, listing and retention pass of the run.
        self._location = Location.of(self.folder)
        self._retention = RetentionRunner(self._location.store, self._location.url)
        self.policy = resolve_policy(config.retention_policy)
        if self.policy is None and self.keep_latest_k > 0:
            self.policy = KeepLast(self.keep_latest_k)
        # Rank 0 lists the bucket and tells the others, on gloo whatever the training
        # backend. A collective: every rank builds the manager, in the same order.
        if dist.is_initialized() and dist.get_world_size() > 1:
            self._group = dist.new_group(backend="gloo")

    @property
    def last_retention(self) -> PruneResult | BaseException | None:
        """The last retention pass's result, or the exception it failed with (None before
        the first pass, and on ranks other than 0). Failures never stop training."""
        return None if self._retention is None else self._retention.last

    # -- save ---------------------------------------------------------------------------------
    @torch.no_grad()
    def dcp_save(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        async_mode: AsyncMode,
        enable_garbage_collection: bool = False,
        to_hf: bool = False,
    ) -> Any:
        """The stock dispatch (sync, thread async, pinned-memory process async) with an
        :class:`~s3ckpt.dcp.S3StorageWriter` for an ``s3://`` ``checkpoint_id``."""
        if self._retention is None or to_hf or not _is_s3(checkpoint_id):
            return super().dcp_save(
                state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf
            )
        step = checkpoint_step(posixpath.basename(checkpoint_id.rstrip("/")))
        # The writer takes the folder's store from the process-wide cache (Location.of).
        writer = S3StorageWriter(checkpoint_id, step=step, overwrite=True)
        if async_mode == AsyncMode.ASYNC:
            ret = dcp.async_save(state_dict, storage_writer=writer, process_group=self.pg)
        elif async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:
            ret = dcp.async_save(
                state_dict,
                storage_writer=writer,
                process_group=self.pg,
                async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                async_stager=self.stager,
            )
        else:
            with dcp_errors(f"the save of {checkpoint_id}"):
                ret = dcp.save(state_dict, storage_writer=writer)
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        return ret

    def _purge_stale_checkpoints(self) -> None:
        """Retention by policy after the save just started commits, instead of ``rm -r``."""
        if self._retention is None:
            super()._purge_stale_checkpoints()
        elif self.policy is not None and rank_of() == 0:
            if self.save_future is None:  # a sync save: it has committed
                self._schedule_retention()
            else:  # an async save: once its upload has succeeded
                self.save_future.add_done_callback(self._schedule_retention)

    def _save_last_step(self, curr_step: int) -> None:
        super()._save_last_step(curr_step)
        if self._retention is not None:  # stock purges after every save but the last
            self._purge_stale_checkpoints()

    def _schedule_retention(self, upload: Future[Any] | None = None) -> None:
        if upload is not None and (upload.cancelled() or upload.exception() is not None):
            return
        assert self._retention is not None and self.policy is not None
        try:
            self._retention.schedule(self.policy, DEFAULT_GRACE)
        except RuntimeError:  # the manager was closed while the save was uploading
            log.info("s3ckpt: no retention pass after the last save (manager closed)")

    # -- load ---------------------------------------------------------------------------------
    def _committed(self) -> list[Candidate]:
        """The committed ``step-N`` checkpoints, newest first, as the catalog judged them
        (damage included): one listing on rank 0, broadcast to the others (so all ranks
        load the same step)."""
        assert self._location is not None
        run = self._location
        return agree(
            lambda: Candidate.newest_first(
                info
                for info in list_checkpoints(run)
                if info.step is not None
                and info.name == posixpath.basename(self._create_checkpoint_id(info.step))
            ),
            self._group,
        )

    def _find_load_step(self, folder: str = "") -> int:
        """The newest good committed step in ``folder`` (default: the checkpoint folder;
        damaged steps skipped), or -1."""
        if self._retention is None or (folder and folder != self.folder):
            return super()._find_load_step(folder)
        return next((c.step for c in self._committed() if not c.damage and c.step is not None), -1)

    @torch.no_grad()
    def _load(self, step: int = -1) -> bool:
        """Stock ``load``: resume from ``step`` (-1: the newest good one, falling back past
        damage: ``load_fallback``), else the initial load; with only committed checkpoints
        of an ``s3://`` folder counting."""
        if self._retention is None:
            return super()._load(step)
        from_hf, from_quantized = False, self.initial_load_in_hf_quantized  # (initial loads)
        committed = self._committed()
        if step == -1 and committed:  # resume (fault tolerance): initial_* ignored, as stock
            assert self._location is not None
            load_newest_good(
                committed,
                lambda c: self._read(c.url, model_only=c.step == 0),
                fallback=self.load_fallback,
                run=self._location.url,
            )
            return True
        if step != -1:
            checkpoint_id = self._create_checkpoint_id(step)
            if step not in (steps := sorted(c.step for c in committed if c.step is not None)):
                raise CheckpointNotFoundError(
                    f"--checkpoint.load_step={step}: {checkpoint_id} is not a committed "
                    f"checkpoint (no s3ckpt.json); committed steps: {steps or 'none'}"
                )
            model_only, from_quantized = step == 0, False
        elif self.initial_load_path:
            checkpoint_id, model_only = self.initial_load_path, self.initial_load_model_only
            from_hf = self.initial_load_in_hf
            if not _is_s3(checkpoint_id) and not filesystem.isdir(checkpoint_id):
                raise ValueError(f"Checkpoint.initial_load_path is invalid: {checkpoint_id}")
        elif self.initial_load_in_hf:
            if self.sd_adapter is None or not self.sd_adapter.hf_assets_path:
                raise ValueError("initial_load_in_hf needs a model with hf_assets_path")
            checkpoint_id, model_only, from_hf = self.sd_adapter.hf_assets_path, True, True
        else:
            log.info("s3ckpt: no committed checkpoint in %s; a fresh start", self.folder)
            return False
        self._read(checkpoint_id, model_only, from_hf, from_quantized)
        return True

    def _read(
        self, checkpoint_id: str, model_only: bool, hf: bool = False, q: bool = False
    ) -> None:
        log.info("s3ckpt: loading the checkpoint %s", checkpoint_id)
        begin = time.monotonic()
        self.dcp_load(self._states_to_load(model_only), checkpoint_id, hf, q)
        GarbageCollection.collect("GC collection for checkpoint loading.")
        log.info("s3ckpt: loaded %s in %.2f s", checkpoint_id, time.monotonic() - begin)

    def dcp_load(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        from_hf: bool,
        from_quantized: bool,
    ) -> None:
        """Stock ``dcp_load``, reading an ``s3://`` ``checkpoint_id`` through
        :class:`~s3ckpt.dcp.S3StorageReader` (CRC32C checked; an uncommitted s3ckpt save
        is refused)."""
        if from_hf or not _is_s3(checkpoint_id):
            super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)
            return
        # Each rank reads the marker itself; one that fails makes every rank raise the same
        # error, so the fallback decides alike everywhere and none waits in dcp.load.
        reader = together(lambda: S3StorageReader(checkpoint_id), self._group)
        with dcp_errors(f"the load of {checkpoint_id}"):
            dcp.load(state_dict, storage_reader=reader)
        # As in stock: the model's entries are flattened into state_dict.
        if MODEL in self.states:
            self.states[MODEL].load_state_dict(state_dict)

    # -- close --------------------------------------------------------------------------------
    def _close(self) -> None:
        super()._close()
        if self._retention is not None:
            self._retention.close()  # waits for the retention passes already queued
