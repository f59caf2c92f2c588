"""s3ckpt.uri's location helpers: local paths become file:// URLs, URLs pass through."""

from __future__ import annotations

from pathlib import Path

import pytest

from s3ckpt.errors import InvalidURLError
from s3ckpt.uri import StoreURL, as_url, parse_location, parse_url, split_prefix


def test_as_url_passes_urls_through_and_resolves_local_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert as_url("s3://bkt/run/step_1") == "s3://bkt/run/step_1"
    assert as_url("memory://bkt/x") == "memory://bkt/x"
    monkeypatch.chdir(tmp_path)
    assert as_url("ckpt") == f"file://{tmp_path.resolve()}/ckpt"
    assert as_url(Path("a") / "b") == f"file://{tmp_path.resolve()}/a/b"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert as_url("~/c") == f"file://{tmp_path.resolve()}/c"


def test_parse_location_takes_urls_paths_and_parsed_urls(tmp_path: Path) -> None:
    url = parse_url("s3://bkt/run")
    assert parse_location(url) is url
    assert parse_location("s3://bkt/run") == StoreURL("s3", "bkt", "run/")
    local = parse_location(tmp_path / "ckpt")
    assert (local.scheme, local.bucket) == ("file", "")
    assert local.prefix == str(tmp_path.resolve() / "ckpt").lstrip("/") + "/"
    with pytest.raises(InvalidURLError, match="invalid S3 bucket name"):
        parse_location("s3://Bad_Bucket/run")


@pytest.mark.parametrize(
    ("prefix", "parent", "name"),
    [
        ("runs/a/step_1/", "runs/a/", "step_1"),
        ("step_1/", "", "step_1"),
        ("", "", ""),
        ("runs/a//", "runs/a/", ""),  # one trailing "/" is dropped, never more
        ("runs/a", "runs/", "a"),
    ],
)
def test_split_prefix_parts_a_prefix_into_its_parent_and_last_segment(
    prefix: str, parent: str, name: str
) -> None:
    assert split_prefix(prefix) == (parent, name)


def test_a_checkpoint_url_is_its_runs_child() -> None:
    url = parse_url("s3://bkt/runs/a/step_1/")
    assert (url.parent, url.name) == (parse_url("s3://bkt/runs/a/"), "step_1")
    assert url.parent.child(url.name) == url
    root = parse_url("s3://bkt/")
    assert (root.parent, root.name) == (root, "")
