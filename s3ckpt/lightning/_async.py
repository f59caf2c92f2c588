"""``remove_checkpoint`` carried out when it is safe, and Lightning's ``AsyncCheckpointIO``.

``AsyncCheckpointIO(S3CheckpointIO())`` saves on a one-thread executor: ``save_checkpoint``
only queues the save, while ``remove_checkpoint`` runs at once on the training thread. So
``save_top_k`` asks to remove a checkpoint whose save is still queued or uploading; deleted
then (or refused: nothing committed yet, or it is the run's newest), its save would commit
afterwards and stay for good. The plug-in cannot see the wrapper's queue. What it sees:

* the saves that have reached it (in the order they were requested: the executor has one
  thread), which ones are uploading now, and the checkpoint dict of each;
* in each dict, every ``ModelCheckpoint``'s tracking state *as it was when the save was
  requested* (the wrapper copies the dict on the training thread), and a ``ModelCheckpoint``
  stops tracking a path before it asks to remove it.

So a removal is not carried out at once; it is remembered (:class:`Removals`) and carried
out at the first moment when all of these hold: no save of that path is uploading, and no
``ModelCheckpoint`` tracks the path in the latest state the plug-in has seen. Until the save
that displaced it has reached the plug-in, its latest state still tracks the path, so every
save of the path requested before the removal has committed by then. A save of the path
requested *after* the removal tracks it again, and is not deleted (Lightning asks again when
it drops it). Where no state is known (``save_weights_only=True`` saves carry none), the
removal applies to what is committed at the path, and to the path's next save that commits.

A removal is retried after each later commit, and at teardown, while it is refused for a
reason that passes: the checkpoint is the run's newest (``delete_checkpoint`` never deletes
that), a save is writing it, a pruner holds the run's lease. A removal that found nothing
(its save is still queued) waits for a save of that path. At most
:data:`MAX_PENDING_REMOVALS` are remembered (the oldest is dropped with a warning), and
teardown forgets what it could not carry out (with a warning; retention is the backstop).
On the thread that asked for a removal, a later save of the same path (a synchronous plug-in
re-saving that name) cancels it: that save was requested after the removal.

Lightning's ``AsyncCheckpointIO.teardown`` does not call the wrapped plug-in's teardown;
:func:`install_async_teardown` makes it do so for the s3ckpt plug-in, so the last removals
and retention passes run when ``fit`` ends.

What ``ModelCheckpoint`` tracks (:meth:`Removals.protect`, :class:`KeepTracked`), read
from the checkpoint dicts the plug-in saves.

Lightning puts every callback's state into the checkpoint it saves, and a
``ModelCheckpoint`` updates its tracking (``best_k_models``, ``best_model_path``,
``kth_best_model_path``, ``last_model_path``) *before* it saves, so the dict being saved
holds the tracking state after that save. :class:`Removals` keeps the latest such state
per callback (by its state key); the union is what no retention policy of the plug-in may
delete (:class:`KeepTracked`), and what a deferred ``remove_checkpoint`` waits to see
untracked.

A checkpoint saved with ``save_weights_only=True`` carries no callback states: it leaves
the tracking as it was.

Also helpers the Lightning plug-in's modules share: remote paths, the metrics a save
records, ``map_location`` for loaded tensors, and which settings open a bucket's store
when no plug-in is at hand.

``MyModule.load_from_checkpoint("s3://...")``, the fsspec file system and
``ckpt_path="last"`` without a trainer plug-in open stores with no :class:`S3CheckpointIO`
to ask. They take the settings from a registry, in this order: the settings of the plug-in
that last opened that bucket (scheme and bucket) in this process (a save, load or removal
registers them); else those of the last :class:`S3CheckpointIO` constructed (a
``ModelCheckpoint`` lists its folder before the first save); else the environment's
(``S3Config()``: ``AWS_ENDPOINT_URL``, profile, region). Every store comes from
:meth:`s3ckpt.store.Location.of`, the one process-wide cache: a plug-in and the hook with
the same settings share one store. Nothing here runs at import.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import torch
from fsspec.core import split_protocol

from s3ckpt._plugin_common import patch_once
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import (
    CheckpointNotFoundError,
    DeleteRefusedError,
    LeaseHeldError,
    ObjectNotFoundError,
)
from s3ckpt.retention import CheckpointInfo, Policy
from s3ckpt.store import Location
from s3ckpt.uri import StoreURL, parse_url

log = logging.getLogger("s3ckpt.lightning")

# Keys of a sharded checkpoint: the model's and optimizers' DTensor state dicts as DCP
# saves them, and everything else Lightning saves, packed (s3ckpt.tools.packing), under
# this key.
_REST = "lightning"


def _is_remote(path: Any) -> bool:
    return split_protocol(str(path))[0] not in (None, "file", "local")


def _metrics_of(checkpoint: Mapping[str, Any]) -> dict[str, float]:
    """Each ModelCheckpoint's monitored value at this save, by its metric name."""
    out: dict[str, float] = {}
    callbacks = checkpoint.get("callbacks")
    for state in callbacks.values() if isinstance(callbacks, Mapping) else ():
        if isinstance(state, Mapping) and isinstance(state.get("monitor"), str):
            with contextlib.suppress(TypeError, ValueError):
                value = float(state.get("current_score"))  # type: ignore[arg-type]
                if math.isfinite(value):
                    out[state["monitor"]] = value
    return out


def _to_device(obj: Any, map_location: Any) -> Any:
    """``obj`` (a checkpoint read into CPU memory) with its tensors placed as torch.load's
    ``map_location`` would place tensors saved on the CPU: a device (``str``, ``int`` or
    :class:`torch.device`); a dict, by its ``"cpu"`` entry; a function, called as
    ``fn(storage, "cpu")`` (Lightning's default keeps CPU tensors where they are).
    A DCP checkpoint does not record the device a tensor was saved from, so ``"cpu"`` is
    the only source location a mapping can name."""
    if isinstance(map_location, dict):
        map_location = map_location.get("cpu")
    if map_location is None:
        return obj
    device = None if callable(map_location) else torch.device(map_location)

    def place(t: torch.Tensor) -> torch.Tensor:
        if device is not None:
            return t.to(device)
        moved = map_location(t.untyped_storage(), "cpu")
        return t if moved is None or moved.device == t.device else t.to(moved.device)

    return _map_tensors(obj, place)


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with ``fn`` applied to every tensor; containers keep their type (an
    ``OrderedDict`` its ``_metadata``)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        out = type(obj)() if type(obj) in (dict, OrderedDict) else {}
        out.update((k, _map_tensors(v, fn)) for k, v in obj.items())
        if isinstance(out, OrderedDict) and hasattr(obj, "_metadata"):
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if isinstance(obj, (list, tuple)):
        mapped = [_map_tensors(v, fn) for v in obj]
        return mapped if isinstance(obj, list) else tuple(mapped)
    return obj


_LOCK = threading.Lock()
# (scheme, bucket) -> the settings of the plug-in that last opened it; None -> those of the
# last plug-in constructed.
_SETTINGS: dict[tuple[str, str] | None, tuple[S3Config, TransferConfig]] = {}


def remember(s3_config: S3Config, transfer: TransferConfig, url: StoreURL | None = None) -> None:
    """Register a plug-in's settings: for ``url``'s bucket, or (``None``, at the plug-in's
    construction) as the fallback for buckets no plug-in opened."""
    with _LOCK:
        _SETTINGS[None if url is None else (url.scheme, url.bucket)] = (s3_config, transfer)


def location_for(target: str | StoreURL) -> Location:
    """``target`` opened with the settings registered for its bucket (see the module).

    Raises:
        InvalidURLError: ``target`` is not a URL s3ckpt reads.
    """
    url = target if isinstance(target, StoreURL) else parse_url(str(target))
    with _LOCK:
        found = _SETTINGS.get((url.scheme, url.bucket)) or _SETTINGS.get(None)
    s3_config, transfer_config = found or (None, None)
    return Location.of(url, s3_config=s3_config, transfer_config=transfer_config)


MAX_PENDING_REMOVALS = 1000
"""Removals :class:`Removals` remembers at most (a few hundred bytes each)."""

_TRACKED_FIELDS = ("best_model_path", "kth_best_model_path", "last_model_path")

# Refusals that pass with time: retried after the next commit. Any other refusal (pinned,
# abandoned, foreign) is final: the checkpoint stays, with a warning.
_PASSING = ("newest", "in_progress", "changed")


@dataclass
class _Pending:
    path: str
    thread: int
    gone: bool = False  # nothing there last time: wait for a save of the path
    warned: bool = False


class Removals:
    """The plug-in's ``remove_checkpoint`` requests, carried out when safe (see module).

    Also what ``ModelCheckpoint`` tracks (see the module), updated by :meth:`begin_save`:
    saves (AsyncCheckpointIO's worker) update it while ``remove_checkpoint`` (the training
    thread) reads it.

    Args:
        delete: Deletes one checkpoint (``delete_checkpoint``), raising s3ckpt's errors.
    """

    def __init__(self, delete: Callable[[str], Any]) -> None:
        self._delete = delete
        self._cond = threading.Condition()
        self._tracked: dict[str, frozenset[str]] = {}  # by the callback's state key
        self._warned = False
        self._saving: Counter[str] = Counter()  # saves uploading, by path
        self._deleting: set[str] = set()
        self._pending: OrderedDict[str, _Pending] = OrderedDict()

    @property
    def pending(self) -> tuple[str, ...]:
        """The paths whose removal is waiting, oldest first."""
        with self._cond:
            return tuple(p.path for p in self._pending.values())

    def request(self, path: Any) -> None:
        """``remove_checkpoint(path)``: carry it out now if safe, else remember it."""
        key = path_key(path)
        with self._cond:
            self._pending.pop(key, None)
            self._pending[key] = _Pending(str(path), threading.get_ident())
            while len(self._pending) > MAX_PENDING_REMOVALS:
                _, dropped = self._pending.popitem(last=False)
                log.warning(
                    "s3ckpt: more than %d removals waiting; forgot the oldest, %s (retention "
                    "or `s3ckpt rm` can delete it)",
                    MAX_PENDING_REMOVALS,
                    dropped.path,
                )
        self.flush([key])

    def begin_save(self, path: Any, checkpoint: Mapping[str, Any]) -> None:
        """A save of ``path`` starts (after any deletion of that path in flight ends)."""
        key = path_key(path)
        with self._cond:
            self._cond.wait_for(lambda: key not in self._deleting)
            self._track(checkpoint)
            pending = self._pending.get(key)
            if pending is not None and pending.thread == threading.get_ident():
                del self._pending[key]  # requested after the removal, on its thread
            elif pending is not None:
                pending.gone = False
            self._saving[key] += 1

    def end_save(self, path: Any) -> None:
        """The save of ``path`` ended (committed or failed)."""
        key = path_key(path)
        with self._cond:
            self._saving -= Counter([key])  # (a count that reaches 0 is dropped)

    def flush(self, keys: Iterable[str] | None = None, *, final: bool = False) -> None:
        """Carry out the waiting removals that are safe now (``keys``: only those).

        ``final`` (teardown, every save done): the last try; what still cannot be carried
        out is forgotten, with a warning.
        """
        with self._cond:
            chosen = [k for k in (self._pending if keys is None else keys) if k in self._pending]
            tracked = frozenset().union(*self._tracked.values())
            ready: list[tuple[str, _Pending]] = []
            for key in chosen:
                p = self._pending[key]
                if key in self._saving or key in self._deleting:
                    continue
                if key not in tracked and (final or not p.gone):
                    ready.append((key, p))
                elif final:  # tracked again after the removal, or never saved: keep it
                    del self._pending[key]
            self._deleting.update(key for key, _ in ready)
        for key, p in ready:
            done = False
            try:
                done = self._attempt(p, final)
            finally:
                with self._cond:
                    self._deleting.discard(key)
                    if done or final:
                        self._pending.pop(key, None)
                    self._cond.notify_all()

    def _attempt(self, p: _Pending, final: bool) -> bool:
        """Try one removal; True when nothing is left to do for it."""
        try:
            self._delete(p.path)
            return True
        except (CheckpointNotFoundError, ObjectNotFoundError):
            # Its save is queued (or retention pruned it first): wait for a save of it.
            log.debug("s3ckpt: nothing committed at %s yet; removing it after its save", p.path)
            p.gone = True
            return False
        except Exception as exc:  # a refusal, a busy lease, a store error: never fail training
            if isinstance(exc, DeleteRefusedError) and exc.reason not in _PASSING:
                log.warning("s3ckpt: left %s in place: %s", p.path, exc)
                return True
            if final or not p.warned:
                p.warned = True
                later = "for now (retried after the next commit)"
                where = "(retention or `s3ckpt rm` can delete it)" if final else later
                # A busy lease is often this plug-in's own retention pass: no alarm.
                quiet = isinstance(exc, LeaseHeldError) and not final
                level = logging.INFO if quiet else logging.WARNING
                log.log(level, "s3ckpt: left %s in place %s: %s", p.path, where, exc)
            return False

    def _track(self, checkpoint: Mapping[str, Any]) -> None:
        """Take the callback states of a checkpoint being saved (replacing each callback's
        earlier state; callbacks it does not carry keep theirs). A ``ModelCheckpoint``
        state is one with ``best_k_models``; its paths are spelled by :func:`path_key`."""
        callbacks = checkpoint.get("callbacks")
        for key, state in callbacks.items() if isinstance(callbacks, Mapping) else ():
            if isinstance(state, Mapping) and isinstance(state.get("best_k_models"), Mapping):
                paths = [*state["best_k_models"], *(state.get(n) for n in _TRACKED_FIELDS)]
                self._tracked[str(key)] = frozenset(
                    path_key(p) for p in paths if isinstance(p, str) and p
                )

    def protect(self, policy: Policy, run: StoreURL) -> Policy:
        """``policy`` plus :class:`KeepTracked` for the tracked checkpoints directly in
        ``run``. Warns once when no checkpoint saved so far carried a ``ModelCheckpoint``
        state: there is nothing to protect then."""
        with self._cond:
            tracked = frozenset().union(*self._tracked.values())
            unknown, self._warned = not self._tracked and not self._warned, True
        if unknown:
            log.warning(
                "s3ckpt: the checkpoints saved to %s carry no ModelCheckpoint state "
                "(save_weights_only=True, or no ModelCheckpoint), so the retention policy "
                "cannot tell what ModelCheckpoint tracks and does not protect it (nor rank by "
                "its metric): let save_top_k prune alone (policy=None)",
                run,
            )
        names = set()
        for path in tracked:
            with contextlib.suppress(Exception):
                url = parse_url(path)
                if url.parent == run and url.name:
                    names.add(url.name)
        return policy | KeepTracked(frozenset(names)) if names else policy


def install_async_teardown() -> None:
    """Make ``AsyncCheckpointIO.teardown`` also tear the wrapped s3ckpt plug-in down (after
    its executor has finished every queued save). Idempotent; other plug-ins unchanged."""
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    @patch_once(AsyncCheckpointIO, "teardown")
    def teardown(original: Callable[[AsyncCheckpointIO], None], self: AsyncCheckpointIO) -> None:
        try:
            original(self)
        finally:
            inner = self.checkpoint_io
            if getattr(inner, "_s3ckpt_plugin", False):
                inner.teardown()


def path_key(path: Any) -> str:
    """One spelling per checkpoint URL (``s3://b/run/x.ckpt`` and ``.../x.ckpt/`` agree)."""
    text = str(path)
    try:
        return str(parse_url(text))
    except Exception:  # not a URL s3ckpt reads: compare it as written
        return text


@dataclass(frozen=True)
class KeepTracked(Policy):
    """Keep the checkpoints ``ModelCheckpoint`` tracks (``names``, in the run pruned).

    The plug-in adds this rule to every policy it runs (``policy | KeepTracked(...)``), so
    that no policy deletes a checkpoint ``best_k_models``, ``best_model_path``,
    ``kth_best_model_path`` or ``last_model_path`` names. Reason ``tracked by
    ModelCheckpoint``. Hereditary, like every rule: a fixed set of names.
    """

    names: frozenset[str]

    def select(
        self, checkpoints: Sequence[CheckpointInfo], now: datetime
    ) -> dict[str, tuple[str, ...]]:
        reason = ("tracked by ModelCheckpoint",)
        return {c.name: reason for c in checkpoints if c.name in self.names}

    def describe(self) -> str:
        return f"tracked by ModelCheckpoint ({len(self.names)})"
