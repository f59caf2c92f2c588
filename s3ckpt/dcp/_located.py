"""Where a DCP writer or reader points: one :class:`~s3ckpt.store.Location`, torch's
``reset`` / ``validate_checkpoint_id`` over it, and the save or load it takes part in.

The writer and the reader hold their place as one Location (URL, store, settings) and
read everything else from it (:class:`~s3ckpt.store.AtLocation`: ``url``, ``store``,
``s3_config``, ``transfer_config``; and ``checkpoint_id`` here), so no copy of a setting
can drift from the store's.

Metrics (:mod:`s3ckpt.metrics`): a save or load begins where the writer or reader is
pointed (:meth:`Located._open`: construction, ``reset``) and each DCP callback decorated
with :func:`reported` runs as a step of it, so the requests it makes count for it on
torch's threads too; the callbacks themselves record nothing. It is the Checkpointer's
operation when one is current (its owner publishes the event), else the writer's or
reader's own, published when a step ``ends`` it or fails.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from s3ckpt.metrics.instrument import Participant
from s3ckpt.store import Location
from s3ckpt.store._location import AtLocation, LocationLike

__all__ = ["Located", "reported"]

F = TypeVar("F", bound=Callable[..., Any])


def reported(ends: Callable[[Any], bool] = lambda _: False) -> Callable[[F], F]:
    """Run a DCP callback as a step of the save or load begun by :meth:`Located._open`;
    a failure ends it, and so does a step for which ``ends(self)`` is true."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def step(self: Located, *args: Any, **kwargs: Any) -> Any:
            with self._report.active(self._end_metrics):
                out = method(self, *args, **kwargs)
            if ends(self):
                self._end_metrics()
            return out

        return cast(F, step)

    return wrap


class Located(AtLocation):
    """A DCP storage writer's or reader's location, and what torch asks of it.

    Subclasses set :attr:`location` in :meth:`_point` (a new place: the writer checks its
    marker, the reader reads its metadata) and start a new save or load at the same place
    in :meth:`_restart`.
    """

    _report: Participant
    rank: int
    step: int | None = None

    @property
    def checkpoint_id(self) -> str:
        """The location as a URL string, with its trailing slash (what ``.metadata``
        records)."""
        return str(self.location.url)

    def prepare_local_plan(self, plan: Any) -> Any:
        """No storage-specific local planning (a save's or a load's plan)."""
        return plan

    def _point(self, location: Location) -> None: ...

    def _restart(self) -> None: ...

    def _open(self, location: Location | None) -> None:
        """Begin a save or load at ``location`` (:meth:`_point`) or, given None, at the
        same place (:meth:`_restart`)."""
        self._report.begin(str((location or self.location).url), step=self.step, rank=self.rank)
        with self._report.active(self._end_metrics):
            if location is None:
                self._restart()
            else:
                self._point(location)

    def _moved(self) -> int:
        """Data bytes the save or load moved so far (its event's ``bytes``)."""
        raise NotImplementedError

    def _end_metrics(self, error: BaseException | None = None) -> None:
        manifest = getattr(self, "manifest", None)  # a reader's: the step it loads
        fields = {} if manifest is None else {"step": manifest.step}
        self._report.end(error, moved=self._moved(), rank=self.rank, **fields)

    def reset(self, checkpoint_id: LocationLike | None = None) -> None:
        """Start anew, optionally at another location.

        ``checkpoint_id`` is compared with the current location parsed (a missing trailing
        slash, ``s3a://`` or a :class:`~s3ckpt.uri.StoreURL` name the same place): the
        same location keeps the store and reads nothing; another one in the same bucket
        keeps the store (:meth:`Location.at`), one elsewhere is opened with the same
        settings.
        """
        target = None if checkpoint_id is None else self.location.at(checkpoint_id)
        self._open(None if target == self.location else target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: LocationLike) -> bool:
        """True for ``s3://`` URLs (and Locations of them)."""
        return str(checkpoint_id).startswith(("s3://", "s3a://"))
