"""The doctor's rows of the store itself: credentials, endpoint, clock skew and the store's
capabilities (checks that only read), then what saves and scans rely on beyond single
requests: another process's open upload listed, a run listed folder by folder with paging,
and the bucket's versioning. The probing is the store's capability module's
(:func:`~s3ckpt.store.probe_capabilities`, :func:`~s3ckpt.store.other_process_upload`,
:func:`~s3ckpt.store.listing_mistakes`); these functions render it (see
:mod:`s3ckpt.tools._doctor` for the order and cost)."""

from __future__ import annotations

import dataclasses
import ipaddress
import subprocess
import time
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from s3ckpt.errors import AccessDeniedError, S3CkptError, StoreError
from s3ckpt.retention._liveness import MIN_GRACE
from s3ckpt.store import Capabilities, ObjectStore, probe_capabilities
from s3ckpt.store._capabilities import listing_mistakes, other_process_upload
from s3ckpt.store._clock import store_time
from s3ckpt.store._known import RaceKind, is_unsupported
from s3ckpt.store._versions import VersionedStore
from s3ckpt.tools._doctor_checks import LIFECYCLE, NO_LIST_UPLOADS, Scratch
from s3ckpt.tools._doctor_report import Check, CheckStatus, fail, ok, skip, warn

__all__ = [
    "LISTING_PAGE",
    "RACE_PAIRS",
    "WARN_SKEW",
    "capability_rows",
    "clock_row",
    "identity_rows",
    "listing_row",
    "other_upload_row",
    "s3_client",
    "versioning_row",
]

#: A clock skew above this is a warning; above :data:`~s3ckpt.retention.MIN_GRACE` a failure. (The
#: ``Date`` header has one-second resolution.)
WARN_SKEW = timedelta(seconds=5)


def s3_client(store: ObjectStore) -> Any:
    """The boto3 client of an S3 store, else ``None``."""
    s3 = store.url_scheme == "s3" and hasattr(store, "s3_config")
    return getattr(store, "client", None) if s3 else None


# -- credentials and endpoint ----------------------------------------------------------------
def identity_rows(store: ObjectStore, seen: list[str]) -> list[Check]:
    if (client := s3_client(store)) is None:
        why = f"not an S3 store ({store.url_scheme}://): no AWS credentials or endpoint involved"
        return [skip(name, why) for name in ("credentials", "endpoint")]
    cfg = store.s3_config  # type: ignore[attr-defined]
    return [_credentials_row(cfg, client), _endpoint_row(cfg, client, store.bucket, seen)]


def _is_aws(endpoint: str | None) -> bool:
    host = "" if endpoint is None else (urlsplit(endpoint).hostname or "").lower()
    return endpoint is None or host.endswith((".amazonaws.com", ".amazonaws.com.cn"))


def _credentials_row(cfg: Any, client: Any) -> Check:
    """botocore's credential source and the key's last four characters; the caller's ARN
    from STS on AWS (a custom endpoint has no STS)."""
    import botocore.session  # only S3 stores get here: boto3 is installed

    session = botocore.session.Session(profile=cfg.profile)
    try:
        creds = session.get_credentials()
    except Exception as exc:  # a credential_process or SSO cache that fails a second time
        return warn(
            "credentials",
            f"could not resolve them again: {type(exc).__name__}",
            "the store accepted this host's requests, but where the credentials come "
            "from is unknown; check them with `aws sts get-caller-identity`",
        )
    if creds is None:  # the preflight LIST passed anonymously: a public or open endpoint
        return warn(
            "credentials",
            "no credentials found: requests are unsigned",
            "the store accepted anonymous requests; anyone who reaches it can read and "
            "delete checkpoints: require credentials on the endpoint",
        )
    method = getattr(creds, "method", None) or "unknown"
    key = creds.get_frozen_credentials().access_key or ""
    detail = f"from {method}" + (f" (access key …{key[-4:]})" if len(key) >= 8 else "")
    if not _is_aws(cfg.resolved_endpoint_url()):
        return ok("credentials", f"{detail}; STS not asked (custom endpoint)")
    try:
        from botocore.config import Config

        config = Config(connect_timeout=5, read_timeout=10, retries={"total_max_attempts": 2})
        sts = session.create_client("sts", region_name=client.meta.region_name, config=config)
        arn = str(sts.get_caller_identity().get("Arn", "?"))
    except Exception as exc:  # any failure is the row's detail, not a crash
        return warn(
            "credentials",
            f"{detail}; STS GetCallerIdentity failed: {type(exc).__name__}",
            "the caller's identity is unknown (STS unreachable or denied); the S3 checks "
            "below still say what these credentials may do",
        )
    return ok("credentials", f"{detail}; {arn}")


def _endpoint_row(cfg: Any, client: Any, bucket: str, seen: list[str]) -> Check:
    endpoint = client.meta.endpoint_url
    style = "unknown"
    if seen:
        host = urlsplit(seen[0]).hostname or ""
        style = "virtual-hosted" if host.startswith(f"{bucket}.") else "path"
    detail = f"region {client.meta.region_name}, {endpoint}, {style}-style addressing"
    parts = urlsplit(endpoint)
    if not cfg.verify_tls:
        return warn(
            "endpoint",
            detail + ", TLS not verified",
            "--no-verify-tls: anyone on the network path can impersonate the store; "
            "install the endpoint's CA certificate (AWS_CA_BUNDLE) instead",
        )
    if parts.scheme == "http" and not _is_loopback(parts.hostname or ""):
        return warn(
            "endpoint",
            detail + ", plain http",
            "checkpoints travel unencrypted to a remote host: use an https:// endpoint",
        )
    return ok("endpoint", detail)


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- clock -----------------------------------------------------------------------------------
def clock_row(store: ObjectStore, prefix: str) -> Check:
    try:
        t = store_time(store, prefix)
    except S3CkptError as exc:
        return warn(
            "clock skew",
            f"could not read the store's time: {exc}",
            "ages are measured in the store's time; this host's skew is unknown",
        )
    if not t.measured:
        return skip("clock skew", f"not measured: {t.source}")
    skew = round(t.skew.total_seconds(), 1)
    way = "ahead of" if skew > 0 else "behind"
    detail = f"{skew:+.1f} s: this host's clock is {abs(skew):.1f} s {way} the store's"
    if skew == 0:
        detail = "0.0 s: this host's clock agrees with the store's"
    if abs(skew) > MIN_GRACE.total_seconds():
        return fail(
            "clock skew",
            detail,
            f"more than the minimum grace ({MIN_GRACE.total_seconds():g} s): gc, prune and "
            "rm refuse to act from this host; fix its clock (NTP / chrony)",
        )
    if abs(skew) > WARN_SKEW.total_seconds():
        return warn(
            "clock skew",
            detail,
            "ages are measured in the store's time, so checkpoints are safe, but times "
            "shown from this host are off: check NTP",
        )
    return ok("clock skew", detail)


# -- capabilities ----------------------------------------------------------------------------
#: Pairs raced per conditional request (:func:`~s3ckpt.store.probe_capabilities`'s ``race_pairs``):
#: enough to catch a check-then-write on most runs, about 100 requests.
RACE_PAIRS = 8


def capability_rows(store: ObjectStore, key: str) -> list[Check]:
    started = time.monotonic()
    try:
        caps = probe_capabilities(
            store, key, body=b"s3ckpt doctor: capability probe\n", race_pairs=RACE_PAIRS
        )
    except AccessDeniedError as exc:
        why = f"not probed: {exc.message} (see the permission rows)"
        return [skip(n, why) for n in _CAPABILITY_NAMES]
    except StoreError as exc:
        unknown = (
            "s3ckpt cannot tell what this store guarantees, so saves refuse: "
            "see the error, then run doctor again"
        )
        return [fail(n, f"the probe failed: {exc}", unknown) for n in _CAPABILITY_NAMES]
    took = time.monotonic() - started
    # With single-writer mode on, the user vouches that one process at a time writes a
    # prefix: saves go on, so a missing condition is a caveat of that promise, not a failure.
    single = bool(getattr(getattr(store, "s3_config", None), "single_writer", False))
    missing = CheckStatus.WARN if single else CheckStatus.FAIL
    opt_in = (
        "single-writer mode is on: safe only while one process at a time saves to and "
        "prunes a prefix"
        if single
        else "refused unless S3Config(single_writer=True) / --single-writer says only one "
        "process at a time writes a prefix"
    )
    lease = (
        "gc, prune and rm fence a checkpoint with a tombstone (a conditional PUT) in any case; "
        "only their last request, deleting their own tombstone, is then a plain DELETE under "
        "the run's lease instead of one conditional on its ETag (a deleter paused past its "
        "lease in that last moment could remove a marker committed meanwhile)"
    )
    create = f"two saves of one prefix could both report success and one be lost; {opt_in}"
    replace = (
        "overwrites and the retention lease cannot exclude each other (two pruners or two "
        f"overwrites could both win); {opt_in}"
    )
    rows = [
        _conditional_row(store, caps, "create", missing, create),
        _conditional_row(store, caps, "replace", missing, replace),
        _conditional_row(store, caps, "delete", CheckStatus.WARN, lease),
        _checksum_row(store, caps.checksum_echo),
        _verification_row(store, key),
    ]
    note = f" (probed in {took:.1f} s)" if took >= 1 else ""
    rows[0] = dataclasses.replace(rows[0], detail=rows[0].detail + note)
    return rows


#: The request header of each conditional request.
_HEADERS = {"create": "If-None-Match", "replace": "If-Match", "delete": "DeleteObject If-Match"}


def _conditional_row(
    store: ObjectStore, caps: Capabilities, kind: RaceKind, missing: CheckStatus, meaning: str
) -> Check:
    """One conditional request's row: answered 412 alone, and exactly one winner in every
    race (:func:`s3ckpt.store._capabilities.race`)."""
    name, header = f"conditional {kind}", _HEADERS[kind]
    raced = caps.race(kind)
    if getattr(caps, f"conditional_{kind}"):
        alone = "honoured" if kind == "delete" else "answered 412, as required"
        won = f"; one of two won each of {raced.pairs} races" if raced else ""
        return ok(name, f"{header} {alone}{won}")
    if raced is not None and not raced.atomic:
        detail = f"{raced.describe()}: the store's {header} is a check then a write"
        return Check(name, missing, detail, meaning)
    enforces = getattr(store, "enforces", None)
    if isinstance(enforces, frozenset) and kind not in enforces:
        detail = (
            f"{store.url_scheme}:// has no atomic primitive for it: its {header} is a check "
            "then a write (single-writer)"
        )
        return Check(name, missing, detail, meaning)
    if kind == "delete":  # doctor always probes it
        return Check(name, missing, f"{header} not supported (ignored, refused or 501)", meaning)
    return Check(name, missing, f"{header} ignored (the write went through)", meaning)


_CAPABILITY_NAMES = (
    *(f"conditional {kind}" for kind in _HEADERS),
    "checksum echo",
    "checksum verification",
)


def _checksum_row(store: ObjectStore, echo: bool | None) -> Check:
    if echo is None:
        cfg = getattr(store, "s3_config", None)
        if store.url_scheme != "s3" or cfg is None:
            why = f"not an S3 store ({store.url_scheme}://): no checksum headers"
        elif cfg.checksum_algorithm != "CRC32C":
            why = "uploads carry no checksum (S3Config.checksum_algorithm='NONE')"
        else:
            why = "no PUT of the probe succeeded"
        return skip("checksum echo", f"not probed: {why}")
    if echo:
        return ok("checksum echo", "the store echoes the CRC32C it received")
    return warn(
        "checksum echo",
        "the store does not echo x-amz-checksum-crc32c",
        "a byte flipped in transit would go unnoticed by the store: s3ckpt re-reads each "
        "committed object's CRC32C before the marker (verify_after_write), one more read per save",
    )


def _verification_row(store: ObjectStore, key: str) -> Check:
    """Whether the store refuses an upload whose CRC32C is wrong: an echo alone proves
    nothing (moto echoes back whatever it was sent)."""
    name = "checksum verification"
    probe = getattr(store, "checksum_verified", None)
    cfg = getattr(store, "s3_config", None)
    if probe is None or cfg is None or cfg.checksum_algorithm != "CRC32C":
        return skip(name, "not probed: no CRC32C on uploads to this store")
    try:
        if probe(key):
            return ok(name, "an upload with a wrong CRC32C is refused")
    except StoreError as exc:
        return skip(name, f"not probed: {exc}")
    return warn(
        name,
        "the store accepted an upload whose CRC32C was wrong",
        "a byte flipped in transit would be stored: saves re-read every object against its "
        "CRC32C before the marker (verify_after_write, on by default here), one more read per save",
    )


# -- beyond single requests: uploads, listings, versions ------------------------------------
#: Keys per LIST page in the listing probe: every folder listed spans several pages.
LISTING_PAGE = 2


def other_upload_row(work: Scratch) -> Check:
    """``list uploads``: ✔ only when an upload another process opened is listed (gc finds
    the uploads of saves that died elsewhere this way). Cost: a process start, a
    CreateMultipartUpload, a ListMultipartUploads and an abort."""
    name, store = "list uploads", work.store
    key = work.key("uploads/other-process")
    try:
        listed, how = other_process_upload(store, key, work.key("uploads/"), work.uploads.append)
    except AccessDeniedError as exc:
        return skip(name, f"not probed: {exc.message} (see the permissions)")
    except StoreError as exc:
        if is_unsupported(exc):
            why = f"the store does not support ListMultipartUploads ({exc.code})"
            return warn(name, why, NO_LIST_UPLOADS)
        return fail(name, f"the probe failed: {exc}", "see the error")
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return skip(name, f"not measured: {exc}")
    if listed:
        return ok(name, f"ListMultipartUploads lists an upload {how} opened")
    return warn(
        name,
        f"ListMultipartUploads does not list an upload {how} opened (only this process's own)",
        "gc cannot see the uploads of saves that died in other processes: they stay "
        f"(billed on S3, partial files elsewhere) until {LIFECYCLE} or you remove them",
    )


def listing_row(work: Scratch) -> Check:
    """``listing``: a run laid out as s3ckpt writes it, listed with ``Delimiter="/"`` at the
    run and at a checkpoint, two keys a page: every folder and object comes back exactly
    once. Cost: 11 PUTs and about 10 LISTs."""
    name = "listing"
    try:
        wrong = listing_mistakes(work.store, work.key("listing/"), LISTING_PAGE)
    except AccessDeniedError as exc:
        return skip(name, f"not probed: {exc.message} (see the permissions)")
    except S3CkptError as exc:
        return fail(
            name,
            f"listing a run with Delimiter=/ failed: {exc}",
            "ls, load(step='latest'), prune and gc list runs this way and would fail here: "
            "report it to the store's operator",
        )
    if wrong:
        shown = "; ".join(wrong[:3]) + (f" and {len(wrong) - 3} more" if len(wrong) > 3 else "")
        return fail(
            name,
            f"a delimited listing, {LISTING_PAGE} keys a page, came back wrong: {shown}",
            "ls, load(step='latest'), prune and gc would miss or double-count checkpoints: "
            "report it to the store's operator",
        )
    return ok(
        name,
        f"a run and a checkpoint listed with Delimiter=/, {LISTING_PAGE} keys a page: every "
        "folder and object exactly once",
    )


# -- versioning ------------------------------------------------------------------------------
_VERSIONS_DOC = "docs/operations.md, 'Versioned buckets'"


def versioning_row(store: ObjectStore) -> Check:
    """``versioning``: GetBucketVersioning, and what prune then frees."""
    name = "versioning"
    if not isinstance(store, VersionedStore):
        why = f"not an S3 store ({store.url_scheme}://): no object versions; deletes free bytes"
        return skip(name, why)
    try:
        status = store.versioning_status()
    except AccessDeniedError as exc:
        return warn(
            name,
            f"could not read it: {exc.code or 'AccessDenied'} (s3:GetBucketVersioning)",
            "on a versioned bucket prune's deletes leave noncurrent versions (billed); "
            f"grant s3:GetBucketVersioning to know, and see {_VERSIONS_DOC}",
        )
    except StoreError as exc:
        if is_unsupported(exc):
            return skip(name, f"the store does not support GetBucketVersioning ({exc.code})")
        return warn(name, f"could not read it: {exc}", f"see {_VERSIONS_DOC}")
    if status is None:
        return ok(name, "never enabled: prune, gc and rm free what they delete")
    kept = (
        "a deleted checkpoint stays as noncurrent versions (billed)"
        if status == "Enabled"
        else "versions made while it was enabled stay as noncurrent versions (billed)"
    )
    return warn(
        name,
        f"{status}: {kept} until a lifecycle rule expires them",
        "prune reports the noncurrent bytes it leaves; expire them with a "
        "NoncurrentVersionExpiration lifecycle rule (terraform/ sets one): see " + _VERSIONS_DOC,
    )
