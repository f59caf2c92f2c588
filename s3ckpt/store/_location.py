"""A checkpoint location as one value: the parsed URL and the store that owns its settings.

A :class:`Location` is parsed and opened once, then handed down: the Checkpointer, the DCP
writer and reader, the tools, retention, the integrations and the CLI all accept one (a URL
string still works everywhere, and becomes a Location at the public entry point). The store
is the one holder of the location's :class:`~s3ckpt.config.S3Config` and
:class:`~s3ckpt.config.TransferConfig`; nothing below it keeps a copy.

Stores come from one process-wide cache (:data:`_STORES`, a :class:`ProcessCache`): every
``Location.of`` of one process with the same scheme, bucket and settings shares one store
(and so one boto3 client, one adaptive limiter, one retry policy). A forked child starts
with an empty cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import ConfigError
from s3ckpt.store._cache import ProcessCache
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL, parse_url

__all__ = ["Location", "LocationLike"]

# Stores by (scheme, bucket, S3Config, TransferConfig, storage options): LRU-bounded; a
# dropped store stays usable by whoever holds it.
_STORES: ProcessCache[tuple[Any, ...], ObjectStore] = ProcessCache(64)


@dataclass(frozen=True, eq=False)
class Location:
    """A parsed URL and the store that serves it.

    Build one with :meth:`of`; derive others in the same store with :meth:`child`,
    :meth:`parent` and :meth:`at`.

    Attributes:
        url: The parsed URL (``scheme://bucket/prefix/``).
        store: The store holding ``url``; it owns the S3 and transfer settings.
    """

    url: StoreURL
    store: ObjectStore

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
        refused, they would be ignored), a URL is parsed once and its store taken from
        ``store`` or the process-wide cache.

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
        url = target if isinstance(target, StoreURL) else parse_url(os.fspath(target))
        if store is None:
            store = shared_store(
                url,
                s3_config=s3_config,
                transfer_config=transfer_config,
                storage_options=storage_options,
            )
        return cls(url, store)

    # -- derived locations, in the same store -----------------------------------------------
    def child(self, name: str) -> Location:
        """The sub-prefix ``name`` under this one, in the same store."""
        return Location(self.url.child(name), self.store)

    @property
    def parent(self) -> Location:
        """The prefix one level up (a checkpoint's run), in the same store."""
        return Location(self.url.parent, self.store)

    def at(self, target: str | StoreURL) -> Location:
        """Another URL: in this store when it is in the same scheme and bucket, else opened
        with this store's settings."""
        url = target if isinstance(target, StoreURL) else parse_url(target)
        if (url.scheme, url.bucket) == (self.url.scheme, self.url.bucket):
            return Location(url, self.store)
        return Location.of(url, s3_config=self.s3_config, transfer_config=self.transfer_config)

    # -- the store's settings (the store holds them; these only read) ------------------------
    @property
    def transfer_config(self) -> TransferConfig:
        """The store's transfer settings (the defaults for a store without any)."""
        tc = getattr(self.store, "transfer_config", None)
        return tc if isinstance(tc, TransferConfig) else TransferConfig()

    @property
    def s3_config(self) -> S3Config | None:
        """The store's S3 settings (``None`` for a store that is not S3)."""
        sc = getattr(self.store, "s3_config", None)
        return sc if isinstance(sc, S3Config) else None

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

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Location):
            return NotImplemented
        return self.url == other.url and self.store is other.store

    def __hash__(self) -> int:
        return hash((self.url, id(self.store)))


LocationLike = str | os.PathLike[str] | StoreURL | Location
"""What every public entry point accepts as a location."""


def shared_store(
    url: StoreURL,
    *,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    storage_options: dict[str, Any] | None = None,
) -> ObjectStore:
    """The process's store for ``url``'s scheme and bucket with these settings (built on
    first use): ``s3://`` gives an :class:`~s3ckpt.store.s3.S3Store`, anything else an
    :class:`~s3ckpt.store.fsspec_store.FsspecStore`."""
    sc = s3_config or S3Config()
    tc = transfer_config or TransferConfig()
    options = storage_options or {}
    try:
        frozen: Any = frozenset(options.items())
        hash(frozen)
    except TypeError:  # unhashable options (a dict of credentials): a store of its own
        return _build(url, sc, tc, options)
    key = (
        (url.scheme, url.bucket, sc, tc, frozen)
        if url.scheme == "s3"
        else (url.scheme, url.bucket, frozen)
    )
    return _STORES.get(key, lambda: _build(url, sc, tc, options))


def _build(url: StoreURL, sc: S3Config, tc: TransferConfig, options: dict[str, Any]) -> ObjectStore:
    if url.scheme == "s3":
        from s3ckpt.store.s3 import S3Store

        return S3Store(url.bucket, sc, tc)
    from s3ckpt.store.fsspec_store import FsspecStore

    return FsspecStore(url.scheme, url.bucket, **options)
