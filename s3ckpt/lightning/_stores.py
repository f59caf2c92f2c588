"""Which settings open a bucket's store when no plug-in is at hand.

``MyModule.load_from_checkpoint("s3://...")`` (:mod:`s3ckpt.lightning._load`), the fsspec
file system (:mod:`s3ckpt.lightning._fs`) and ``ckpt_path="last"`` without a trainer
plug-in (:mod:`s3ckpt.lightning._last`) open stores with no :class:`S3CheckpointIO` to ask.
They take the settings from this registry, in this order:

1. the settings of the plug-in that last opened that bucket (scheme and bucket) in this
   process: a save, load or removal through ``S3CheckpointIO(s3_config=...,
   transfer_config=...)`` registers them for its bucket;
2. else the settings of the last :class:`S3CheckpointIO` constructed in this process (a
   ``ModelCheckpoint`` lists its folder before the first save);
3. else the environment's (``S3Config()``: ``AWS_ENDPOINT_URL``, profile, region).

Every store comes from :meth:`s3ckpt.store.Location.of`, the one process-wide cache: a
plug-in and the hook with the same settings share one store (one boto3 client). Nothing
here runs at import.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.store import Location
from s3ckpt.uri import StoreURL, parse_url

__all__ = ["StoreSettings", "location_for", "remember", "settings_for"]


@dataclass(frozen=True)
class StoreSettings:
    """A plug-in's store settings (``None``: the defaults, from the environment)."""

    s3_config: S3Config | None = None
    transfer_config: TransferConfig | None = None

    def open(self, target: str | StoreURL) -> Location:
        """``target`` in the process's shared store for these settings."""
        return Location.of(target, s3_config=self.s3_config, transfer_config=self.transfer_config)


_LOCK = threading.Lock()
_BY_BUCKET: dict[tuple[str, str], StoreSettings] = {}
_LAST: list[StoreSettings] = []  # the last plug-in constructed (at most one entry)


def remember(settings: StoreSettings, url: StoreURL | None = None) -> None:
    """Register a plug-in's settings: for ``url``'s bucket, or (``None``, at the plug-in's
    construction) as the fallback for buckets no plug-in opened."""
    with _LOCK:
        if url is None:
            _LAST[:] = [settings]
        else:
            _BY_BUCKET[(url.scheme, url.bucket)] = settings


def settings_for(url: StoreURL) -> StoreSettings:
    """The settings that open ``url``'s bucket (see the module for the order)."""
    with _LOCK:
        found = _BY_BUCKET.get((url.scheme, url.bucket))
        if found is None and _LAST:
            found = _LAST[0]
    return found if found is not None else StoreSettings()


def location_for(target: str | StoreURL) -> Location:
    """``target`` opened with the settings registered for its bucket.

    Raises:
        InvalidURLError: ``target`` is not a URL s3ckpt reads.
    """
    url = target if isinstance(target, StoreURL) else parse_url(str(target))
    return settings_for(url).open(url)
