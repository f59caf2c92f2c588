"""Where a DCP writer or reader points: one :class:`~s3ckpt.store.Location`, and torch's
``reset`` / ``validate_checkpoint_id`` over it, shared by both.

The writer and the reader hold their place as one Location (URL, store, settings) and
read everything else from it (:class:`~s3ckpt.store.AtLocation`: ``url``, ``store``,
``s3_config``, ``transfer_config``; and ``checkpoint_id`` here), so no copy of a setting
can drift from the store's.
"""

from __future__ import annotations

from s3ckpt.store import AtLocation, Location, LocationLike

__all__ = ["Located"]


class Located(AtLocation):
    """A DCP storage writer's or reader's location, and what torch asks of it.

    Subclasses set :attr:`location` in :meth:`_point` (a new place: the writer checks its
    marker, the reader reads its metadata) and start a new save or load at the same place
    in :meth:`_restart`.
    """

    @property
    def checkpoint_id(self) -> str:
        """The location as a URL string, with its trailing slash (what ``.metadata``
        records)."""
        return str(self.location.url)

    def _point(self, location: Location) -> None:
        raise NotImplementedError

    def _restart(self) -> None:
        raise NotImplementedError

    def reset(self, checkpoint_id: LocationLike | None = None) -> None:
        """Start anew, optionally at another location.

        ``checkpoint_id`` is compared with the current location parsed (a missing trailing
        slash, ``s3a://`` or a :class:`~s3ckpt.uri.StoreURL` name the same place): the
        same location keeps the store and reads nothing; another one in the same bucket
        keeps the store (:meth:`Location.at`), one elsewhere is opened with the same
        settings.
        """
        if checkpoint_id is not None:
            target = self.location.at(checkpoint_id)
            if target != self.location:
                self._point(target)
                return
        self._restart()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: LocationLike) -> bool:
        """True for ``s3://`` URLs (and Locations of them)."""
        return str(checkpoint_id).startswith(("s3://", "s3a://"))
