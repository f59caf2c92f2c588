"""The process's boto3 S3 clients: built here (the only place s3ckpt builds one) and shared
by every :class:`~s3ckpt.store.s3.S3Store` of a process with equal settings.

One boto3 client per process and configuration: every :class:`~s3ckpt.store.s3.S3Store` in
a process whose ``S3Config``, client settings of its ``TransferConfig`` (pool size,
timeouts), ``AWS_*`` environment and AWS config and credentials files are the same shares
one client (:func:`shared_client`), whatever its bucket. A Checkpointer, the writers and
readers it makes, and a reader built separately for the same endpoint therefore open one
connection pool and read the credential chain once. boto3 clients are thread-safe; the
cache is keyed by process id, so a forked or spawned child builds its own.

The client's region follows the AWS CLI v2: ``S3Config.region``, ``AWS_REGION``,
``AWS_DEFAULT_REGION``, the profile's ``region``, else ``us-east-1``. An unknown profile is a
:class:`~s3ckpt.errors.ConfigError` raised before any request.

botocore's own retries are turned off (one attempt): s3ckpt retries every request itself
(:mod:`s3ckpt.store.retry`), so the two never multiply.

Every attempt has a total deadline (:class:`~s3ckpt.store._request.Watch`), which a socket's
read timeout cannot give (it starts again with every byte). The client's connections
register with the attempt running on their thread (:func:`_watch_connections`): the
bytes they send and the reply's ``Content-Length`` extend its deadline at ``min_rate``,
and at the deadline their socket is shut down, which wakes a thread blocked on a dripping
reply. This needs botocore's private ``_endpoint.http_session._pool_classes_by_scheme``;
where it differs, requests keep their per-read timeouts only (ranged GET bodies are
still watched, :mod:`s3ckpt.store._body`) and a debug line says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import boto3
import botocore.session
from botocore.config import Config as BotoConfig
from botocore.exceptions import ProfileNotFound

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import ConfigError
from s3ckpt.store._body import SOCKET_ATTR, shutdown_socket
from s3ckpt.store._cache import ProcessCache
from s3ckpt.store._request import current_watch

log = logging.getLogger(__name__)

__all__ = ["MAX_SHARED_CLIENTS", "aws_environment", "profile_attempts", "shared_client"]


def _session(cfg: S3Config) -> botocore.session.Session:
    """A botocore session for ``cfg.profile`` (``None``: ``AWS_PROFILE``, else the default
    chain).

    Raises:
        ConfigError: The profile is in neither AWS file: naming it, where it came from and
            where profiles are read from.
    """
    try:
        session = botocore.session.Session(profile=cfg.profile)
        session.get_scoped_config()  # raises ProfileNotFound for an unknown profile
        return session
    except ProfileNotFound as exc:
        name = exc.kwargs.get("profile") or cfg.profile
        source = "--profile / S3Config.profile" if cfg.profile else "AWS_PROFILE"
        config_file, creds_file = _aws_files()
        raise ConfigError(
            f"AWS profile {name!r} (from {source}) is in neither {config_file} nor "
            f"{creds_file} (AWS_CONFIG_FILE / AWS_SHARED_CREDENTIALS_FILE choose other "
            "files): name a profile listed by `aws configure list-profiles`, or create it "
            f"with `aws configure --profile {name}`"
        ) from None


def _aws_files() -> tuple[str, str]:
    """The AWS config and shared-credentials files botocore reads."""
    config = os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config"
    return config, os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials"


def _setting(session: botocore.session.Session, name: str) -> Any:
    """A botocore setting: its environment variable, else the profile's config file."""
    try:
        return session.get_config_variable(name)
    except ValueError as exc:  # a value botocore cannot convert (max_attempts = many)
        raise ConfigError(f"{name} in the AWS config file or environment: {exc}") from None


def _region(cfg: S3Config, session: botocore.session.Session) -> str:
    """The region a client for ``cfg`` uses, in the AWS CLI v2's order: ``cfg.region``
    (``--region``), ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the profile's ``region``, else
    ``us-east-1``. botocore itself reads ``AWS_DEFAULT_REGION`` and the profile only."""
    return (
        cfg.region
        or os.environ.get("AWS_REGION", "").strip()
        or _setting(session, "region")
        or "us-east-1"
    )


#: Clients :func:`shared_client` keeps (least recently used out). A store keeps the client it was
#: given, so an evicted client lives on in the stores that use it.
MAX_SHARED_CLIENTS = 16

_clients: ProcessCache[tuple[Any, ...], Any] = ProcessCache(MAX_SHARED_CLIENTS)


def _file_stamp(path: str) -> tuple[int, int, int] | None:
    """``(inode, size, mtime in ns)`` of ``path``, or ``None`` when it cannot be read."""
    with contextlib.suppress(OSError):
        st = os.stat(os.path.expanduser(path))
        return (st.st_ino, st.st_size, st.st_mtime_ns)
    return None


def aws_environment() -> tuple[Any, ...]:
    """Every ``AWS_*`` variable (endpoint, region, profile, credentials, attempts) and the
    state of the two AWS files: what a client and a store's resolved settings depend on
    beyond their configs. Part of the client cache's key here, and of the store cache's
    (:mod:`s3ckpt.store._location`), so a changed environment or profile gets a new client
    and store, as it would without the caches."""
    aws_env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    return (aws_env, tuple(_file_stamp(path) for path in _aws_files()))


def profile_attempts(cfg: S3Config, tc: TransferConfig) -> TransferConfig:
    """``tc`` with the AWS profile's ``max_attempts`` applied where neither the caller nor
    ``AWS_MAX_ATTEMPTS`` chose (:meth:`TransferConfig.with_profile_attempts`): what an
    :class:`~s3ckpt.store.s3.S3Store` holds, resolved once when it is built.

    Reads the profile only when it could count. A profile that cannot be used (unknown, or
    a ``max_attempts`` that is not an integer >= 1) leaves ``tc`` as it is: building the
    client raises that :class:`~s3ckpt.errors.ConfigError` before the first request, as
    it always did.
    """
    if tc.attempts_from_profile:
        with contextlib.suppress(ConfigError):
            return tc.with_profile_attempts(_setting(_session(cfg), "max_attempts"))
    return tc


def shared_client(s3_config: S3Config, transfer_config: TransferConfig) -> Any:
    """The process's boto3 S3 client for these settings.

    Built on first use and shared from then on (see the module docs for the key).
    Thread-safe: concurrent first calls build one client.

    Raises:
        ConfigError: an unknown profile, or a setting botocore cannot read (nothing is
            cached then).
    """
    # What a client is built from: the process, the config, the client settings of the
    # transfer config and aws_environment() (a client keeps the credentials it resolved;
    # refreshable ones, such as an instance role's, refresh themselves).
    tc = transfer_config
    key = (os.getpid(), s3_config, tc.read_concurrency, tc.connect_timeout, tc.read_timeout)
    return _clients.get((*key, aws_environment()), lambda: _new_client(s3_config, tc))


def _new_client(cfg: S3Config, tc: TransferConfig) -> Any:
    """A new boto3 S3 client for ``cfg`` and ``tc``.

    Raises:
        ConfigError: an unknown profile, or a profile ``max_attempts`` that is not an
            integer >= 1 (the store's settings were resolved without it,
            :func:`profile_attempts`): here, before the first request.
    """
    session = _session(cfg)
    tc.with_profile_attempts(_setting(session, "max_attempts"))  # only checks the value
    s3_opts: dict[str, Any] = {}
    if cfg.addressing_style != "auto":  # "auto" leaves the profile's s3.addressing_style
        s3_opts["addressing_style"] = cfg.addressing_style
    if cfg.checksum_algorithm == "CRC32C":
        # Every body we send carries a CRC32C the store verifies, so signing the
        # payload's SHA-256 as well only burns client CPU (botocore already skips it on
        # HTTPS when a checksum is present; this makes http:// endpoints match).
        s3_opts["payload_signing_enabled"] = False
    boto_cfg = BotoConfig(
        # s3ckpt retries every request itself (store/retry.py); a Config value wins over
        # AWS_MAX_ATTEMPTS and the config file in botocore, so botocore never retries too.
        retries={"total_max_attempts": 1, "mode": "standard"},
        # One connection per upload / read thread, and a few for the requests made
        # beside them (completes, heartbeats, the caller's own).
        max_pool_connections=tc.read_concurrency + 4,
        connect_timeout=tc.connect_timeout,
        read_timeout=tc.read_timeout,
        tcp_keepalive=True,
        s3=s3_opts,
        # s3ckpt computes and checks CRC32C end to end; botocore's own default checksums
        # would hash every byte a second time.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    client = boto3.session.Session(botocore_session=session).client(
        "s3",
        endpoint_url=cfg.resolved_endpoint_url(),
        region_name=_region(cfg, session),
        config=boto_cfg,
        verify=cfg.verify_tls,
    )
    _watch_connections(client)
    return client


def _header_length(headers: Any) -> int:
    """The ``Content-Length`` in ``headers`` (any mapping), or 0."""
    items = (headers or {}).items()
    with contextlib.suppress(TypeError, ValueError):
        return next((int(v) for k, v in items if str(k).lower() == "content-length"), 0)
    return 0


def _watched_pool(pool: Any) -> Any:
    """A subclass of botocore's connection pool class ``pool`` whose connections register
    with the attempt running on their thread (:func:`~s3ckpt.store._request.current_watch`)."""
    base = pool.ConnectionCls

    class WatchedConnection(base):  # type: ignore[misc, valid-type]
        def request(self, *args: Any, **kwargs: Any) -> Any:  # (method, url, body, headers)
            watch = current_watch()
            if watch is not None:
                watch.guard(lambda: shutdown_socket(self.sock))
                headers = kwargs.get("headers", args[3] if len(args) > 3 else None)
                watch.add_bytes(_header_length(headers))
            return super().request(*args, **kwargs)

        def getresponse(self, *args: Any, **kwargs: Any) -> Any:
            sock = self.sock  # the reply may take it over (Connection: close)
            watch = current_watch()
            if watch is not None:
                watch.guard(lambda: shutdown_socket(sock))
            response = super().getresponse(*args, **kwargs)
            setattr(response, SOCKET_ATTR, sock)  # for a streamed body's reads (S3RangeReader)
            if watch is not None:
                watch.add_bytes(_header_length(getattr(response, "headers", None)))
            return response

    return type(pool.__name__, (pool,), {"ConnectionCls": WatchedConnection})


def _watch_connections(client: Any) -> None:
    """Make ``client``'s connections register with their thread's attempt (module docs),
    unless botocore's private names differ (then a debug line says so)."""
    try:
        classes = client._endpoint.http_session._pool_classes_by_scheme
        classes.update({scheme: _watched_pool(pool) for scheme, pool in classes.items()})
    except (AttributeError, TypeError):  # (classes is the dict the pool managers read)
        log.debug(
            "botocore's HTTP session differs from what s3ckpt knows: requests are "
            "bounded by their per-read timeouts only"
        )
