"""Each fallback of the socket read shortcut (``s3ckpt.store._body``), forced, against moto.

The shortcut reads a ranged GET's body from ``http.client`` under botocore's
``StreamingBody`` through private botocore/urllib3 names. Where the probe fails, a name is
missing or a response has another shape, the body is read through the public
``StreamingBody.read``; every case here forces one of those and checks every byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.response import StreamingBody

from s3ckpt.store import _body
from s3ckpt.store.s3 import S3Store

pytestmark = pytest.mark.integration

MiB = 1 << 20
DATA = bytes(range(251)) * (3 * MiB // 251)  # a prime period: a shifted byte shows
START, LENGTH = 12345, 2 * MiB + 777


@pytest.fixture
def store(bucket: str) -> Iterator[S3Store]:
    s = S3Store(bucket)
    s.put("obj", DATA)
    yield s


def _read(store: S3Store, key: str = "obj") -> tuple[bytes, bool]:
    """``DATA[START:START + LENGTH]`` as the range reader delivers it in 1 MiB reads, and
    whether it read the socket directly."""
    out = bytearray(LENGTH)
    view = memoryview(out)
    stream: Any = store.open_range(key, START, LENGTH)
    direct = []
    try:
        got = 0
        while got < LENGTH:
            n = stream.readinto(view[got : got + MiB])
            assert n > 0, f"stream ended at {got} of {LENGTH}"
            direct.append(stream._direct is not None)
            got += n
        assert stream.readinto(memoryview(bytearray(1))) == 0
    finally:
        stream.close()
    assert len(set(direct)) == 1, "one GET is read one way"
    return bytes(out), direct[0]


def _patch_get(monkeypatch: pytest.MonkeyPatch, change: Callable[[dict[str, Any]], None]) -> None:
    """Let ``change`` alter every GET response before the range reader sees it."""
    real = S3Store._get_object

    def get_object(self: S3Store, key: str, first: int, last: int | None) -> Any:
        resp = real(self, key, first, last)
        change(resp)
        return resp

    monkeypatch.setattr(S3Store, "_get_object", get_object)


def test_the_shortcut_is_taken_where_nothing_forces_a_fallback(store: S3Store) -> None:
    assert _body.shortcut_available()
    assert _read(store) == (DATA[START : START + LENGTH], True)


def test_a_failed_probe_reads_every_body_through_streaming_body(
    store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_body, "_probe", lambda: False)
    _body.shortcut_available.cache_clear()
    try:
        assert not _body.shortcut_available()
        assert _read(store) == (DATA[START : START + LENGTH], False)
    finally:
        _body.shortcut_available.cache_clear()


@pytest.mark.parametrize("name", ["_RAW_STREAM", "_FP", "_RELEASE_CONN"])
def test_the_probe_fails_without_each_private_name(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _body._probe()
    monkeypatch.setattr(_body, name, "_no_such_attribute")
    assert not _body._probe()


@pytest.mark.parametrize("name", ["_RAW_STREAM", "_FP", "_RELEASE_CONN"])
def test_a_response_without_a_private_name_is_read_through_streaming_body(
    store: S3Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_body, "shortcut_available", lambda: True)  # the probe saw the real names
    monkeypatch.setattr(_body, name, "_no_such_attribute")
    assert _read(store) == (DATA[START : START + LENGTH], False)


def test_a_wrapped_body_is_read_through_its_own_read(
    store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As botocore's checksum-validating body: a StreamingBody subclass with its own read.
    class Wrapped(StreamingBody):
        pass

    def wrap(resp: dict[str, Any]) -> None:
        resp["Body"].__class__ = Wrapped

    _patch_get(monkeypatch, wrap)
    assert _read(store) == (DATA[START : START + LENGTH], False)


def test_a_content_encoded_body_is_read_through_streaming_body(
    store: S3Store, s3_client: Any
) -> None:
    s3_client.put_object(Bucket=store.bucket, Key="enc", Body=DATA, ContentEncoding="gzip")
    assert _read(store, "enc") == (DATA[START : START + LENGTH], False)


def test_bytes_buffered_above_the_socket_are_read_through_streaming_body(
    store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def buffer_it(resp: dict[str, Any]) -> None:
        raw = resp["Body"]._raw_stream
        if not hasattr(raw, "_decoded_buffer"):
            pytest.skip("this urllib3 keeps no decoded buffer")
        raw._decoded_buffer.put(raw._fp.read())  # the whole body now sits in urllib3

    _patch_get(monkeypatch, buffer_it)
    assert _read(store) == (DATA[START : START + LENGTH], False)


def test_a_body_already_read_from_is_read_through_streaming_body(
    store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # StreamingBody counts what it handed out; any count means the socket is not at byte 0
    # of the range for the shortcut (the count is set here without reading, so the bytes
    # StreamingBody.read delivers are still the whole range).
    def mark_read(resp: dict[str, Any]) -> None:
        resp["Body"]._amount_read = 1

    _patch_get(monkeypatch, mark_read)
    assert _read(store) == (DATA[START : START + LENGTH], False)
