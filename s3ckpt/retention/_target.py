"""Where a retention call acts: one :class:`~s3ckpt.store.Location`, or the ``(store, url)``
pair of earlier releases.

The entry points that act on a place (``prune``, ``prune_runs``, ``gc``,
``delete_checkpoint``, ``scan``, ``list_checkpoints``, ``list_runs``) take it first:
a Location, or anything :meth:`Location.of <s3ckpt.store.Location.of>` opens (a URL string,
a :class:`~s3ckpt.uri.StoreURL`) from the process's one store cache. The pair it took before,
a store and a URL in that store, still works in the same place::

    prune("s3://bucket/runs/llama/", KeepLast(3))            # a Location, opened once
    prune(store, StoreURL("s3", "bucket", "runs/llama/"), KeepLast(3))   # as before

Either way the entry point makes one Location at its top, and only that goes down.
"""

from __future__ import annotations

import os

from s3ckpt.retention._policy import Policy
from s3ckpt.retention._toml import PolicyFile
from s3ckpt.store import Location, LocationLike
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["locate", "locate_policy"]

_LOCATION_LIKE = (Location, str, os.PathLike, StoreURL)


def locate(caller: str, where: LocationLike | ObjectStore, url: StoreURL | str | None) -> Location:
    """``caller``'s first arguments as one Location: ``where`` alone (a Location or a URL), or
    a store ``where`` and a ``url`` in it.

    Raises:
        TypeError: A store without a URL, or a URL and then a second one.
        InvalidURLError: A URL string that is not one.
    """
    if url is None:
        if isinstance(where, _LOCATION_LIKE):
            return Location.of(where)
        raise TypeError(
            f"{caller}() got a {type(where).__name__} without a URL: pass a Location (or a "
            "URL), or a store and a URL in it"
        )
    if isinstance(where, _LOCATION_LIKE):
        raise TypeError(
            f"{caller}() got a location and then a URL: pass a Location (or a URL), or a "
            "store and a URL in it"
        )
    return Location.of(url, store=where)


def locate_policy(
    caller: str,
    where: LocationLike | ObjectStore,
    second: StoreURL | str | Policy | PolicyFile,
    third: Policy | PolicyFile | None,
) -> tuple[Location, Policy | PolicyFile]:
    """``(location, policy)`` or ``(store, url, policy)``, ``prune``'s first arguments, as
    the Location and the policy.

    Raises:
        TypeError: Not one of those shapes.
    """
    if third is None:
        if isinstance(second, (StoreURL, str)):
            raise TypeError(f"{caller}() missing the policy after the location")
        return locate(caller, where, None), second
    if not isinstance(second, (StoreURL, str)):
        raise TypeError(f"{caller}() got a policy where the store's URL goes, then another")
    return locate(caller, where, second), third
