"""Hostile URLs (issue 27, item 9): a control character anywhere in a URL or path is refused
before urlsplit can drop it (``run/a\\nb`` must never save under ``run/ab``), and so is a
prefix too long for S3's 1,024-byte keys once s3ckpt's own names are appended."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3ckpt._step_names import MAX_STEP_DIGITS
from s3ckpt.cli import main
from s3ckpt.errors import InvalidURLError
from s3ckpt.format import HashedPrefixes
from s3ckpt.format._names import (
    MANIFEST_NAME,
    PIN_NAME,
    checkpoint_name,
    data_name,
    heartbeat_name,
    metadata_name,
    shard_name,
)
from s3ckpt.store import open_store
from s3ckpt.uri import (
    MAX_KEY_BYTES,
    MAX_PREFIX_BYTES,
    RESERVED_KEY_BYTES,
    as_url,
    parse_location,
    parse_url,
)

CONTROL = [chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]]
PROPS = settings(max_examples=300, deadline=None)

# Key text without control characters, surrogates, or what a URL gives a meaning to.
safe_text = st.text(
    st.characters(
        blacklist_categories=["Cc", "Cs"], blacklist_characters=["/", "?", "#", "\\", "%"]
    ),
    min_size=1,
    max_size=30,
)


@pytest.mark.parametrize("ch", CONTROL, ids=[f"U+{ord(c):04X}" for c in CONTROL])
def test_every_control_character_is_refused_with_its_position(ch: str) -> None:
    url = f"s3://bucket/run/a{ch}b/"
    with pytest.raises(InvalidURLError) as info:
        parse_url(url)
    message = str(info.value)
    assert f"{ch!r}" in message and f"U+{ord(ch):04X}" in message, message
    assert "position 17" in message, message


@PROPS
@given(head=safe_text, tail=safe_text, ch=st.sampled_from(CONTROL))
def test_a_control_character_anywhere_is_refused_by_every_entry(
    head: str, tail: str, ch: str
) -> None:
    for url in (f"s3://bucket/{head}{ch}{tail}", f"memory://b/{head}{ch}{tail}"):
        for parse in (parse_url, parse_location, open_store):
            with pytest.raises(InvalidURLError, match=re.escape(f"position {url.index(ch)}")):
                parse(url)  # type: ignore[operator]
    with pytest.raises(InvalidURLError):
        as_url(f"/tmp/{head}{ch}{tail}")  # a local path, before it is resolved


@PROPS
@given(segments=st.lists(safe_text, min_size=1, max_size=4))
def test_a_url_without_control_characters_keeps_every_character(segments: list[str]) -> None:
    """What parses names exactly the key the user wrote: nothing is dropped on the way
    (whitespace around the whole URL is no part of it, and is stripped)."""
    path = "/".join(segments).strip()
    try:
        url = parse_url(f"s3://bucket/{path}")
    except InvalidURLError as exc:
        assert "empty path segment" in str(exc) or "prefix of" in str(exc)
        return
    assert url.prefix == (path if not path or path.endswith("/") else path + "/")


def test_newline_tab_and_cr_are_not_dropped_silently() -> None:
    for ch in "\n\r\t":
        with pytest.raises(InvalidURLError):
            parse_url(f"s3://bucket/run/a{ch}b")
    assert parse_url("s3://bucket/run/ab").prefix == "run/ab/"


def test_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(InvalidURLError, match=r"not valid Unicode.*position 16"):
        parse_url("s3://bucket/run/\ud800")


def test_prefixes_longer_than_s3_allows_are_refused_in_utf8_bytes() -> None:
    room = MAX_PREFIX_BYTES - 1  # the prefix ends in "/"
    assert parse_url("s3://bucket/" + "a" * room).prefix == "a" * room + "/"
    with pytest.raises(InvalidURLError, match=f"at most {MAX_PREFIX_BYTES}: shorten it by 1"):
        parse_url("s3://bucket/" + "a" * (room + 1))
    # Three bytes each in UTF-8: the limit is on bytes, not characters.
    with pytest.raises(InvalidURLError, match="prefix of"):
        parse_url("s3://bucket/" + "€" * (room // 3 + 1))
    assert parse_url("file:///tmp/" + "a" * 2000).scheme == "file"  # the file system's own rules


def test_the_reserve_covers_every_name_s3ckpt_appends() -> None:
    """The longest run-relative tail of a key s3ckpt writes: a checkpoint folder with the
    largest step, then the longest per-save name (ten-digit ranks) or hashed shard key."""
    tag, rank, i = "ffffffff", 10**10 - 1, 99_999
    folder = checkpoint_name(10**MAX_STEP_DIGITS - 1) + "/"
    ckpt = "run/" + folder
    layout = HashedPrefixes(4096)
    names = [
        data_name(rank, i, tag),
        heartbeat_name(tag, rank),
        metadata_name(tag),
        MANIFEST_NAME,
        PIN_NAME,
        layout.key(ckpt, shard_name(rank, i, tag))[len(ckpt) :],
    ]
    longest = len(folder) + max(len(n.encode()) for n in names)
    assert longest <= RESERVED_KEY_BYTES, (longest, names)
    assert MAX_PREFIX_BYTES + RESERVED_KEY_BYTES == MAX_KEY_BYTES == 1024


def test_the_cli_refuses_a_control_character_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["ls", "s3://bucket/run/a\nb"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'\\n' (U+000A) at position 17" in err, err


def test_the_checkpointer_and_dcp_refuse_a_control_character() -> None:
    pytest.importorskip("torch")
    from s3ckpt import Checkpointer, S3StorageReader, S3StorageWriter

    for make in (Checkpointer, S3StorageWriter, S3StorageReader):
        with pytest.raises(InvalidURLError, match="U\\+0001"):
            make("s3://bucket/run/a\x01b")  # type: ignore[operator]
