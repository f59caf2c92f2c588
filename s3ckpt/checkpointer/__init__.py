"""``Checkpointer``: what a training loop touches.

::

    with Checkpointer("s3://bucket/runs/llama", policy="pretraining") as ckpt:
        start = ckpt.load(model, optimizer, train_state) or 0  # None: nothing to resume
        for step in range(start + 1, total + 1):
            ...
            if step % 100 == 0:
                handle = ckpt.async_save(step, model, optimizer, train_state)
                handle.staged.result()  # before the next optimizer.step() changes parameters
    # leaving the block (also by an exception) waits for the last save: close()

Layout under the run prefix ``path``: ``step_000000100/`` (one DCP checkpoint, committed by
its ``s3ckpt.json``), ... and ``s3ckpt.latest.json``, the pointer to the newest commit (with
``prefix_strategy=HashedPrefixes(...)`` the saves' data objects go under ``s3ckpt-shards/``).

The state dict saved is ``{"model": ..., "optim": ..., "train_state": ...}`` built by
torch's ``get_state_dict`` / ``set_state_dict``, so plain modules, DDP, DTensor and FSDP2
(``fully_shard``) all work, and a checkpoint saved on N ranks loads on M.

Distributed jobs: construct the Checkpointer on every rank (it creates a dedicated gloo
process group for checkpoint traffic, which is a collective call) and call ``save`` /
``async_save`` / ``load`` on every rank. Only the coordinator (rank 0 of that group) lists
the bucket, resolves ``latest``, writes the pointer and runs retention; the others get the
answer by broadcast.

Async saves follow torch's zero-overhead design: the state dict is staged (copied) into a
CPU copy that is cached across saves (pinned when CUDA is present), then uploaded in a
background thread. A save's :class:`SaveHandle` has two futures: ``staged`` (training may
modify parameters again) and ``committed`` (the checkpoint is durable: ``s3ckpt.json`` is
written). One save is in flight at a time: a second one waits for the first to commit
(``on_busy="wait"``, the default: the staging copy is reused, so it must not be
overwritten while the upload reads it) or raises :class:`~s3ckpt.errors.SaveInProgressError`
(``on_busy="raise"``). A failed async save sets its error on the handle and raises it from
the next call to the Checkpointer (once), never silently.

Retention (``policy``) runs after each commit, on the coordinator, in a background thread;
its failures are logged and kept (:attr:`Checkpointer.last_retention`,
:attr:`Checkpointer.retention_history`) but never fail training.

Requests: one boto3 client per process and settings. A save reads ``s3ckpt.json`` once to
fail fast and once in its commit; a load reads the ``latest`` pointer, the run's
``s3ckpt.check.json`` and the marker the pointer names (GETs, to judge it), then
``s3ckpt.json`` and ``.metadata`` once each to read it.

Metrics (:mod:`s3ckpt.metrics`): every save and load publishes one event on every rank when
it commits, is restored or fails (a save with ``blocked_s``, the time training was held),
counting its requests on any thread and the bytes this rank wrote or read. Retention after
a commit publishes its own ``"prune"`` event.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, Literal, SupportsFloat

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from s3ckpt.checkpointer._async import SaveHandle, SaveQueue, apply_state_dict, collect_state_dict
from s3ckpt.checkpointer._latest import Candidate, LatestPointer, load_newest_good
from s3ckpt.checkpointer._ranks import RankGroup
from s3ckpt.checkpointer._retention import (
    RetentionRecord,
    RetentionRunner,
    resolve_policy,
)
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp import SafeGlobal
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.dcp.restore import check_state_dict, load_verified
from s3ckpt.dcp.writer import S3StorageWriter
from s3ckpt.errors import (
    CheckpointNotFoundError,
    ConfigError,
    PreconditionFailedError,
    S3CkptError,
    TransientStoreError,
)
from s3ckpt.format import HashedPrefixes
from s3ckpt.format._manifest import Manifest, check_metrics
from s3ckpt.format._names import MANIFEST_NAME, check_prefix_strategy, checkpoint_name
from s3ckpt.metrics import instrument
from s3ckpt.retention import CheckpointInfo, Policy, PruneResult, RetentionOptions, list_checkpoints
from s3ckpt.retention._liveness import DEFAULT_GRACE
from s3ckpt.store import Location, ObjectStore
from s3ckpt.store._capabilities import require_conditional_writes
from s3ckpt.store._location import AtLocation, LocationLike
from s3ckpt.uri import StoreURL

# What a training loop calls or reads. The layout names (LATEST_NAME, checkpoint_name) are
# s3ckpt.format's. RetentionRunner and resolve_policy stay importable from here for the
# framework glue (lightning, accelerate, torchtitan): the plug-ins' API, not users'.
__all__ = ["Checkpointer", "RetentionRecord", "SaveHandle"]

log = logging.getLogger("s3ckpt")


class Checkpointer(AtLocation):
    """Save, async-save and resume training state in an S3 run prefix, with retention.

    The parts it composes: a :class:`RankGroup` (process group, coordinator, broadcast), a
    :class:`SaveQueue` (staging and the upload thread, one save in flight), a
    :class:`LatestPointer` (the ``latest`` pointer and its resolution on the coordinator)
    and a :class:`RetentionRunner` (the policy after each commit). The run's location (one
    :class:`~s3ckpt.store.Location`: URL, store, settings) is fixed at construction and
    shared by all of them; each save's writer and each load's reader get a child of it.
    ``url``, ``store``, ``s3_config`` and ``transfer_config`` read it.

    Args:
        path: The run prefix, e.g. ``s3://bucket/runs/llama-8b`` (any URL the store
            accepts; ``s3://`` uses boto3), a parsed :class:`~s3ckpt.uri.StoreURL`, a local
            path (``os.PathLike``) or a :class:`~s3ckpt.store.Location` (with its own store
            and settings: then pass none of ``s3_config``, ``transfer_config``, ``store``).
        policy: A retention policy (a :class:`s3ckpt.retention.Policy`, a built-in policy
            name such as ``"pretraining"``, or the path of a TOML policy file) applied after
            each commit; ``None`` keeps everything.
        s3_config: Endpoint, encryption, storage class (default: from the environment).
        transfer_config: Part size, concurrency and memory bounds of transfers.
        process_group: Group for checkpoint collectives. Default: a new gloo group over
            all ranks, so checkpoint traffic never interleaves with training collectives
            and async saves have the CPU backend DCP needs.
        on_busy: What a save does while the previous async save is still uploading:
            ``"wait"`` for it to commit, or ``"raise"`` :class:`SaveInProgressError`.
        pin_memory: Stage into pinned memory (default: when CUDA is available).
        verify_checksums: Verify CRC32C of every item on load.
        retention_grace: Prefixes without a commit marker younger than this are treated
            as saves in progress by retention (never deleted).
        store: Use this store instead of opening one for ``path`` (tests; MemoryStore).
        prefix_strategy: Where each save's data objects go (see ``prefix_strategy`` of
            :class:`~s3ckpt.dcp.S3StorageWriter`): ``None``, the default, in the step's
            folder; :class:`~s3ckpt.HashedPrefixes` spreads them over hashed folders of the
            run (``s3ckpt-shards/{h}/step_.../``) for jobs of many ranks that S3 would
            throttle. Loading needs nothing: the layout is recorded in each ``s3ckpt.json``.
    """

    def __init__(
        self,
        path: LocationLike,
        *,
        policy: Policy | str | None = None,
        s3_config: S3Config | None = None,
        transfer_config: TransferConfig | None = None,
        process_group: dist.ProcessGroup | None = None,
        on_busy: Literal["wait", "raise"] = "wait",
        pin_memory: bool | None = None,
        verify_checksums: bool = True,
        retention_grace: timedelta = DEFAULT_GRACE,
        store: ObjectStore | None = None,
        prefix_strategy: HashedPrefixes | None = None,
    ) -> None:
        if on_busy not in ("wait", "raise"):
            raise ConfigError(f"on_busy must be 'wait' or 'raise', got {on_busy!r}")
        self.prefix_strategy = check_prefix_strategy(prefix_strategy)
        self.location = Location.of(
            path, s3_config=s3_config, transfer_config=transfer_config, store=store
        )
        self.policy = resolve_policy(policy)
        self.on_busy, self.verify_checksums = on_busy, verify_checksums
        self.retention_grace = retention_grace

        # A collective in a distributed job: every rank constructs its Checkpointer here.
        self._ranks = RankGroup(process_group)
        self._pg = self._ranks.process_group
        self.is_coordinator = self._ranks.is_coordinator
        self._latest = LatestPointer(self.store, self.url, self._ranks)
        self._saves = SaveQueue(pin_memory, self._pg, self._latest.write, self._committed)
        self._retention = RetentionRunner(self.store, self.url)
        self._closed = False

    @property
    def last_retention(self) -> PruneResult | BaseException | None:
        """The last retention pass's result, or the exception it failed with (``None``
        before the first pass)."""
        return self._retention.last

    @property
    def retention_history(self) -> tuple[RetentionRecord, ...]:
        """Every retention pass of this Checkpointer, oldest first, up to the last
        :data:`~s3ckpt.checkpointer._retention.RETENTION_HISTORY` (100): each a
        :class:`RetentionRecord` with the step whose commit triggered it, when it ran, and
        its result or the exception it failed with. Empty on ranks other than the
        coordinator, and without a policy. Passes still queued are not in it yet
        (:meth:`wait` first)."""
        return self._retention.history

    # -- public API ---------------------------------------------------------------------------
    def save(
        self,
        step: int,
        model: torch.nn.Module | list[torch.nn.Module],
        optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
        train_state: Any | None = None,
        metrics: Mapping[str, SupportsFloat] | None = None,
    ) -> SaveHandle:
        """:meth:`async_save` waited on: returns a done :class:`SaveHandle` once the
        checkpoint is committed (retention queued after it), or raises the save's error.
        The state is uploaded as it is, on this thread, without a staging copy.

        Ctrl-C raises ``KeyboardInterrupt`` after cleanup (uploads aborted, what it wrote
        removed or marked failed); the previous checkpoint and ``latest`` stay as they were.
        """
        handle = self._start(step, (model, optimizer, train_state), metrics, blocking=True)
        handle.wait()
        return handle

    def async_save(
        self,
        step: int,
        model: torch.nn.Module | list[torch.nn.Module],
        optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
        train_state: Any | None = None,
        metrics: Mapping[str, SupportsFloat] | None = None,
    ) -> SaveHandle:
        """Start a save and return as soon as staging has been started.

        Wait for ``handle.staged`` before the next step modifies parameters or optimizer
        state; ``handle.committed`` resolves when the checkpoint is durable.
        """
        return self._start(step, (model, optimizer, train_state), metrics, blocking=False)

    def load(
        self,
        model: torch.nn.Module | list[torch.nn.Module],
        optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
        train_state: Any | None = None,
        step: int | Literal["latest"] = "latest",
        *,
        verify_complete: bool = False,
        safe_globals: Sequence[SafeGlobal] = (),
        allow_unsafe_pickle: bool = False,
        fan_out: bool = False,
        strict: bool = True,
        fallback: bool = True,
    ) -> int | None:
        """Restore ``model`` (and ``optimizer``, ``train_state``) from a checkpoint.

        Args:
            step: ``"latest"`` (the newest good committed checkpoint) or a step number.
            verify_complete: Fill floating-point destinations with NaN before loading and
                raise :class:`~s3ckpt.errors.IncompleteRestoreError` naming every tensor
                the checkpoint did not restore.
            safe_globals: Your own classes that non-tensor values (the train state, say)
                may rebuild, on top of :data:`~s3ckpt.dcp.SAFE_GLOBALS` (see
                :class:`~s3ckpt.dcp.S3StorageReader`).
            allow_unsafe_pickle: Rebuild non-tensor values with full pickle, unchecked:
                only for a bucket you trust (a framework's ``weights_only=False``).
            fan_out: Read what several ranks load (replicated parameters, data-parallel
                replicas) from the store once for the group and share it over the
                Checkpointer's process group (see ``fan_out`` of
                :class:`~s3ckpt.dcp.S3StorageReader`: when it helps, its memory cost).
                Without a process group every rank reads directly.
            strict: Refuse a checkpoint whose keys differ from the state dict's (the
                model's both ways). ``False`` loads the keys both have, as
                ``Module.load_state_dict(strict=False)``; shapes must match either way.
            fallback: With ``step="latest"``, skip a checkpoint known damaged (``s3ckpt
                check`` found it, or its marker is unreadable) or whose read fails
                verification (checksum, missing object, corrupt ``.metadata``), with a
                WARNING naming it, and load the newest good one: every tensor is then the
                good checkpoint's (docs/checkpointer.md). ``False``: a damaged newest
                checkpoint raises :class:`~s3ckpt.errors.CorruptCheckpointError`.

        Returns:
            The step loaded, or ``None`` when ``step="latest"`` and the run has no
            committed checkpoint (the model is left untouched; a WARNING names the runs
            near the URL when it holds nothing, a misspelt name).

        Raises (all :class:`~s3ckpt.errors.S3CkptError`; never DCP's ``CheckpointException``):
            CheckpointNotFoundError: ``step`` was a number with no committed checkpoint.
            ConfigError: the URL is a checkpoint's, not a run's (the message says which).
            StateMismatchError: the checkpoint does not fit (shapes, keys); nothing changed.
            CorruptCheckpointError: no good checkpoint left, or the one read (a numbered
                step, ``fallback=False``) is damaged: ChecksumMismatchError among them.
            UnsafeCheckpointError: a value needs a class outside the allow-list.
            StoreError: the store failed (ObjectNotFoundError: an object is missing).
        """
        self._check_open()
        recorder = self._recorder("load", step if isinstance(step, int) else None)
        self._saves.settle(self.on_busy)

        def read(c: Candidate) -> None:
            recorder.url, recorder.step = c.url, c.step
            # A fresh state dict per read, applied only when the read succeeded: a strict load
            # (the default) writes every tensor it holds, so nothing a failed read wrote
            # survives a fallback (with strict=False a tensor the older checkpoint lacks
            # keeps what the failed read left in it).
            sd = collect_state_dict(model, optimizer, train_state)
            reader = S3StorageReader(
                self.location.child(checkpoint_name(c.step or 0)),
                verify_checksums=self.verify_checksums,
                safe_globals=safe_globals,
                allow_unsafe_pickle=allow_unsafe_pickle,
                fan_out=fan_out,
                process_group=self._pg,
            )
            # .metadata against sd first, on every rank with one gather: a checkpoint that
            # does not fit raises StateMismatchError on all ranks before a byte of data is
            # read (the model's keys both ways, the optimizer's and train state's only for
            # what the destination needs).
            check_state_dict(
                sd,
                reader.metadata,
                strict=strict,
                unexpected_under=("model",),
                process_group=self._pg,
                url=reader.url,
            )
            if verify_complete:
                load_verified(sd, reader, process_group=self._pg)
            else:
                planner = DefaultLoadPlanner(allow_partial_load=not strict)
                dcp.load(sd, storage_reader=reader, planner=planner, process_group=self._pg)
            apply_state_dict(sd, model, optimizer, train_state)
            log.info("s3ckpt: loaded step %d from %s", c.step, c.url)

        try:
            with instrument.bound(recorder):
                if step == "latest":
                    chain: Iterable[Candidate] = self._latest.candidates(self.retention_grace)
                else:  # a numbered step is read as asked, never replaced by another
                    chain, fallback = [self._latest.resolve(step)], False
                found = load_newest_good(chain, read, fallback=fallback, run=self.url)
        except BaseException as exc:  # an s3ckpt error or Ctrl-C (DCP's wrapper unwrapped)
            recorder.finish(exc)
            raise
        resolved = None if found is None else found[0].step
        recorder.finish(step=resolved)
        return resolved

    def latest(self) -> int | None:
        """The step of the newest good committed checkpoint (damaged ones skipped, each
        named in a WARNING), or ``None``. The coordinator reads the ``s3ckpt.latest.json``
        pointer and trusts it only if the marker it names is good; else it lists the run.
        Other ranks receive the answer by broadcast (call it on every rank). A checkpoint's
        URL raises ConfigError."""
        self._check_open()
        self._saves.settle(self.on_busy)  # the upload thread may be using the process group
        chain = self._latest.candidates(self.retention_grace)
        found = load_newest_good(chain, lambda c: None, fallback=True, run=self.url)
        return None if found is None else found[0].step

    def list(self) -> list[CheckpointInfo]:
        """Every checkpoint under the run (committed, in progress, abandoned), oldest first.
        Local call: lists the bucket from whichever rank calls it."""
        return list_checkpoints(self.location, options=RetentionOptions(grace=self.retention_grace))

    def attach_metrics(self, step: int, metrics: Mapping[str, SupportsFloat]) -> None:
        """Merge ``metrics`` into the commit marker of ``step`` (evals often finish later).

        Waits for that step's save if it is still in flight. The marker is rewritten with
        a conditional put (If-Match on its ETag), so a concurrent pruner or writer is never
        overwritten. Call it on the coordinator (it does nothing on other ranks).

        Raises:
            CheckpointNotFoundError: ``step`` has no commit marker.
            ConditionalWritesError: The store ignores If-Match (and single-writer mode is off).
            PreconditionFailedError: The marker changed meanwhile (an overwrite, a pruner).

        Request cost: HEAD + GET + PUT (and the capability probe, once per process).
        """
        self._check_open()
        new_metrics = check_metrics(metrics)
        if self._saves.inflight is not None and self._saves.inflight.step == step:
            self._saves.settle(self.on_busy)
        if not self.is_coordinator:
            return
        key, what = self._step_url(step).key(MANIFEST_NAME), f"step {step} at {self.url}"
        if (info := self.store.head(key)) is None:
            raise CheckpointNotFoundError(
                f"no committed checkpoint for {what}: cannot attach metrics; save it first",
                bucket=self.store.bucket,
                key=key,
            )
        single_writer = self.s3_config.single_writer or None
        require_conditional_writes(
            self.store, key, what=f"attach_metrics to {what}", single_writer=single_writer
        )
        manifest = Manifest.from_json(self.store.get(key))
        body = replace(manifest, metrics={**manifest.metrics, **new_metrics}).to_json()
        try:
            self.store.put(key, body, if_match=info.etag)
        except (PreconditionFailedError, TransientStoreError):
            # The reply may have been lost after S3 applied the PUT (a retry then sees a 412
            # from our own write): the marker holding exactly our body means it did.
            with contextlib.suppress(S3CkptError):
                if self.store.get(key) == body:
                    return
            raise

    def wait(self) -> None:
        """Block until the save in flight (if any) commits, and retention after it has run.

        Raises the error of a failed async save (once).
        """
        self._saves.settle(self.on_busy)
        self._retention.wait()

    def close(self) -> None:
        """Wait for pending saves and retention, then release threads and staging memory."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._saves.close()
            self._retention.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this Checkpointer is closed")

    def _step_url(self, step: int) -> StoreURL:
        return self.url.child(checkpoint_name(step))

    def _start(self, step: int, state: tuple[Any, ...], metrics: Any, blocking: bool) -> SaveHandle:
        """``save`` (``blocking``) or ``async_save`` of (model, optimizer, train state)."""
        self._check_open()
        # The operation's clock starts first, so the time it held training (from t0, which
        # counts waiting for the previous save too) is never longer than the operation.
        recorder = self._recorder("save", step)
        t0 = time.perf_counter()
        self._saves.settle(self.on_busy)
        handle = SaveHandle(step=step, url=str(self._step_url(step)))
        try:
            with instrument.bound(recorder):
                sd = collect_state_dict(*state)
                # Constructing the writer checks the location now (CheckpointExistsError, a
                # missing bucket, bad credentials) so those raise here, not on the handle.
                writer = self._writer(step, metrics)
        except BaseException as exc:
            recorder.finish(exc, blocked_s=time.perf_counter() - t0)
            raise
        self._saves.start(handle, sd, writer, t0, recorder, blocking=blocking)
        return handle

    def _recorder(self, kind: Literal["save", "load"], step: int | None) -> instrument.Recorder:
        """A save's or load's metrics (published by the caller, or the upload thread)."""
        url = self._step_url(step) if step is not None else self.url
        return instrument.Recorder(kind, str(url), step=step, rank=self._ranks.rank)

    def _writer(self, step: int, metrics: Mapping[str, SupportsFloat] | None) -> S3StorageWriter:
        self._latest.check_run_url()  # a checkpoint's URL: no checkpoints nested inside it
        return S3StorageWriter(
            self.location.child(checkpoint_name(step)),
            step=step,
            metrics=check_metrics(metrics),
            prefix_strategy=self.prefix_strategy,
        )

    def _committed(self, step: int) -> None:
        """After each commit: a retention pass (on the coordinator, with a policy)."""
        if self.policy is not None and self.is_coordinator:
            self._retention.schedule(self.policy, self.retention_grace, step)
