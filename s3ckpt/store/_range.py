"""The S3 store's ranged-read stream: one GET streamed into the caller's buffers, resumed
at the offset reached when the body breaks off."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from tenacity import RetryCallState, retry_if_exception

from s3ckpt.errors import StoreError
from s3ckpt.metrics.instrument import record_retry
from s3ckpt.store._body import SocketBody, body_socket, shutdown_socket, socket_body
from s3ckpt.store._deadline import AttemptTimedOut, Watch, start_watch
from s3ckpt.store._errors import is_transient, map_error
from s3ckpt.store.base import S3Requests

__all__ = ["S3RangeReader"]

log = logging.getLogger(__name__)


class S3RangeReader:
    """A ranged GET whose body is streamed; resets mid-body resume at the current offset.

    When the range's length is known, the body is read from the socket straight into the
    caller's buffer where :func:`~s3ckpt.store._body.socket_body` allows it, else through
    botocore's ``StreamingBody.read``. A body that ends before the range does (a
    connection closed early) is treated like a reset.

    A failed read is retried under the store's ``retry_policy`` by a new GET from the
    current offset. Attempts count over the whole stream (``attempts_used``); the deadline
    counts from the start of each :meth:`readinto` call, so a long transfer that keeps
    making progress is never cut by it. Each GET's body has a total deadline,
    ``read_timeout + bytes / min_rate`` from the reply (a
    :class:`~s3ckpt.store._deadline.Watch` shuts the body's socket down when it passes),
    so a body that drips a byte at a time ends in a timeout, resumed and then reported
    like any other.
    """

    def __init__(self, store: S3Requests, key: str, start: int, length: int | None) -> None:
        self._store = store
        self._key = key
        self._pos = start
        self._end = None if length is None else start + length  # exclusive
        self._body: Any = None
        self._direct: SocketBody | None = None  # set when reading the socket directly
        self._watch: Watch | None = None  # the open body's total deadline
        self._failures = 0
        self._opened = 0.0  # when the open GET was sent
        # When the first GET cut for being too slow (its Watch expired) was sent:
        # request_deadline counts from it for every later resume. A body that drips a byte
        # at a time makes some progress on each attempt, so per-read starts would never add
        # up to a deadline; a body that moves at min_rate or faster is never cut by it.
        self._slow_since: float | None = None

    def _open(self) -> None:
        last = None if self._end is None else self._end - 1
        self._opened = time.monotonic()
        resp = self._store._get_object(self._key, self._pos, last)
        body = self._body = resp["Body"]
        tc = self._store.transfer_config
        length = int(resp.get("ContentLength") or 0)
        self._watch = start_watch(tc.read_timeout, tc.min_rate, nbytes=length)
        self._watch.guard(lambda: shutdown_socket(body_socket(body)))
        self._check_range(resp.get("ContentRange"))
        if self._end is not None:
            self._direct = socket_body(self._body, self._end - self._pos)

    def _check_range(self, content_range: str | None) -> None:
        # A server that ignores Range answers 200 with the object from byte 0.
        first = 0
        if content_range:
            try:
                first = int(content_range.split()[1].split("-")[0])
            except (IndexError, ValueError):
                first = -1
        if first != self._pos:
            self.close()
            raise StoreError(
                f"asked for bytes from {self._pos} and got {content_range or 'the whole object'}"
                "; the endpoint does not honour HTTP Range requests, which s3ckpt needs",
                bucket=self._store.bucket,
                key=self._key,
                operation="get",
            )

    def readinto(self, buffer: memoryview) -> int:
        """Read up to ``len(buffer)`` bytes; ``0`` at the end of the range or object."""
        want = len(buffer) if self._end is None else min(len(buffer), self._end - self._pos)
        if self._end is not None and want <= 0:
            return 0
        started = time.monotonic()
        try:
            try:
                return self._read(buffer, want)
            except StoreError:
                raise
            except Exception as exc:  # resumed, or mapped, by the retry policy
                return self._resume(buffer, want, exc, started)
        except StoreError as exc:
            if exc.code == "InvalidRange":
                return 0  # the object ends before the range starts
            raise

    def _read(self, buffer: memoryview, want: int) -> int:
        """One read, opening the GET first when none is open; a failure closes it."""
        try:
            if self._body is None:
                self._open()
            elif self._watch is not None:
                self._watch.resume()
            try:
                if self._direct is not None:
                    n = self._direct.readinto(buffer[:want])
                else:
                    chunk = self._body.read(want)
                    n = len(chunk)
                    buffer[:n] = chunk
            except Exception as exc:
                watch = self._watch
                if watch is not None and watch.expired:
                    if self._slow_since is None:
                        self._slow_since = self._opened
                    tc = self._store.transfer_config
                    raise AttemptTimedOut(
                        f"the body ({watch.nbytes} bytes) not read within {watch.limit:.1f} s "
                        f"(read_timeout={tc.read_timeout:g} s + min_rate={tc.min_rate:g} B/s)"
                    ) from exc
                raise
        except StoreError:
            raise
        except Exception:
            self.close()
            self._failures += 1
            raise
        self._pos += n
        if self._watch is not None and (n == 0 or self._pos == self._end):
            self._watch.finish()  # read: its connection may serve another request now
            self._watch = None
        elif self._watch is not None:
            # Until the next read the caller works on these bytes (decodes items, copies
            # them): its time, not the endpoint's, so it never cuts a body that moves.
            self._watch.pause()
        return n

    def _resume(self, buffer: memoryview, want: int, failure: Exception, started: float) -> int:
        """Retry the read that raised ``failure`` (attempt 1 of the policy's loop) from the
        offset reached, or raise the mapped error when the policy gives up."""
        store = self._store
        replay = [failure]
        if self._slow_since is not None:
            started = min(started, self._slow_since)

        def attempt() -> int:
            if replay:
                raise replay.pop()
            return self._read(buffer, want)

        resumed = store.retry_policy.retrying(
            retry=retry_if_exception(is_transient),
            since=started,
            attempts_used=self._failures - 1,
            before_sleep=self._log_resume,
        )
        try:
            return resumed(attempt)
        except StoreError:
            raise
        except Exception as exc:
            raise map_error(
                exc,
                operation="get",
                bucket=store.bucket,
                key=self._key,
                endpoint=store.endpoint_url,
                attempts=self._failures,
                elapsed=time.monotonic() - started,
                transfer_config=store.transfer_config,
            ) from exc

    def _log_resume(self, state: RetryCallState) -> None:
        record_retry("get")  # the GET that resumes is counted as a request by call()
        exc = state.outcome.exception() if state.outcome is not None else None
        log.debug(
            "resuming GET s3://%s/%s at %d after %r", self._store.bucket, self._key, self._pos, exc
        )

    def close(self) -> None:
        """Close the GET in flight, if any."""
        self._direct = None
        if self._watch is not None:
            self._watch.finish()
            self._watch = None
        with contextlib.suppress(Exception):  # closing a broken stream can itself fail
            if self._body is not None:
                self._body.close()
        self._body = None
