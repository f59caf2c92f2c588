"""``Checkpointer``: what a training loop touches.

::

    ckpt = Checkpointer("s3://bucket/runs/llama", policy="policies/pretraining.toml")
    start = ckpt.load(model, optimizer, train_state) or 0      # None: nothing to resume
    for step in range(start + 1, total + 1):
        ...
        if step % 100 == 0:
            handle = ckpt.async_save(step, model, optimizer, train_state)
            handle.staged.result()      # before the next optimizer.step() mutates parameters
    ckpt.close()                        # waits for the last save

Layout under the run prefix ``path``::

    step_000000100/             one DCP checkpoint (S3StorageWriter), committed by s3ckpt.json
    step_000000200/
    s3ckpt.latest.json          pointer to the newest commit, written after each commit

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

Retention (``policy``) runs only after a checkpoint commits, on the coordinator, in a
background thread; its failures are logged and kept in :attr:`Checkpointer.last_retention`
but never fail training.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.dcp.writer import S3StorageWriter
from s3ckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    PreconditionFailedError,
    S3CkptError,
    SaveInProgressError,
    TransientStoreError,
    find_s3ckpt_error,
)
from s3ckpt.format import MANIFEST_NAME, Manifest, check_metrics
from s3ckpt.retention import DEFAULT_GRACE, LATEST_NAME
from s3ckpt.store import ObjectStore, open_store
from s3ckpt.uri import StoreURL

if TYPE_CHECKING:
    from s3ckpt.retention import CheckpointInfo, Policy, PruneResult

__all__ = ["LATEST_NAME", "Checkpointer", "SaveHandle", "checkpoint_name"]

log = logging.getLogger("s3ckpt")



_STEP_NAME = re.compile(r"step_(\d+)")


def checkpoint_name(step: int) -> str:
    """The sub-prefix of a run that holds ``step``'s checkpoint: ``step_000001000``.

    Nine digits sort correctly up to a billion steps; larger steps still parse.
    """
    if step < 0:
        raise ConfigError(f"step must be >= 0, got {step}")
    return f"step_{step:09d}"


@dataclass
class SaveHandle:
    """One save in flight (or done).

    Attributes:
        step: The step being saved.
        url: The checkpoint's URL (``s3://bucket/run/step_000000100``).
        staged: Resolves (to ``None``) when the state has been copied: training may modify
            parameters and optimizer state again.
        committed: Resolves (to ``None``) when ``s3ckpt.json`` is written and the
            checkpoint is durable; holds the exception if the save failed.
        blocked_seconds: Time from the call until ``staged`` resolved, including any wait
            for the previous save to commit: the longest the training loop is held up if it
            waits for ``staged`` before its next optimizer step (set once staged; for a
            synchronous save, the whole save).
        call_seconds: Time the ``async_save`` call itself took before returning.
        commit_seconds: Time from the call until ``committed`` resolved (set once committed).
    """

    step: int
    url: str
    staged: Future[None] = field(default_factory=Future)
    committed: Future[None] = field(default_factory=Future)
    blocked_seconds: float | None = None
    call_seconds: float | None = None
    commit_seconds: float | None = None

    def wait(self, timeout: float | None = None) -> None:
        """Block until committed; raise the save's error if it failed."""
        self.committed.result(timeout)

    def done(self) -> bool:
        """Whether the save has finished (committed or failed)."""
        return self.committed.done()


class Checkpointer:
    """Save, async-save and resume training state in an S3 run prefix, with retention.

    Args:
        path: The run prefix, e.g. ``s3://bucket/runs/llama-8b`` (any URL the store
            accepts; ``s3://`` uses boto3).
        policy: A retention policy (a :class:`s3ckpt.retention.Policy`, or the path of a
            TOML policy file) applied after each commit; ``None`` keeps everything.
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
    """

    def __init__(
        self,
        path: str,
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
    ) -> None:
        if on_busy not in ("wait", "raise"):
            raise ConfigError(f"on_busy must be 'wait' or 'raise', got {on_busy!r}")
        self.s3_config = s3_config or S3Config()
        self.transfer_config = transfer_config or TransferConfig()
        opened, url = open_store(
            path, s3_config=self.s3_config, transfer_config=self.transfer_config
        )
        self.url: StoreURL = url
        self.store: ObjectStore = store or opened
        self.policy = _load_policy(policy)
        self.on_busy = on_busy
        self.verify_checksums = verify_checksums
        self.retention_grace = retention_grace
        self.last_retention: PruneResult | BaseException | None = None

        self._dist = dist.is_available() and dist.is_initialized()
        if self._dist and process_group is None:
            # A collective: every rank constructs its Checkpointer at the same point.
            process_group = dist.new_group(backend="gloo")
        self._pg = process_group
        self._rank = dist.get_rank(process_group) if self._dist else 0
        self._coordinator_global = dist.get_global_rank(process_group, 0) if self._dist else 0
        self.is_coordinator = self._rank == 0

        use_cuda = torch.cuda.is_available()
        self._pin = use_cuda if pin_memory is None else pin_memory
        self._stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=self._pin,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=use_cuda,
            )
        )
        self._uploads = ThreadPoolExecutor(1, thread_name_prefix="s3ckpt-upload")
        self._retention_pool = ThreadPoolExecutor(1, thread_name_prefix="s3ckpt-retention")
        self._retention_future: Future[Any] | None = None
        self._inflight: SaveHandle | None = None
        self._failed: tuple[int, BaseException] | None = None
        self._lock = threading.Lock()
        self._closed = False

    # -- public API ---------------------------------------------------------------------------
    def save(
        self,
        step: int,
        model: torch.nn.Module | list[torch.nn.Module],
        optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
        train_state: Any | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> SaveHandle:
        """Save synchronously; returns a done :class:`SaveHandle` (raises on failure)."""
        self._check_open()
        t0 = time.perf_counter()  # waiting for the previous save blocks training too
        self._settle_previous()
        handle = SaveHandle(step=step, url=str(self.url.child(checkpoint_name(step))))
        sd = self._collect(model, optimizer, train_state)
        writer = self._writer(step, metrics)
        try:
            try:
                dcp.save(sd, storage_writer=writer, process_group=self._pg)
            except BaseException as exc:
                raise _save_error(exc, step, handle.url) from exc
            self._after_commit(step)
        except BaseException as exc:
            handle.staged.set_exception(exc)
            handle.committed.set_exception(exc)
            raise
        elapsed = time.perf_counter() - t0
        handle.blocked_seconds = handle.call_seconds = handle.commit_seconds = elapsed
        handle.staged.set_result(None)
        handle.committed.set_result(None)
        log.info("s3ckpt: saved step %d to %s in %.2fs (synchronous)", step, handle.url, elapsed)
        self._schedule_retention()
        return handle

    def async_save(
        self,
        step: int,
        model: torch.nn.Module | list[torch.nn.Module],
        optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
        train_state: Any | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> SaveHandle:
        """Start a save and return as soon as staging has been started.

        Wait for ``handle.staged`` before the next step modifies parameters or optimizer
        state; ``handle.committed`` resolves when the checkpoint is durable.
        """
        self._check_open()
        t0 = time.perf_counter()  # waiting for the previous save blocks training too
        self._settle_previous()
        handle = SaveHandle(step=step, url=str(self.url.child(checkpoint_name(step))))
        sd = self._collect(model, optimizer, train_state)
        # Constructing the writer checks the location now (CheckpointExistsError, a missing
        # bucket, bad credentials) so those raise here, not later on the handle.
        writer = self._writer(step, metrics)
        staging = self._stager.stage(sd)
        assert isinstance(staging, Future)

        def on_staged(fut: Future[Any]) -> None:
            handle.blocked_seconds = time.perf_counter() - t0
            exc = fut.exception()
            if exc is not None:
                handle.staged.set_exception(exc)
            else:
                handle.staged.set_result(None)
                log.info(
                    "s3ckpt: step %d staged in %.3fs (training blocked at most this long)",
                    step,
                    handle.blocked_seconds,
                )

        staging.add_done_callback(on_staged)
        with self._lock:
            self._inflight = handle
        self._uploads.submit(self._upload, handle, staging, writer, t0)
        handle.call_seconds = time.perf_counter() - t0
        return handle

    def load(
        self,
        model: torch.nn.Module | list[torch.nn.Module],
        optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
        train_state: Any | None = None,
        step: int | Literal["latest"] = "latest",
        *,
        verify_complete: bool = False,
    ) -> int | None:
        """Restore ``model`` (and ``optimizer``, ``train_state``) from a checkpoint.

        Args:
            step: ``"latest"`` (the newest committed checkpoint) or a step number.
            verify_complete: Fill floating-point destinations with NaN before loading and
                raise :class:`~s3ckpt.errors.IncompleteRestoreError` naming every tensor
                the checkpoint did not restore.

        Returns:
            The step loaded, or ``None`` when ``step="latest"`` and the run has no
            committed checkpoint (the model is left untouched).

        Raises:
            CheckpointNotFoundError: ``step`` was a number with no committed checkpoint.
        """
        self._check_open()
        self._settle_previous()
        resolved = self._resolve(step)
        if resolved is None:
            return None
        url = self.url.child(checkpoint_name(resolved))
        sd = self._collect(model, optimizer, train_state)
        reader = S3StorageReader(
            str(url),
            s3_config=self.s3_config,
            transfer_config=self.transfer_config,
            verify_checksums=self.verify_checksums,
            store=self.store,
        )
        if verify_complete:
            from s3ckpt.tools import load_verified

            load_verified(sd, reader, process_group=self._pg)
        else:
            dcp.load(sd, storage_reader=reader, process_group=self._pg)
        self._apply(sd, model, optimizer, train_state)
        log.info("s3ckpt: loaded step %d from %s", resolved, url)
        return resolved

    def latest(self) -> int | None:
        """The step of the newest committed checkpoint, or ``None``.

        The coordinator reads the ``s3ckpt.latest.json`` pointer and trusts it only if the
        commit marker it names exists; otherwise it lists the run. Other ranks receive the
        answer by broadcast (so call it on every rank in a distributed job).
        """
        self._check_open()
        self._settle_previous()  # the upload thread may be using the same process group
        value = self._find_latest() if self.is_coordinator else None
        return self._broadcast(value)

    def list(self) -> list[CheckpointInfo]:
        """Every checkpoint under the run (committed, in progress, abandoned), oldest first.

        Local call: lists the bucket from whichever rank calls it.
        """
        from s3ckpt.retention import list_checkpoints

        return list_checkpoints(self.store, self.url, grace=self.retention_grace)

    def attach_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Merge ``metrics`` into the commit marker of ``step`` (evals often finish later).

        Waits for that step's save if it is still in flight. The marker is rewritten with
        a conditional put (If-Match on its ETag), so a concurrent pruner or writer is never
        overwritten. Call it on the coordinator (it does nothing on other ranks).
        """
        self._check_open()
        new_metrics = check_metrics(metrics)
        inflight = self._inflight
        if inflight is not None and inflight.step == step:
            self._settle_previous()
        if not self.is_coordinator:
            return
        key = self.url.child(checkpoint_name(step)).key(MANIFEST_NAME)
        info = self.store.head(key)
        if info is None:
            raise CheckpointNotFoundError(
                f"no committed checkpoint for step {step} at {self.url}: cannot attach "
                "metrics; save it first",
                bucket=self.store.bucket,
                key=key,
            )
        manifest = Manifest.from_json(self.store.get(key))
        merged = {**dict(manifest.metrics), **new_metrics}
        body = _replace_metrics(manifest, merged).to_json()
        try:
            self.store.put(key, body, if_match=info.etag)
        except (PreconditionFailedError, TransientStoreError):
            # The reply may have been lost after S3 applied the PUT (a retry then sees a
            # 412 from our own write): the marker holding exactly our body means it did.
            try:
                if self.store.get(key) == body:
                    return
            except S3CkptError:
                pass
            raise

    def wait(self) -> None:
        """Block until the save in flight (if any) commits, and retention after it has run.

        Raises the error of a failed async save (once).
        """
        self._settle_previous()
        fut = self._retention_future
        if fut is not None:
            with contextlib.suppress(Exception):
                fut.result()

    def close(self) -> None:
        """Wait for pending saves and retention, then release threads and staging memory."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._uploads.shutdown(wait=True)
            self._retention_pool.shutdown(wait=True)
            self._stager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this Checkpointer is closed")

    def _settle_previous(self) -> None:
        """Wait for (or refuse to overlap) the save in flight; raise a pending failure once."""
        handle = self._inflight
        if handle is not None and not handle.done():
            if self.on_busy == "raise":
                raise SaveInProgressError(
                    f"the save of step {handle.step} to {handle.url} is still uploading; "
                    "wait for handle.committed (or use on_busy='wait')"
                )
            with contextlib.suppress(BaseException):
                handle.committed.result()
        with self._lock:
            failed, self._failed = self._failed, None
            if handle is not None and handle.done():
                self._inflight = None
        if failed is not None:
            step, exc = failed
            log.error("s3ckpt: the async save of step %d failed: %s", step, exc)
            raise exc

    def _writer(self, step: int, metrics: Mapping[str, float] | None) -> S3StorageWriter:
        return S3StorageWriter(
            str(self.url.child(checkpoint_name(step))),
            s3_config=self.s3_config,
            transfer_config=self.transfer_config,
            step=step,
            metrics=check_metrics(metrics),
            store=self.store,
        )

    def _upload(
        self,
        handle: SaveHandle,
        staging: Future[Any],
        writer: S3StorageWriter,
        t0: float,
    ) -> None:
        try:
            staged_sd = staging.result()
            try:
                dcp.save(staged_sd, storage_writer=writer, process_group=self._pg)
            except BaseException as exc:
                raise _save_error(exc, handle.step, handle.url) from exc
            self._after_commit(handle.step)
        except BaseException as exc:
            with self._lock:
                self._failed = (handle.step, exc)
            if not handle.staged.done():
                handle.staged.set_exception(exc)
            handle.committed.set_exception(exc)
            log.error(
                "s3ckpt: async save of step %d to %s failed: %s", handle.step, handle.url, exc
            )
            return
        handle.commit_seconds = time.perf_counter() - t0
        log.info(
            "s3ckpt: committed step %d to %s in %.2fs (training blocked %.3fs)",
            handle.step,
            handle.url,
            handle.commit_seconds,
            handle.blocked_seconds or 0.0,
        )
        handle.committed.set_result(None)
        self._schedule_retention()

    def _after_commit(self, step: int) -> None:
        """Write the ``latest`` pointer (coordinator only). Never fails the save: the
        pointer is a hint that ``latest()`` verifies."""
        if not self.is_coordinator:
            return
        body = json.dumps(
            {"step": step, "checkpoint": checkpoint_name(step), "written": time.time()}
        ).encode()
        try:
            self.store.put(self.url.key(LATEST_NAME), body)
        except Exception as exc:
            log.warning("s3ckpt: could not update %s: %s", self.url.key(LATEST_NAME), exc)

    def _schedule_retention(self) -> None:
        if self.policy is None or not self.is_coordinator:
            return
        self._retention_future = self._retention_pool.submit(self._run_retention)

    def _run_retention(self) -> None:
        from s3ckpt.retention import prune

        if self.policy is None:
            return
        try:
            result = prune(
                self.store, self.url, self.policy, apply=True, grace=self.retention_grace
            )
            self.last_retention = result
        except Exception as exc:
            self.last_retention = exc
            log.warning("s3ckpt: retention on %s failed (training continues): %s", self.url, exc)

    def _resolve(self, step: int | Literal["latest"]) -> int | None:
        if step == "latest":
            return self.latest()
        if not isinstance(step, int):
            raise ConfigError(f"step must be an int or 'latest', got {step!r}")
        found: bool | None = None
        if self.is_coordinator:
            key = self.url.child(checkpoint_name(step)).key(MANIFEST_NAME)
            found = self.store.head(key) is not None
        if not self._broadcast(found):
            raise CheckpointNotFoundError(
                f"no committed checkpoint for step {step} under {self.url} "
                f"(no {checkpoint_name(step)}/{MANIFEST_NAME}); `s3ckpt ls {self.url}` lists "
                "what there is",
                bucket=self.store.bucket,
                key=self.url.child(checkpoint_name(step)).key(MANIFEST_NAME),
            )
        return step

    def _find_latest(self) -> int | None:
        """The newest committed step: the pointer is a hint, checked by one listing.

        A kill between a commit and the pointer's update leaves the pointer on an older
        step, so the run's checkpoint prefixes after the pointer's are listed (names are
        zero-padded, so "after" in key order is "newer"; ``start_after`` makes that one
        LIST request however many checkpoints the run holds) and the newest with a marker
        wins. Without a usable pointer, the whole run is listed.

        Request cost: one HEAD + GET of the pointer, one LIST, and one HEAD per candidate
        newer than the pointer (normally none) plus one for the pointer's own marker.
        """
        pointer = self._read_pointer()
        if pointer is None:
            return self._list_latest()
        after = self.url.child(checkpoint_name(pointer)).prefix
        newer: list[int] = []
        for prefix in self.store.list_prefixes(self.url.prefix, start_after=after):
            m = _STEP_NAME.fullmatch(prefix[len(self.url.prefix) :].rstrip("/"))
            if m is not None and int(m.group(1)) > pointer:
                newer.append(int(m.group(1)))
        for step in sorted(newer, reverse=True):
            if self._committed(step):
                log.info("s3ckpt: %s names step %d, but %d is committed", LATEST_NAME,
                         pointer, step)
                return step
        if self._committed(pointer):
            return pointer
        log.info("s3ckpt: %s names step %d, which is not committed; listing", LATEST_NAME,
                 pointer)
        return self._list_latest()

    def _committed(self, step: int) -> bool:
        key = self.url.child(checkpoint_name(step)).key(MANIFEST_NAME)
        return self.store.head(key) is not None

    def _list_latest(self) -> int | None:
        from s3ckpt.retention import CheckpointState, list_checkpoints

        committed = [
            c.step
            for c in list_checkpoints(self.store, self.url, grace=self.retention_grace)
            if c.state == CheckpointState.COMMITTED and c.step is not None
        ]
        return max(committed) if committed else None

    def _read_pointer(self) -> int | None:
        key = self.url.key(LATEST_NAME)
        try:
            if self.store.head(key) is None:
                return None
            data = json.loads(self.store.get(key))
            step = data["step"]
            return step if isinstance(step, int) and step >= 0 else None
        except (ValueError, KeyError, TypeError):
            log.warning("s3ckpt: ignoring malformed %s", key)
            return None

    def _broadcast(self, value: Any) -> Any:
        if not self._dist:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=self._coordinator_global, group=self._pg)
        return box[0]

    @staticmethod
    def _collect(
        model: Any, optimizer: Any, train_state: Any
    ) -> dict[str, Any]:
        opts = StateDictOptions()
        sd: dict[str, Any] = {}
        if optimizer is None:
            sd["model"] = get_model_state_dict(model, options=opts)
        else:
            sd["model"], sd["optim"] = get_state_dict(model, optimizer, options=opts)
        if train_state is not None:
            sd["train_state"] = _train_state_dict(train_state)
        return sd

    @staticmethod
    def _apply(sd: dict[str, Any], model: Any, optimizer: Any, train_state: Any) -> None:
        if optimizer is None:
            set_model_state_dict(model, sd["model"])
        else:
            set_state_dict(
                model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"]
            )
        if train_state is not None:
            train_state.load_state_dict(sd["train_state"])


def _save_error(exc: BaseException, step: int, url: str) -> BaseException:
    """DCP wraps per-rank failures in ``CheckpointException`` (a ``BaseException``): hand
    callers the s3ckpt error inside it (naming bucket, key and rank), or a
    :class:`CheckpointError` that says which save failed."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return exc
    found = find_s3ckpt_error(exc)
    if found is not None:
        return found
    if isinstance(exc, Exception) and type(exc).__name__ != "CheckpointException":
        return exc
    return CheckpointError(f"the save of step {step} to {url} failed: {exc}")


def _train_state_dict(train_state: Any) -> Any:
    fn: Callable[[], Any] | None = getattr(train_state, "state_dict", None)
    if fn is None or not callable(getattr(train_state, "load_state_dict", None)):
        raise ConfigError(
            "train_state must have state_dict() and load_state_dict() (torch's Stateful); got "
            f"{type(train_state).__name__}"
        )
    return fn()


def _load_policy(policy: Any) -> Policy | None:
    if policy is None:
        return None
    if isinstance(policy, str):
        from s3ckpt.retention import load_policy

        return load_policy(policy)
    return policy


def _replace_metrics(manifest: Manifest, metrics: dict[str, float]) -> Manifest:
    import dataclasses

    return dataclasses.replace(manifest, metrics=metrics)
