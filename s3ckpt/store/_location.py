"""A checkpoint location as one value: the parsed URL and the store that owns its settings.

A :class:`Location` is parsed and opened once, then handed down: the Checkpointer, the DCP
writer and reader, the tools, retention, the integrations and the CLI all accept one (a URL
string still works everywhere, and becomes a Location at the public entry point, in one
:meth:`Location.of` call). Below the entry points only the Location (or its store) travels;
nothing below re-parses the URL or holds its own copy of the settings.

Who holds the settings: an :class:`~s3ckpt.store.s3.S3Store` holds its
:class:`~s3ckpt.config.S3Config` and :class:`~s3ckpt.config.TransferConfig` (resolved once
when it is built, never changed after), and a Location of it only reads them. A store that
holds none (a :class:`~s3ckpt.store.MemoryStore`, an fsspec store, a test's wrapper) is
given them by its Location instead: the settings passed to :meth:`Location.of` with it, or
the defaults. So does a store the caller passed in together with settings of their own.

Stores come from one process-wide cache (:data:`_STORES`, a :class:`ProcessCache`): every
``Location.of`` of one process with the same scheme, bucket and settings (and, for S3, the
same ``AWS_*`` environment and AWS files) shares one store (and so one boto3 client, one
adaptive limiter, one retry policy). A forked child starts with an empty cache.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import ConfigError
from s3ckpt.store._cache import ProcessCache
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL, parse_location, parse_url

__all__ = ["AtLocation", "Location", "LocationLike", "parse_target", "shared_store"]

C = TypeVar("C", S3Config, TransferConfig)

# Stores by (scheme, bucket, S3Config, TransferConfig, AWS environment, storage options):
# LRU-bounded; a dropped store stays usable by whoever holds it.
_STORES: ProcessCache[tuple[Any, ...], ObjectStore] = ProcessCache(64)


@dataclass(frozen=True)
class Location:
    """A parsed URL and the store that serves it.

    Build one with :meth:`of`; derive others in the same store with :meth:`child`,
    :meth:`parent` and :meth:`at`. ``Location(url, store)`` wraps a store you already hold.

    Attributes:
        url: The parsed URL (``scheme://bucket/prefix/``).
        store: The store holding ``url``; an S3 store owns the S3 and transfer settings.
    """

    url: StoreURL
    store: ObjectStore
    # Settings for a store that holds none of its own (or the caller's, given with their
    # own store): None reads the store's, else the defaults. Set by Location.of only.
    _s3_config: S3Config | None = field(default=None, repr=False, hash=False)
    _transfer_config: TransferConfig | None = field(default=None, repr=False, hash=False)

    @classmethod
    def of(
        cls,
        target: LocationLike,
        *,
        s3_config: S3Config | None = None,
        transfer_config: TransferConfig | None = None,
        storage_options: dict[str, Any] | None = None,
        store: ObjectStore | None = None,
    ) -> Location:
        """``target`` as a Location: a Location passes through (settings given with it are
        refused, they would be ignored), anything else is parsed once
        (:func:`parse_target`) and its store taken from ``store`` or the process-wide
        cache.

        The settings end in one holder: an S3 store from the cache holds them (resolved);
        a store that holds none, or the caller's own ``store`` given with settings, has
        them held by the Location.

        Raises:
            InvalidURLError: ``target`` is not a URL s3ckpt can use.
            ConfigError: ``target`` is a Location and settings were given too.
        """
        if isinstance(target, Location):
            if any(x is not None for x in (s3_config, transfer_config, storage_options, store)):
                raise ConfigError(
                    f"{target.url} is already a Location with its own store; pass the URL "
                    "string to open it with other settings"
                )
            return target
        url = parse_target(target)
        if store is not None:
            # The caller's store: the settings given with it are the ones in force.
            return cls(url, store, s3_config, transfer_config)
        sc = s3_config or S3Config()
        tc = transfer_config or TransferConfig()
        store = shared_store(url, sc, tc, storage_options or {})
        if isinstance(getattr(store, "transfer_config", None), TransferConfig):
            return cls(url, store)  # it holds its own settings (an S3 store does)
        return cls(url, store, sc, tc)

    # -- derived locations, in the same store -----------------------------------------------
    def child(self, name: str) -> Location:
        """The sub-prefix ``name`` under this one, in the same store."""
        return dataclasses.replace(self, url=self.url.child(name))

    @property
    def parent(self) -> Location:
        """The prefix one level up (a checkpoint's run), in the same store."""
        return dataclasses.replace(self, url=self.url.parent)

    def at(self, target: LocationLike) -> Location:
        """Another place: a Location passes through; a URL in this scheme and bucket is
        in this store (with these settings); any other is opened with this location's
        settings (:meth:`of`)."""
        if isinstance(target, Location):
            return target
        url = parse_target(target)
        if (url.scheme, url.bucket) == (self.url.scheme, self.url.bucket):
            return dataclasses.replace(self, url=url)
        return Location.of(url, s3_config=self.s3_config, transfer_config=self.transfer_config)

    # -- the settings (held by the store, or by this Location for a store without) -----------
    @property
    def transfer_config(self) -> TransferConfig:
        """The transfer settings in force: the store's (an S3 store's, resolved when it was
        built), else those this Location holds, else the defaults."""
        return self._transfer_config or _held(self.store, "transfer_config", TransferConfig)

    @property
    def s3_config(self) -> S3Config:
        """The S3 settings in force, as :attr:`transfer_config` (the defaults for a store
        that is not S3 and was given none)."""
        return self._s3_config or _held(self.store, "s3_config", S3Config)

    @property
    def bucket(self) -> str:
        """The bucket."""
        return self.url.bucket

    def key(self, name: str) -> str:
        """The key of ``name`` under this prefix."""
        return self.url.key(name)

    def __str__(self) -> str:
        return str(self.url)

    def __repr__(self) -> str:
        return f"Location({str(self.url)!r}, {self.store!r})"


#: What every public entry point accepts as a location: a URL string, a local path
#: (``os.PathLike``), a parsed :class:`~s3ckpt.uri.StoreURL`, or a :class:`Location`.
LocationLike = str | os.PathLike[str] | StoreURL | Location


class AtLocation:
    """Something that works at one :class:`Location` (the Checkpointer, the DCP writer and
    reader) and reads its URL, store and settings from it, so that no copy of them can
    drift from the store's: ``url``, ``store``, ``s3_config`` and ``transfer_config`` are
    views of :attr:`location`."""

    location: Location

    @property
    def url(self) -> StoreURL:
        """The location's URL (parsed)."""
        return self.location.url

    @property
    def store(self) -> ObjectStore:
        """The location's store."""
        return self.location.store

    @property
    def s3_config(self) -> S3Config:
        """The S3 settings in force (:attr:`Location.s3_config`)."""
        return self.location.s3_config

    @property
    def transfer_config(self) -> TransferConfig:
        """The transfer settings in force (:attr:`Location.transfer_config`)."""
        return self.location.transfer_config


def parse_target(target: str | os.PathLike[str] | StoreURL) -> StoreURL:
    """A location's URL, parsed once: a :class:`StoreURL` passes through, a string must be
    a URL (a missing ``s3://`` is an error, not a local folder), a path object
    (``os.PathLike``) is a local path.

    Raises:
        InvalidURLError: not a URL s3ckpt can use.
    """
    return parse_url(target) if isinstance(target, str) else parse_location(target)


def _held(store: ObjectStore, name: str, kind: type[C]) -> C:
    """The settings ``store`` holds under ``name`` (an S3 store does), else the defaults."""
    value = getattr(store, name, None)
    return value if isinstance(value, kind) else kind()


def shared_store(
    url: StoreURL, s3_config: S3Config, transfer_config: TransferConfig, options: dict[str, Any]
) -> ObjectStore:
    """The process's store for ``url``'s scheme and bucket with these settings (built on
    first use): ``s3://`` gives an :class:`~s3ckpt.store.s3.S3Store` (keyed by its settings
    and the AWS environment its resolved settings and client depend on), anything else an
    :class:`~s3ckpt.store.fsspec_store.FsspecStore` (keyed by its storage options)."""
    if url.scheme == "s3":
        from s3ckpt.store._client import aws_environment
        from s3ckpt.store.s3 import S3Store

        key = (url.scheme, url.bucket, s3_config, transfer_config, aws_environment())
        return _STORES.get(key, partial(S3Store, url.bucket, s3_config, transfer_config))
    from s3ckpt.store.fsspec_store import FsspecStore

    build = partial(FsspecStore, url.scheme, url.bucket, **options)
    try:
        frozen: Any = frozenset(options.items())
        hash(frozen)
    except TypeError:  # unhashable options (a dict of credentials): a store of its own
        return build()
    return _STORES.get((url.scheme, url.bucket, frozen), build)
