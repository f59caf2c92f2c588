"""s3ckpt's exceptions: one tree, every error names what to check.

::

    S3CkptError (Exception)
    ├── ConfigError                  a configuration value is out of range
    │   ├── InvalidURLError          a checkpoint URL cannot be parsed
    │   └── PolicyError              a retention policy (file) is malformed
    ├── StoreError                   an object-store request failed (bucket, key, operation)
    │   ├── NoSuchBucketError
    │   ├── ObjectNotFoundError
    │   ├── AccessDeniedError        credentials missing, wrong or not allowed
    │   ├── PreconditionFailedError  a conditional write lost (If-None-Match / If-Match)
    │   ├── EndpointError            the endpoint cannot be reached (DNS, refused, TLS)
    │   ├── UnsupportedOperationError  the store does not implement a request (501)
    │   ├── ArchivedObjectError      a read of an object in GLACIER / DEEP_ARCHIVE (restore it)
    │   └── TransientStoreError      throttling / 5xx / timeouts that outlasted the retries
    ├── CheckpointError              the checkpoint itself is the problem
    │   ├── CheckpointExistsError    a committed checkpoint is already at the prefix
    │   ├── CheckpointNotFoundError  no committed checkpoint (and no .metadata) at the prefix
    │   │                            (also a FileNotFoundError)
    │   │   └── UncommittedCheckpointError  an s3ckpt save without its commit marker
    │   ├── CorruptCheckpointError   truncated object, malformed manifest, inconsistent commit
    │   │   └── ChecksumMismatchError
    │   ├── IncompleteRestoreError   a load left entries of the state dict unrestored
    │   ├── StateMismatchError       the checkpoint does not fit the model (shapes, keys)
    │   ├── UnsafeCheckpointError    a pickle asked for something outside the allow-list
    │   ├── SaveInProgressError      the previous async save is still uploading
    │   └── DeleteRefusedError       deleting this checkpoint could lose one (pinned, newest...)
    ├── ConditionalWritesError       the store ignores If-None-Match / If-Match
    ├── LeaseHeldError               another pruner holds the lease on a run
    │   └── LeaseLostError           our lease expired and another pruner took it over
    └── ClockSkewError               this host's clock and the store's differ by more than
                                     the grace period: gc, prune and rm refuse to act

Lower-layer exceptions are mapped to these at exactly one edge each: botocore, fsspec and
OSError in ``s3ckpt.store``, torch's ``CheckpointException`` by
:func:`unwrap_checkpoint_exception`.

All errors derive from :class:`Exception` (not ``BaseException``) and pickle with their
attributes, because ``torch.distributed.checkpoint`` gathers per-rank exceptions across
processes. An error is its message and its context: keyword fields stored as attributes,
``bucket``, ``key`` and ``rank`` on :class:`S3CkptError` (rendered after the message,
``[s3://bucket/key, rank 3]``) and each subclass's own (``operation``, ``item``, ``holder``
...), declared once as class attributes with their defaults; a field the class does not
declare is a ``TypeError``. Every field is optional, so an error pickles as any exception
does (its class called with the message, then its attributes restored).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

__all__ = [
    "AccessDeniedError",
    "ArchivedObjectError",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "ChecksumMismatchError",
    "ClockSkewError",
    "ConditionalWritesError",
    "ConfigError",
    "CorruptCheckpointError",
    "DeleteRefusedError",
    "EndpointError",
    "IncompleteRestoreError",
    "InvalidURLError",
    "LeaseHeldError",
    "LeaseLostError",
    "NoSuchBucketError",
    "ObjectNotFoundError",
    "PolicyError",
    "PreconditionFailedError",
    "S3CkptError",
    "SaveFencedError",
    "SaveInProgressError",
    "StateMismatchError",
    "StoreError",
    "TransientStoreError",
    "UncommittedCheckpointError",
    "UnsafeCheckpointError",
    "UnsupportedOperationError",
    "unwrap_checkpoint_exception",
]


class S3CkptError(Exception):
    """Base class of every error s3ckpt raises.

    Attributes:
        bucket: The bucket involved, when there is one; ``""`` for a local path (the
            message then names it as a ``file://`` URL).
        key: The object key involved, when there is one.
        rank: The distributed rank that hit the error, when known.
    """

    bucket: str | None = None
    key: str | None = None
    rank: int | None = None

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        for name, value in context.items():
            if not hasattr(type(self), name):
                raise TypeError(f"{type(self).__name__} has no context field {name!r}")
            setattr(self, name, value)

    @property
    def message(self) -> str:
        """The message without the location suffix."""
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        place = self.key
        if self.bucket == "":  # a local file system (file:// URL): the key is the path
            place = f"file:///{(self.key or '').lstrip('/')}"
        elif self.bucket is not None:
            place = f"s3://{self.bucket}" + (f"/{self.key}" if self.key else "")
        where = ", ".join(w for w in (place, self.rank is not None and f"rank {self.rank}") if w)
        return f"{self.message} [{where}]" if where else self.message


class ConfigError(S3CkptError, ValueError):
    """A configuration value is invalid; the message says which and what is allowed."""


class InvalidURLError(ConfigError):
    """A checkpoint URL cannot be parsed (expected ``s3://bucket/prefix``)."""


class PolicyError(ConfigError):
    """A retention policy is malformed or empty; the message names the file, the key and
    what is allowed.

    Attributes:
        source: The policy file (or ``<string>``).
        field: The offending key (``keep.last``, ``keep.best[1].metric`` ...), when known.
    """

    source: str | None = None
    field: str | None = None


class StoreError(S3CkptError):
    """An object-store request failed.

    Attributes:
        operation: The store operation (``put``, ``get``, ``head`` ...).
        code: The service's error code (``NoSuchBucket``, ``SlowDown`` ...) when known.
    """

    operation: str | None = None
    code: str | None = None


class NoSuchBucketError(StoreError):
    """The bucket does not exist (or the endpoint/region points elsewhere)."""


class ObjectNotFoundError(StoreError):
    """The object does not exist."""


class AccessDeniedError(StoreError):
    """The credentials are missing, invalid, or not allowed to do this."""


class PreconditionFailedError(StoreError):
    """A conditional request failed: the object already exists or changed."""


class EndpointError(StoreError):
    """The endpoint cannot be reached: bad hostname, connection refused, TLS failure."""


class TransientStoreError(StoreError):
    """Throttling, server errors or timeouts persisted through every retry."""


class UnsupportedOperationError(StoreError):
    """The store does not implement this request (HTTP 501 ``NotImplemented``), as some
    S3-compatible stores answer ``ListMultipartUploads`` or a conditional ``DeleteObject``."""


class ArchivedObjectError(StoreError):
    """A read of an object in GLACIER / DEEP_ARCHIVE with no restored copy (403
    ``InvalidObjectState``): ``storage_class`` is its class, ``checkpoint`` the restore's URL."""

    storage_class: str | None = None
    checkpoint: str | None = None


class CheckpointError(S3CkptError):
    """The checkpoint at a prefix cannot be written or read as asked."""


class CheckpointExistsError(CheckpointError):
    """A committed checkpoint already exists at the prefix and ``overwrite`` is off."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """There is no checkpoint (no commit marker and no ``.metadata``) at the prefix.

    Also a :class:`FileNotFoundError` (Lightning's ``CheckpointIO`` contract; ``errno``,
    ``strerror`` and ``filename`` are None: the location is in the message).
    """


class UncommittedCheckpointError(CheckpointNotFoundError):
    """The prefix holds an s3ckpt save that never wrote its commit marker (still running,
    killed or failed); readers refuse it unless asked to load it anyway."""


class CorruptCheckpointError(CheckpointError):
    """Data is missing, truncated or inconsistent with the commit marker."""


class ChecksumMismatchError(CorruptCheckpointError):
    """An item's bytes do not match the CRC32C recorded at save time.

    Attributes:
        item: The state-dict key (fully qualified name) of the item.
    """

    item: str | None = None


class IncompleteRestoreError(CheckpointError):
    """A load did not restore every entry of the destination state dict.

    Raised by :func:`s3ckpt.tools.check_restored` (``load(..., verify_complete=True)``).

    Attributes:
        items: Every state-dict key (flattened, as DCP names it) that was not restored.
        reasons: For each of ``items``, why: ``"missing from the checkpoint"`` or where
            NaN was left in a region no saved chunk covers.
    """

    items: Sequence[str] = ()
    reasons: Mapping[str, str] = MappingProxyType({})


class StateMismatchError(CheckpointError):
    """The checkpoint does not fit the state dict it is loaded into (shapes, missing or
    unexpected keys); raised before any byte is read where it can be, model untouched.

    Attributes:
        item: The first key named (a shape mismatch first, then a missing key).
        shapes: ``{key: (saved shape, expected shape)}`` of every tensor of another shape.
        missing: Every key of the destination that the checkpoint lacks.
        unexpected: Every key of the checkpoint's model that the destination lacks.
    """

    shapes: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] = MappingProxyType({})
    missing: Sequence[str] = ()
    unexpected: Sequence[str] = ()

    @property
    def item(self) -> str | None:
        """The first key named (a shape mismatch first, then a missing key)."""
        return next(iter([*self.shapes, *self.missing, *self.unexpected]), None)


class UnsafeCheckpointError(CheckpointError):
    """A pickle in the checkpoint asked to load something outside the allow-list."""


class SaveInProgressError(CheckpointError):
    """A save was asked for while the previous async save is still uploading
    (``Checkpointer(on_busy="raise")``)."""


class SaveFencedError(CheckpointError):
    """A save met a tombstone at its commit: gc, prune or rm fenced its prefix (and may
    have deleted its objects); nothing was committed."""


class DeleteRefusedError(CheckpointError):
    """A checkpoint was not deleted (nor anything else) because deleting it could lose one.

    Attributes:
        reason: Why, as a word: ``pinned``, ``in_progress``, ``newest``, ``changed`` (a
            save committed it after ``rm`` listed it), ``foreign`` or ``abandoned``.
    """

    reason: str | None = None


class ConditionalWritesError(S3CkptError):
    """The store does not enforce conditional writes (``If-None-Match: *`` / ``If-Match``),
    which commits, overwrites and the retention lease rely on.

    Attributes:
        endpoint: The endpoint probed (``None``: AWS).
        what: What was refused (``a save``, ``the lease`` ...).
    """

    endpoint: str | None = None
    what: str | None = None


class LeaseHeldError(S3CkptError):
    """Another pruner holds the lease on a run (``{run}/s3ckpt.lease``); try again later.

    Attributes:
        holder: The holder's owner id (``host:pid:...``), when it could be read.
        expires: When the holder's lease expires (seconds since the epoch), when known.
    """

    holder: str | None = None
    expires: float | None = None


class LeaseLostError(LeaseHeldError):
    """The lease expired and another pruner took it over: we stopped before the next delete."""


class ClockSkewError(S3CkptError):
    """This host's clock and the store's differ by more than the grace period in use.

    Ages are measured in the store's time, but a skew that large means the host is
    misconfigured (fix NTP): gc, prune and rm refuse to delete anything.

    Attributes:
        local: This host's clock (seconds since the epoch) when the store was asked.
        store: The store's clock at that moment (seconds since the epoch).
        skew: ``local - store`` in seconds.
        limit: The largest skew accepted (the grace period in use), in seconds.
    """

    local: float | None = None
    store: float | None = None
    skew: float | None = None
    limit: float | None = None


def _inside(exc: BaseException, context: bool) -> Iterator[tuple[BaseException, int | None]]:
    """``exc`` and what it wraps, depth first, each once, with its rank when known: DCP's
    per-rank ``failures`` (``{rank: (exception, traceback)}``, the lowest rank first),
    ``__cause__`` and, with ``context``, ``__context__``."""
    seen: set[int] = set()
    stack: list[tuple[BaseException, int | None]] = [(exc, None)]
    while stack:
        cur, rank = stack.pop()
        if id(cur) not in seen:
            seen.add(id(cur))
            yield cur, rank
            failures = getattr(cur, "failures", None)
            for failed, value in sorted(failures.items() if failures else (), reverse=True):
                inner = value[0] if isinstance(value, tuple) else value
                if isinstance(inner, BaseException):
                    stack.append((inner, int(failed)))
            stack += [(e, rank) for e in (cur.__cause__, context and cur.__context__) if e]


def find_s3ckpt_error(exc: BaseException) -> S3CkptError | None:
    """The s3ckpt error inside ``exc`` (DCP's ``CheckpointException``, a ``__cause__`` or
    ``__context__`` chain), if any; :func:`unwrap_checkpoint_exception` makes one."""
    return next((e for e, _ in _inside(exc, context=True) if isinstance(e, S3CkptError)), None)


def find_interrupt(exc: BaseException) -> KeyboardInterrupt | SystemExit | None:
    """Return the ``KeyboardInterrupt`` or ``SystemExit`` that ``exc`` is or wraps, if any.

    DCP wraps a Ctrl-C during ``dcp.save`` / ``dcp.load`` in its ``CheckpointException``.
    Never searches ``__context__`` (an error raised while handling an interrupt that was
    then dealt with is not one).
    """
    found = (e for e, _ in _inside(exc, context=False))
    return next((e for e in found if isinstance(e, (KeyboardInterrupt, SystemExit))), None)


def unwrap_checkpoint_exception(
    exc: BaseException,
    what: str = "the checkpoint operation",
    *,
    bucket: str | None = None,
    key: str | None = None,
    rank: int | None = None,
) -> S3CkptError | KeyboardInterrupt | SystemExit:
    """What to raise for ``exc``: the one edge where torch's ``CheckpointException`` (a
    ``BaseException``) becomes an s3ckpt error. A Ctrl-C or ``SystemExit`` inside it comes
    back as itself; else the first rank's s3ckpt error (``__cause__``: ``exc``, unless it
    had one); else a :class:`CheckpointError` naming ``what`` and the rank, the original
    as its ``__cause__``. ``dcp.load`` / ``dcp.save`` wrap every failure of a reader or
    writer (only its constructor's reach you bare), so around a plain ``dcp.load``::

        try:
            dcp.load(state_dict, storage_reader=S3StorageReader(url))
        except BaseException as exc:
            raise unwrap_checkpoint_exception(exc, f"the load of {url}")
    """
    if (found := find_interrupt(exc) or find_s3ckpt_error(exc)) is not None:
        if isinstance(found, S3CkptError) and found is not exc and found.__cause__ is None:
            found.__cause__ = exc
        found.__suppress_context__ |= found is not exc  # no "during handling of" the wrapper
        return found
    ranked = (e_r for e_r in _inside(exc, context=False) if e_r[1] is not None)
    cause, failed = next(ranked, (exc, rank))
    err = CheckpointError(
        f"{what} failed: {type(cause).__name__}: {cause}", bucket=bucket, key=key, rank=failed
    )
    err.__cause__ = cause
    return err
