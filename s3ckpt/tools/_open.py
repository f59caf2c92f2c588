"""One :class:`~s3ckpt.store.Location` per location argument of a tool, opened at its entry.

Every public tool (inspect, verify, diff, export, import, doctor, check, restore) turns each
of its location arguments into a Location at its top with :func:`as_location`, folding its
``s3_config=`` / ``transfer_config=`` / ``store=`` keywords into that one call; below the
entry point only Locations travel.

* A tool of one location (inspect, verify, doctor): :meth:`Location.of`'s rules, so
  settings given beside a Location are refused.
* A tool of several (diff, export, import: ``among=True``): a Location argument is used as
  it is and the settings open the URL arguments (``s3ckpt import`` passes its source as
  text and its destination as a Location); a URL in the scheme and bucket of ``near`` (the
  command's first location) shares its store (one client and connection pool for both).

No torch here: ``s3ckpt doctor`` runs without it.
"""

from __future__ import annotations

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.store import Location, ObjectStore
from s3ckpt.store._location import LocationLike
from s3ckpt.uri import parse_location

__all__ = ["as_location"]


def as_location(
    target: LocationLike,
    *,
    among: bool = False,
    near: Location | None = None,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    store: ObjectStore | None = None,
) -> Location:
    """``target`` as a Location (see the module): a URL, a local path (as a ``file://``
    URL) or a :class:`~s3ckpt.uri.StoreURL` is parsed once and opened in ``store`` when
    given, else in ``near``'s store when in its bucket, else in the process's shared store
    for these settings.

    Raises:
        InvalidURLError: ``target`` is not a URL or path s3ckpt can use.
        ConfigError: ``target`` is a Location, settings were given too and not ``among``.
    """
    if isinstance(target, Location):
        if among:
            return target
    else:
        target = parse_location(target)
        here = (target.scheme, target.bucket)
        if near is not None and store is None and here == (near.url.scheme, near.url.bucket):
            return near.at(target)
    return Location.of(target, s3_config=s3_config, transfer_config=transfer_config, store=store)
