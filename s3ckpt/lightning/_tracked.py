"""What ``ModelCheckpoint`` tracks, read from the checkpoint dicts the plug-in saves.

Lightning puts every callback's state into the checkpoint it saves, and a
``ModelCheckpoint`` updates its tracking (``best_k_models``, ``best_model_path``,
``kth_best_model_path``, ``last_model_path``) *before* it saves, so the dict being saved
holds the tracking state after that save. :class:`Tracking` keeps the latest such state
per callback (by its state key); the union is what no retention policy of the plug-in may
delete (:class:`KeepTracked`), and what a deferred ``remove_checkpoint`` waits to see
untracked (:mod:`s3ckpt.lightning._async`).

A checkpoint saved with ``save_weights_only=True`` carries no callback states: it leaves
the tracking as it was.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from s3ckpt.lightning._common import log
from s3ckpt.retention import CheckpointInfo, Policy
from s3ckpt.uri import StoreURL, parse_url

__all__ = ["KeepTracked", "Tracking", "path_key"]

_PATH_FIELDS = ("best_model_path", "kth_best_model_path", "last_model_path")


def path_key(path: Any) -> str:
    """One spelling per checkpoint URL (``s3://b/run/x.ckpt`` and ``.../x.ckpt/`` agree)."""
    text = str(path)
    try:
        return str(parse_url(text))
    except Exception:  # not a URL s3ckpt reads: compare it as written
        return text


def tracked_by_callbacks(checkpoint: Mapping[str, Any]) -> dict[str, frozenset[str]]:
    """Each ``ModelCheckpoint`` state in ``checkpoint["callbacks"]``: its state key ->
    the paths it tracks (as :func:`path_key` spells them). Other callbacks are skipped."""
    out: dict[str, frozenset[str]] = {}
    callbacks = checkpoint.get("callbacks")
    if not isinstance(callbacks, Mapping):
        return out
    for key, state in callbacks.items():
        if not isinstance(state, Mapping) or not isinstance(state.get("best_k_models"), Mapping):
            continue
        paths: list[Any] = list(state["best_k_models"])
        paths += [state.get(name) for name in _PATH_FIELDS]
        out[str(key)] = frozenset(path_key(p) for p in paths if isinstance(p, str) and p)
    return out


class Tracking:
    """The latest tracking state of every ``ModelCheckpoint`` seen in a saved checkpoint.

    Thread-safe: saves (AsyncCheckpointIO's worker) update it while
    ``remove_checkpoint`` (the training thread) reads it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_callback: dict[str, frozenset[str]] = {}
        self._warned = False

    def update(self, checkpoint: Mapping[str, Any]) -> None:
        """Take the callback states of a checkpoint being saved (replacing each callback's
        earlier state; callbacks it does not carry keep theirs)."""
        states = tracked_by_callbacks(checkpoint)
        if states:
            with self._lock:
                self._by_callback.update(states)

    @property
    def known(self) -> bool:
        """Whether any saved checkpoint carried a ``ModelCheckpoint`` state."""
        with self._lock:
            return bool(self._by_callback)

    def warn_if_unknown(self, run: StoreURL) -> None:
        """Warn once when a policy is about to run and no checkpoint saved so far carried
        a ``ModelCheckpoint`` state: there is nothing to protect it from the policy."""
        with self._lock:
            if self._by_callback or self._warned:
                return
            self._warned = True
        log.warning(
            "s3ckpt: the checkpoints saved to %s carry no ModelCheckpoint state "
            "(save_weights_only=True, or no ModelCheckpoint), so the retention policy cannot "
            "tell what ModelCheckpoint tracks and does not protect it (nor rank by its "
            "metric): let save_top_k prune alone (policy=None)",
            run,
        )

    def paths(self) -> frozenset[str]:
        """Every path some ``ModelCheckpoint`` tracks (its latest state), as :func:`path_key`
        spells them."""
        with self._lock:
            return frozenset().union(*self._by_callback.values())

    def tracks(self, path: Any) -> bool:
        """Whether some ``ModelCheckpoint``'s latest state tracks ``path``."""
        return path_key(path) in self.paths()

    def names_in(self, run: StoreURL) -> frozenset[str]:
        """The tracked checkpoints that live directly in ``run``, by name."""
        out = set()
        for path in self.paths():
            try:
                url = parse_url(path)
            except Exception:
                continue
            if url.parent == run and url.name:
                out.add(url.name)
        return frozenset(out)


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


def protect(policy: Policy, names: Iterable[str]) -> Policy:
    """``policy``, plus :class:`KeepTracked` for ``names`` when there are any."""
    chosen = frozenset(names)
    return policy | KeepTracked(chosen) if chosen else policy
