"""``s3ckpt doctor``: will this store keep checkpoints safe, as configured?

:func:`run_doctor` runs every check against one location and returns a
:class:`DoctorReport`: one :class:`Check` per row, each ``ok`` / ``fail`` / ``warn`` /
``skip`` with a one-line ``detail`` and, where it is not ``ok``, a ``meaning``: what it
means for the user's checkpoints and what to do. In order:

1. **preflight** (no row yet, nothing written): one LIST of the prefix. A bucket that does
   not exist, an endpoint that cannot be reached, or credentials the store rejects raise
   the store's error here (the CLI's exit 3), before anything is printed or created.
2. **credentials** and **endpoint** (S3 only): botocore's credential source (``env``,
   ``shared-credentials-file``, ``iam-role`` ...), the access key's last four characters at
   most (never a secret), the caller's ARN from STS where the endpoint is AWS's; the
   region, endpoint and addressing style the requests really used.
3. **clock skew** against the store's ``Date`` (:func:`~s3ckpt.store.store_time`).
4. **capabilities** (:func:`~s3ckpt.store.probe_capabilities`, the probe every save and
   lease runs, with ``race_pairs``): conditional create (If-None-Match), replace (If-Match)
   and delete, each answered 412 alone and raced :data:`~s3ckpt.tools._doctor_store.
   RACE_PAIRS` times from two threads (exactly one winner each time); checksum echo and
   verification; then ListMultipartUploads listing an
   upload another process opened, a run listed with ``Delimiter="/"`` two keys a page, and
   the bucket's versioning.
5. **permissions** the trainer and pruner roles need, each exercised for real, and a small
   **round trip** (``dcp.save`` / ``dcp.load`` with torch; a put and a multipart upload
   checked by CRC32C without): :mod:`s3ckpt.tools._doctor_checks`.
6. **cleanup**: everything steps 3-5 created lives under one scratch prefix,
   ``{prefix}s3ckpt-doctor-{random}/``, and is removed at the end, also when a check
   raises or the user presses Ctrl-C; the cleanup row says what is left, if anything.

Cost: about 160 requests (about 100 of them the races) and 5 MiB uploaded (without torch;
a few KiB with it), and one short-lived Python process (the other upload).
Needs no torch: without it the round trip is the raw one and a row says so.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import AccessDeniedError
from s3ckpt.store import ObjectStore
from s3ckpt.store._location import LocationLike
from s3ckpt.tools._doctor_checks import (
    Scratch,
    clean_up,
    permission_rows,
    round_trip_rows,
)
from s3ckpt.tools._doctor_report import Check, CheckStatus, DoctorReport
from s3ckpt.tools._doctor_store import (
    WARN_SKEW,
    capability_rows,
    clock_row,
    identity_rows,
    listing_row,
    other_upload_row,
    s3_client,
    versioning_row,
)
from s3ckpt.tools._open import as_location

__all__ = ["SCRATCH_PREFIX", "WARN_SKEW", "Check", "CheckStatus", "DoctorReport", "run_doctor"]

#: The scratch prefix's name under the checked URL: ``s3ckpt-doctor-{8 hex digits}/``.
SCRATCH_PREFIX = "s3ckpt-doctor-"

# Codes of errors that say the credentials themselves are unusable (not that one action
# is denied): the command cannot check anything, so they end it (exit 3).
_CREDENTIAL_CODES = frozenset(
    "InvalidAccessKeyId SignatureDoesNotMatch ExpiredToken InvalidToken NoCredentials "  # noqa: SIM905
    "RequestTimeTooSkewed".split()
)


def run_doctor(
    location: LocationLike,
    *,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    use_torch: bool | None = None,
    on_check: Callable[[Check], None] | None = None,
) -> DoctorReport:
    """Check whether the store at ``location`` will keep checkpoints under it safe (see the
    module docs for the checks and their cost).

    Args:
        location: The location to check (a URL, a local folder or a
            :class:`~s3ckpt.store.Location`); the checks write only under its scratch
            prefix.
        s3_config / transfer_config: How to open a URL ``location``.
        use_torch: Round-trip through ``dcp.save`` / ``dcp.load`` (``None``: when torch
            can be imported); ``False`` runs the raw put / multipart round trip.
        on_check: Called with each row as it completes (a terminal shows progress).

    Raises:
        StoreError: From the preflight LIST (``NoSuchBucketError``, ``EndpointError``,
            ``AccessDeniedError``, ``TransientStoreError``): the bucket does not exist, the
            endpoint cannot be reached, the credentials are unusable or the bucket is in
            another region. Nothing was created then.
        KeyboardInterrupt: after the cleanup ran (its row went to ``on_check``).
    """
    where = as_location(location, s3_config=s3_config, transfer_config=transfer_config)
    store = where.store
    rows: list[Check] = []

    def emit(*checks: Check) -> None:
        for check in checks:
            rows.append(check)
            if on_check is not None:
                on_check(check)

    work = Scratch(where.child(f"{SCRATCH_PREFIX}{secrets.token_hex(4)}"))
    # Preflight: one LIST of the prefix; errors that leave nothing to check are raised (a
    # bucket in another region: the store's error names the region to pass); a denied
    # LIST is the list permission's row later.
    with _request_urls(store) as seen:
        try:
            next(iter(store.list(where.url.prefix)), None)
        except AccessDeniedError as exc:
            if exc.code in _CREDENTIAL_CODES:
                raise
    emit(*identity_rows(store, seen))
    try:
        emit(clock_row(store, where.url.prefix))
        emit(*capability_rows(store, work.key("capabilities")))
        emit(other_upload_row(work))
        emit(listing_row(work))
        emit(versioning_row(store))
        emit(*permission_rows(work))
        emit(*round_trip_rows(work, use_torch=use_torch))
    finally:
        left = clean_up(work, emit)
    return DoctorReport(str(where.url), str(work.url), tuple(rows), left)


@contextmanager
def _request_urls(store: ObjectStore) -> Iterator[list[str]]:
    """The URLs of the S3 requests sent inside the block (how a request is really
    addressed: botocore decides virtual-hosted vs path style per request)."""
    seen: list[str] = []

    def record(request: Any, **_: Any) -> None:
        seen.append(str(request.url))

    with ExitStack() as stack:
        if (client := s3_client(store)) is not None:
            client.meta.events.register("before-send.s3", record)
            stack.callback(client.meta.events.unregister, "before-send.s3", record)
        yield seen
