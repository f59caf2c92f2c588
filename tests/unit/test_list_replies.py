"""Issue 38 item 3: a ListObjectsV2 page is judged by what it can prove. A store whose
KeyCount counts only objects (s3rver with a delimiter) is believed; a page that cannot be
followed or whose count matches nothing it holds is an incomplete reply."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from s3ckpt.store import _reply

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
S3RVER_PAGE: dict[str, Any] = {  # what s3rver 3.7.1 answers for Prefix="run/", Delimiter="/"
    "IsTruncated": False,
    "KeyCount": 0,
    "CommonPrefixes": [{"Prefix": "run/step_000000001/"}],
}


def _check(page: dict[str, Any]) -> None:
    _reply.check_list_page(page, bucket="b", prefix="run/")


def test_a_key_count_of_objects_only_is_believed() -> None:
    _check(S3RVER_PAGE)
    _check({**S3RVER_PAGE, "KeyCount": 1})  # S3's count: objects and prefixes
    objects = [{"Key": "run/latest", "Size": 3, "LastModified": NOW}]
    _check({**S3RVER_PAGE, "Contents": objects, "KeyCount": 1})
    _check({"IsTruncated": False, "Contents": objects})  # no KeyCount at all


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"IsTruncated": True}, "no NextContinuationToken on a truncated page"),
        ({"IsTruncated": True, "NextContinuationToken": ""}, "no NextContinuationToken"),
        ({"IsTruncated": None}, "no IsTruncated"),
        ({"KeyCount": 5}, "KeyCount 5, but 0 objects and 1 prefixes"),
        ({"KeyCount": -1}, "no KeyCount"),
        ({"KeyCount": "1"}, "no KeyCount"),
        ({"CommonPrefixes": [{}]}, "no Prefix in CommonPrefixes"),
    ],
)
def test_a_page_that_proves_itself_cut_is_still_caught(change: dict[str, Any], why: str) -> None:
    with pytest.raises(_reply.IncompleteReplyError, match=why):
        _check({**S3RVER_PAGE, **change})
