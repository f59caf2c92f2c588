"""One :class:`~s3ckpt.store.Location` per location argument of a tool, opened at its entry.

Every public tool (inspect, verify, diff, export, import, doctor) turns each of its location
arguments into a Location at its top, folding its ``s3_config=`` / ``transfer_config=`` /
``store=`` keywords into that one call; below the entry point only Locations travel.

* A tool of one location (inspect, verify, doctor) uses :func:`as_location`:
  :meth:`Location.of`'s rules, so settings given beside a Location are refused.
* A tool of several (diff, export, import) uses :func:`as_location_among`: a Location
  argument is used as it is and the settings open the URL arguments (``s3ckpt import``
  passes its source as text and its destination as a Location); a URL in the bucket of the
  command's first location shares its store (one client and connection pool for both).

No torch here: ``s3ckpt doctor`` runs without it.
"""

from __future__ import annotations

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.store import Location, LocationLike, ObjectStore
from s3ckpt.uri import parse_location

__all__ = ["as_location", "as_location_among"]


def as_location(
    target: LocationLike,
    *,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    store: ObjectStore | None = None,
) -> Location:
    """``target`` as a Location: a Location passes through; a URL, a local path (as a
    ``file://`` URL) or a :class:`~s3ckpt.uri.StoreURL` is parsed once and opened in
    ``store`` when given, else in the process's shared store for these settings.

    Raises:
        InvalidURLError: ``target`` is not a URL or path s3ckpt can use.
        ConfigError: ``target`` is a Location and settings were given too.
    """
    if not isinstance(target, Location):
        target = parse_location(target)
    return Location.of(target, s3_config=s3_config, transfer_config=transfer_config, store=store)


def as_location_among(
    target: LocationLike,
    *,
    near: Location | None = None,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    store: ObjectStore | None = None,
) -> Location:
    """One location of a tool that takes several: a Location as it is (it carries its own
    store; the settings are for the URL arguments); a URL or path in ``near``'s scheme and
    bucket in ``near``'s store, unless ``store`` is given; else :func:`as_location`.

    Raises:
        InvalidURLError: ``target`` is not a URL or path s3ckpt can use.
    """
    if isinstance(target, Location):
        return target
    url = parse_location(target)
    same = near is not None and (url.scheme, url.bucket) == (near.url.scheme, near.url.bucket)
    if same and store is None:
        assert near is not None
        return near.at(url)
    return Location.of(url, s3_config=s3_config, transfer_config=transfer_config, store=store)
