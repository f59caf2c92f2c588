"""Frozen, validated configuration: where the store is (:class:`S3Config`) and how bytes
move (:class:`TransferConfig`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from s3ckpt.errors import ConfigError

__all__ = [
    "CONNECTION_MBPS",
    "DEFAULT_MAX_ATTEMPTS",
    "MAX_DERIVED_CONCURRENCY",
    "UPLOAD_MEMORY_BOUND",
    "KiB",
    "MiB",
    "GiB",
    "S3Config",
    "TransferConfig",
]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# S3 service limits (https://docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html).
MIN_PART_SIZE = 5 * MiB
MAX_PART_SIZE = 5 * GiB
MAX_PARTS = 10_000

DEFAULT_MAX_ATTEMPTS = 8
"""Attempts per request when neither the caller, ``AWS_MAX_ATTEMPTS`` nor the AWS profile
chooses."""


CONNECTION_MBPS = 90.0
"""What one connection to S3 carries, in MB/s (10**6 bytes per second). AWS's performance
guidelines: "make one concurrent request for each 85-90 MB/s of desired network
throughput". :attr:`TransferConfig.max_concurrency` is derived from it."""

MAX_DERIVED_CONCURRENCY = 64
"""The most connections a throughput target derives (1 is the least). An explicit
``max_concurrency`` may go higher."""

UPLOAD_MEMORY_BOUND = 160 * MiB
"""Upload buffers a saving rank holds at most when ``max_inflight_bytes`` is derived (left
to its default) and ``part_size <= 80 MiB``: ``max_inflight_bytes + part_size`` never
exceeds it. 160 MiB (9 parts in flight and one filling at 16 MiB): only the bytes that are
copied need buffers (small items, framing, a device tensor's copy); a CPU tensor's whole
parts go from its own memory. Measured on s3sim's S3 shaping (1 GiB, 5 large and 512 small
tensors, 16 cores): 144 MiB in flight saves as fast as 224 and 240 (``benchmarks/``,
docs/performance.md), with a peak RSS well under 256 MiB above the state dict."""

READ_CONCURRENCY_FACTOR = 2
"""A load's ranged GETs and a save's part uploads run on this many times the derived
connections (:attr:`TransferConfig.read_concurrency`)."""


class _Unchosen(int):
    """A :class:`TransferConfig` field nobody chose, printed, compared and hashed as
    the number it holds. ``max_concurrency`` and ``max_inflight_bytes``: derived from the
    other fields when the config is built, and derived again by ``dataclasses.replace``, so
    ``replace(tc, part_size=...)`` moves them along. ``max_attempts`` (neither the caller
    nor ``AWS_MAX_ATTEMPTS`` chose it): the S3 store, when it is built, replaces it with the
    AWS profile's ``max_attempts`` (:meth:`TransferConfig.with_profile_attempts`)."""

    __slots__ = ()
    __repr__ = int.__repr__


_DERIVE = _Unchosen(0)
"""Default of the derived fields: "derive me"."""


def _max_attempts_default() -> int:
    """``AWS_MAX_ATTEMPTS`` when set, else :data:`DEFAULT_MAX_ATTEMPTS` (marked as unchosen)."""
    if not (text := os.environ.get("AWS_MAX_ATTEMPTS", "").strip()):
        return _Unchosen(DEFAULT_MAX_ATTEMPTS)
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(
            f"AWS_MAX_ATTEMPTS={text!r}: expected an integer >= 1 (attempts per request, "
            "the first included)"
        )
    return value


@dataclass(frozen=True)
class S3Config:
    """Where and how to reach S3 or an S3-compatible store.

    Credentials are never part of this object: they come from boto3's default chain
    (environment, shared profile, container or instance role), so they never land in
    logs, pickles or checkpoint metadata.
    """

    endpoint_url: str | None = None
    """Endpoint of an S3-compatible store (MinIO, moto, R2 ...). ``None`` uses
    ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` from the environment, else AWS."""

    region: str | None = None
    """Region; ``None`` uses ``AWS_REGION``, else ``AWS_DEFAULT_REGION``, else the profile's
    ``region``, else ``us-east-1`` (the AWS CLI v2's order; boto3 alone reads no
    ``AWS_REGION``)."""

    profile: str | None = None
    """Named profile from ``~/.aws/config`` / ``~/.aws/credentials`` (or the files
    ``AWS_CONFIG_FILE`` / ``AWS_SHARED_CREDENTIALS_FILE`` name); ``None`` uses
    ``AWS_PROFILE``, else the default chain. An unknown profile is a
    :class:`~s3ckpt.errors.ConfigError` when the client is built."""

    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    """Bucket addressing; most self-hosted stores need ``path``. ``auto`` leaves it to the
    AWS profile's ``s3.addressing_style`` when its config file sets one, else to botocore
    (virtual-hosted where the bucket name allows it)."""

    sse_kms_key_id: str | None = None
    """KMS key id or ARN: every object is uploaded with ``aws:kms`` server-side encryption
    under this key."""

    sse_customer_key: bytes | None = field(default=None, repr=False)
    """A 32-byte SSE-C key; sent with every upload *and* read. Never printed."""

    storage_class: str | None = None
    """Storage class for data objects (``STANDARD``, ``INTELLIGENT_TIERING``,
    ``EXPRESS_ONEZONE`` ...); ``None`` leaves the bucket default."""

    checksum_algorithm: Literal["CRC32C", "NONE"] = "CRC32C"
    """Checksum sent with every upload and part so the store verifies what it received.
    Independent of the per-item CRC32C s3ckpt always records in ``s3ckpt.json``."""

    verify_tls: bool = True
    """Verify the endpoint's TLS certificate."""

    verify_after_write: bool | None = None
    """Before a save's commit marker, the coordinator reads every data object (and the
    ``.metadata``) back and checks each item's CRC32C recorded in the manifest; a mismatch
    fails the save (:class:`~s3ckpt.errors.ChecksumMismatchError`) and the previous
    checkpoint stays. ``None`` (auto): on where the store is not known to verify the
    checksums s3ckpt sends (the capability probe, or ``checksum_algorithm="NONE"``), off on
    stores that do (AWS S3). Costs one more read of every byte saved, through the
    coordinator (see docs/dcp.md, "Checksums on the wire")."""

    single_writer: bool = False
    """Opt in to running on a store that does not enforce conditional writes
    (``If-None-Match: *`` / ``If-Match``; s3ckpt probes once per endpoint and bucket). Off,
    saves, overwrites and retention leases refuse with
    :class:`~s3ckpt.errors.ConditionalWritesError` on such a store; on, they warn once per
    process and go on, and *you* guarantee that only one process at a time saves to or
    prunes a prefix (two concurrent writers could then both report success)."""

    def __post_init__(self) -> None:
        for name, allowed, words in (
            ("addressing_style", ("auto", "path", "virtual"), "'auto', 'path', 'virtual'"),
            ("checksum_algorithm", ("CRC32C", "NONE"), "'CRC32C', 'NONE'"),
            ("verify_after_write", (None, True, False), "None (auto), True, False"),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"S3Config.{name}={getattr(self, name)!r}; allowed: {words}")
        if self.sse_customer_key is not None and len(self.sse_customer_key) != 32:
            raise ConfigError("S3Config.sse_customer_key must be exactly 32 bytes (AES-256)")
        if self.sse_customer_key is not None and self.sse_kms_key_id is not None:
            raise ConfigError(
                "S3Config: choose either sse_kms_key_id or sse_customer_key, not both"
            )
        if (url := self.endpoint_url) is not None and not url.startswith(("http://", "https://")):
            raise ConfigError(f"S3Config.endpoint_url={url!r} must start with http:// or https://")

    def sse_args(self, *, upload: bool) -> dict[str, Any]:
        """A request's encryption (SSE-C on every request, SSE-KMS on uploads) and
        storage-class arguments."""
        args: dict[str, Any] = {}
        if self.sse_customer_key is not None:
            args |= {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": self.sse_customer_key}
        elif upload and self.sse_kms_key_id is not None:
            args |= {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": self.sse_kms_key_id}
        if upload and self.storage_class is not None:
            args["StorageClass"] = self.storage_class
        return args

    def resolved_endpoint_url(self) -> str | None:
        """The endpoint in force: the field, else ``AWS_ENDPOINT_URL_S3`` /
        ``AWS_ENDPOINT_URL``, else ``None`` (AWS)."""
        env = os.environ.get
        return self.endpoint_url or env("AWS_ENDPOINT_URL_S3") or env("AWS_ENDPOINT_URL") or None


@dataclass(frozen=True)
class TransferConfig:
    """How many bytes move at once, in what pieces, and how failures are retried.

    Connections: one per :data:`CONNECTION_MBPS` (90 MB/s, AWS's figure) of
    :attr:`target_throughput_gbps`, so the default 10 Gbit/s is 1,250 MB/s on
    ``ceil(1250 / 90) =`` **14** threads (and pooled HTTP connections) per rank, and the
    data's transfers (part uploads, ranged GETs) on twice that, :attr:`read_concurrency`,
    unless :attr:`max_concurrency` is given. :attr:`concurrency` is the number in force.

    Memory: a saving rank holds at most ``max_inflight_bytes + part_size`` bytes of
    upload buffers above the state dict itself (the buffers are reused, never more are
    allocated). Left to its default, ``max_inflight_bytes`` is one part per connection,
    capped so that this sum stays within :data:`UPLOAD_MEMORY_BOUND` (**160 MiB**) for any
    ``part_size`` up to 80 MiB (larger parts: one in flight, ``2 * part_size``). With the
    defaults: 9 x 16 MiB = 144 MiB + 16 MiB = **160 MiB per rank**. (An object over
    10,000 parts gets a larger part, :meth:`part_size_for`, and the bound grows with it to
    ``max(max_inflight_bytes, part) + part``.)

    A save's part uploads and a load's ranged GETs run on :attr:`read_concurrency`
    connections (twice the derived ones: 28 by default). A loading rank streams object
    bodies straight into destination tensors in ``read_chunk_size`` pieces;
    an item that must be decoded or resharded (a slice of a saved chunk, a foreign
    ``torch.save`` item, a non-tensor item) is buffered whole, so the extra memory on load
    is at most :attr:`read_concurrency` such items plus ``read_concurrency *
    read_chunk_size`` (a large item's pieces share one buffer).

    Throttling: with :attr:`adaptive` (the default) the requests of a process to one
    bucket share a congestion window that halves on ``503 SlowDown`` and grows back on
    success (:mod:`s3ckpt.store._adaptive`), so a throttled prefix sees far fewer retries.
    """

    part_size: int = 16 * MiB
    """Multipart part size. S3 allows 5 MiB to 5 GiB and at most 10,000 parts per object,
    so with the default one object holds up to ~156 GiB; larger objects get a larger part
    size automatically (see :meth:`part_size_for`)."""

    max_concurrency: int = _DERIVE
    """Threads per rank for requests; the HTTP connection pool is sized to match.
    Default: derived from :attr:`target_throughput_gbps` (14 for 10 Gbit/s), and part
    uploads and ranged GETs run on twice that (:attr:`read_concurrency`); a value given
    here wins for all of them. Read :attr:`concurrency` for the number in force (this
    field holds it too)."""

    max_inflight_bytes: int = _DERIVE
    """Upload buffers (filled, uploading or waiting) per rank. Must hold at least one
    part; ``max_inflight_bytes // part_size`` parts are in flight at once. Default: one
    part per connection (:attr:`concurrency` parts), at most as many as keep
    ``max_inflight_bytes + part_size <= 160 MiB``: 144 MiB with the defaults."""

    target_object_size: int = 128 * MiB
    """Each rank packs its items into ``ceil(rank_bytes / target_object_size)`` objects
    (at least one) balanced by size. More objects load in parallel without ranged reads."""

    read_request_size: int = 256 * MiB
    """Upper bound on one coalesced ranged GET. Reads of adjacent items of one object are
    merged up to this size (a whole-object GET when the object fits)."""

    coalesce_gap: int = 4 * MiB
    """Two needed byte ranges of one object closer than this are fetched in one request."""

    read_chunk_size: int = 4 * MiB
    """Bytes read from a response body per call when streaming into tensors."""

    max_attempts: int = field(default_factory=_max_attempts_default)
    """Attempts per request (first try included) on throttling, 5xx, timeouts and resets.

    Precedence, as the AWS CLI and SDKs have it: this field when given (the CLI's
    ``--max-attempts``), else ``AWS_MAX_ATTEMPTS`` (read when the config is built), else
    ``max_attempts`` in the AWS profile's config file (applied once, when the S3 store
    is built: the store's ``transfer_config`` holds it), else 8. s3ckpt retries every
    request itself, with one policy
    (:mod:`s3ckpt.store.retry`: exponential back-off with full jitter, like botocore's
    ``standard`` mode); botocore's own retries stay at one attempt, so the two never
    multiply. ``AWS_RETRY_MODE`` / ``retry_mode`` therefore change nothing: s3ckpt's own
    client-side rate limiting is :attr:`adaptive`."""

    retry_initial_delay: float = 0.1
    """First back-off in seconds; doubles per attempt with full jitter."""

    retry_max_delay: float = 10.0
    """Cap on one back-off in seconds."""

    connect_timeout: float = 5.0
    """Seconds to open a connection. A bad hostname fails fast: DNS and refused
    connections are *not* retried."""

    read_timeout: float = 20.0
    """Seconds to the first byte of the reply (and the most seconds without a byte) before
    the attempt is abandoned and retried while :attr:`request_deadline` allows. A healthy
    S3 answers in well under a second; raise it only for links that really pause this long.

    Every attempt also has a **total** deadline: ``read_timeout + bytes / min_rate`` for
    the bytes it sends and receives (:mod:`s3ckpt.store._request`). A reply that drips a
    byte at a time (which a per-read timeout never ends) is cut there and retried."""

    min_rate: float = 256 * KiB
    """The slowest transfer, in bytes per second per connection, that counts as progress.
    An attempt moving ``n`` bytes (a part uploaded, a ranged GET's body) may take
    ``read_timeout + n / min_rate`` seconds in all: a 16 MiB part gets 84 s, a 4 KiB
    commit marker 20 s; a large transfer on a slow but healthy link is never cut. Lower
    it for links slower than this per connection."""

    request_deadline: float = 50.0
    """Seconds one request may spend across all its attempts (and the back-off between them).

    What it buys: a dead or black-holed endpoint (one that accepts connections and never
    answers, or drops them) fails with a clear :class:`~s3ckpt.errors.TransientStoreError`
    in under a minute instead of ``max_attempts x read_timeout``. It decides whether to
    *start* another attempt: after a timeout no new attempt is started that could not
    itself time out before the deadline; each attempt is bounded by its own total deadline
    (:attr:`read_timeout` + bytes / :attr:`min_rate`).

    Bounded time for a whole command: once a request to an endpoint and bucket gave up
    with nothing answered, the endpoint counts as silent and every later request to it
    (until one is answered) gets one short budget, :attr:`cleanup_timeout`, as do cleanup
    requests (a lease release, aborting a failed save's uploads, its failure record). So
    with the defaults every command ends within 60 s of the endpoint going silent."""

    target_throughput_gbps: float = 10.0
    """Network throughput one rank aims for, in Gbit/s (the AWS CRT's
    ``throughput_target_gbps``, same default). Sets the connections when
    :attr:`max_concurrency` is not given: ``ceil(target in MB/s / 90)``, within 1 .. 64
    (10 Gbit/s: 14). Set it to the rank's share of the NIC."""

    adaptive: bool = True
    """Adapt to throttling (AIMD, like TCP): every request attempt of this process to one
    (endpoint, bucket) takes a slot of a shared congestion window that starts at
    :attr:`concurrency`, halves on a throttling answer (``SlowDown``, 503, ``Throttling``;
    once per congestion event), paces request starts once it is down to one and
    throttling goes on, and grows back by one per window of successes. Costs one lock per
    attempt and never waits while nothing is throttled. ``False``: fixed concurrency,
    exponential back-off only (for comparisons). See :mod:`s3ckpt.store._adaptive`."""

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str) -> ConfigError:
            return ConfigError(f"TransferConfig.{name}={getattr(self, name)!r}; allowed: {allowed}")

        if not MIN_PART_SIZE <= self.part_size <= MAX_PART_SIZE:
            raise bad("part_size", "5 MiB <= part_size <= 5 GiB (S3 limits)")
        target = self.target_throughput_gbps
        if isinstance(target, bool) or not isinstance(target, (int, float)):
            raise bad("target_throughput_gbps", "a number of Gbit/s > 0")
        if not 0 < target < math.inf:  # also refuses NaN
            raise bad("target_throughput_gbps", "> 0 (Gbit/s)")
        # Fields nobody chose are derived (again, after dataclasses.replace).
        if type(self.max_concurrency) is _Unchosen:
            # ceil(target MB/s / CONNECTION_MBPS), within 1 .. MAX_DERIVED_CONCURRENCY
            # (10 Gbit/s: 1,250 MB/s, 14 connections).
            n = math.ceil(target * 1000.0 / 8.0 / CONNECTION_MBPS)
            n = max(1, min(MAX_DERIVED_CONCURRENCY, n))
            object.__setattr__(self, "max_concurrency", _Unchosen(n))
        if type(self.max_inflight_bytes) is _Unchosen:
            # One part per connection, at most as many parts as keep ``max_inflight_bytes +
            # part_size`` within UPLOAD_MEMORY_BOUND (one part, at least).
            parts = max(1, min(self.max_concurrency, UPLOAD_MEMORY_BOUND // self.part_size - 1))
            object.__setattr__(self, "max_inflight_bytes", _Unchosen(self.part_size * parts))
        if self.max_inflight_bytes < self.part_size:
            raise bad("max_inflight_bytes", f">= part_size ({self.part_size})")
        for name, least, words in (
            ("max_concurrency", 1, ">= 1"),
            ("target_object_size", 1, ">= 1"),
            ("read_request_size", MiB, ">= 1 MiB"),
            ("coalesce_gap", 0, ">= 0"),
            ("read_chunk_size", 64 * KiB, ">= 64 KiB"),
            ("max_attempts", 1, ">= 1"),
        ):
            if getattr(self, name) < least:
                raise bad(name, words)
        if self.retry_initial_delay < 0 or self.retry_max_delay < self.retry_initial_delay:
            raise bad("retry_max_delay", ">= retry_initial_delay >= 0")
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise bad("connect_timeout", "connect_timeout > 0 and read_timeout > 0")
        if not self.request_deadline > 0:  # also refuses NaN
            raise bad("request_deadline", "> 0 (seconds)")
        if not self.min_rate > 0:
            raise bad("min_rate", "> 0 (bytes per second)")

    @property
    def cleanup_timeout(self) -> float:
        """Seconds the requests of one cleanup share (releasing a lease, aborting a failed
        save's uploads, its failure record), and the budget of each request to an endpoint
        that went silent: :attr:`connect_timeout` (5 s by default, at most
        :attr:`request_deadline`), enough for an endpoint that answers at all."""
        return min(self.request_deadline, self.connect_timeout)

    @property
    def attempts_from_profile(self) -> bool:
        """Whether the AWS profile's ``max_attempts`` would count: neither the caller nor
        ``AWS_MAX_ATTEMPTS`` chose :attr:`max_attempts`."""
        return type(self.max_attempts) is _Unchosen

    def with_profile_attempts(self, max_attempts: int | None) -> TransferConfig:
        """This config with the AWS profile's ``max_attempts`` (``None``: the profile sets
        none) applied where neither the caller nor ``AWS_MAX_ATTEMPTS`` chose a value.

        Raises:
            ConfigError: The profile's value is not an integer >= 1.
        """
        if max_attempts is None or not self.attempts_from_profile:
            return self
        if max_attempts < 1:
            raise ConfigError(
                f"max_attempts = {max_attempts} in the AWS config file; expected an integer >= 1"
            )
        return replace(self, max_attempts=int(max_attempts))

    @property
    def concurrency(self) -> int:
        """Threads (and HTTP connections) per rank in force: :attr:`max_concurrency` when
        given, else derived from :attr:`target_throughput_gbps`."""
        return int(self.max_concurrency)

    @property
    def read_concurrency(self) -> int:
        """Threads (and HTTP connections) per rank that move a checkpoint's data: a load's
        ranged GETs and a save's part uploads (``dcp.save``, ``export``, accelerate's
        ``save_model``). Twice :attr:`concurrency` when that is derived (28 for 10 Gbit/s;
        at most :data:`MAX_DERIVED_CONCURRENCY`), else the ``max_concurrency`` given.

        Why more than ``target / 90 MB/s``: every request's first byte takes ~30 ms on S3
        and a connection carries ~85 MB/s at best, so that many connections reach the
        target only if every request streams at full speed from its first millisecond; the
        AWS CRT opens about as many (10 per 4 Gbit/s). Neither side needs buffers for the
        extra connections (a load's bytes land in the destination tensors; a save's extra
        parts go from the tensors' own memory, its pool of buffers stays
        :attr:`max_inflight_bytes`), so the cost is threads and sockets. Measured on s3sim's
        S3 shaping (1 GiB, 2 cores, ``dcp.save`` / ``dcp.load``): loads 14 connections
        ~800 MB/s, 28 ~1,200; saves 14 ~630 MB/s, 20 ~700-750, 28 ~700-750 (large5) and
        ~560-620 against ~660-750 (mix; docs/performance.md)."""
        n = int(self.max_concurrency)
        if type(self.max_concurrency) is _Unchosen:
            return max(n, min(MAX_DERIVED_CONCURRENCY, READ_CONCURRENCY_FACTOR * n))
        return n

    @property
    def max_inflight_parts(self) -> int:
        """Parts of :attr:`part_size` in flight per rank: ``max_inflight_bytes //
        part_size`` (one, at least); :meth:`upload_buffers` less the one being filled."""
        return self.upload_buffers(self.part_size) - 1

    def upload_buffers(self, part_size: int) -> int:
        """The buffers an upload pool holds for parts of ``part_size`` bytes (the
        configured :attr:`part_size`, or the larger one :meth:`part_size_for` gives a big
        object): ``max(1, max_inflight_bytes // part_size)`` parts in flight and the one
        being filled. The one place this count is derived; the pool's memory,
        ``upload_buffers(part) * part``, stays within the bound of the class docs."""
        return max(1, self.max_inflight_bytes // part_size) + 1

    def part_size_for(self, object_size: int) -> int:
        """Part size that keeps an object of ``object_size`` bytes within 10,000 parts."""
        size = self.part_size
        while object_size > size * MAX_PARTS:
            size *= 2
        if size > MAX_PART_SIZE:
            raise ConfigError(
                f"object of {object_size} bytes exceeds S3's 5 TiB object limit; "
                "lower TransferConfig.target_object_size"
            )
        return size
