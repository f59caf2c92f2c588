"""Which S3 operation a request is: :func:`s3ckpt.testing.classify` on request lines (what
boto3 really sends is checked against moto in tests/integration/test_faultproxy_arms_s3.py)."""

from __future__ import annotations

import pytest

from tests.faultproxy import OPERATIONS, classify


@pytest.mark.parametrize(
    ("method", "target", "headers", "expected"),
    [
        ("PUT", "/b/a/b%20c.bin", {}, ("PutObject", "a/b c.bin")),
        ("PUT", "/b/k?x-id=PutObject", {"If-None-Match": "*"}, ("PutObject", "k")),
        ("PUT", "/b/k", {"x-amz-copy-source": "/b/j"}, ("Other", "k")),
        ("PUT", "/b/k?tagging", {}, ("Other", "k")),
        ("PUT", "/b/k?partNumber=3&uploadId=u1", {}, ("UploadPart", "k")),
        ("POST", "/b/k?uploads", {}, ("CreateMultipartUpload", "k")),
        ("POST", "/b/k?uploadId=u1", {}, ("CompleteMultipartUpload", "k")),
        ("DELETE", "/b/k?uploadId=u1", {}, ("AbortMultipartUpload", "k")),
        ("POST", "/b?delete", {}, ("DeleteObjects", "")),
        ("DELETE", "/b/dir/k", {}, ("DeleteObject", "dir/k")),
        ("GET", "/b/k", {}, ("GetObject", "k")),
        ("GET", "/b/k?partNumber=1&response-content-type=x", {}, ("GetObject", "k")),
        ("GET", "/b/k?uploadId=u1", {}, ("Other", "k")),
        ("HEAD", "/b/k%2Fx", {}, ("HeadObject", "k/x")),
        ("GET", "/b?list-type=2&prefix=a%2F&delimiter=%2F", {}, ("ListObjectsV2", "")),
        ("GET", "/b?uploads&prefix=a", {}, ("ListMultipartUploads", "")),
        ("GET", "/b", {}, ("Other", "")),
        ("PUT", "/b", {}, ("Other", "")),
        ("HEAD", "/b", {}, ("Other", "")),
        ("GET", "/", {}, ("Other", "")),
        ("get", "http://127.0.0.1:9/b/k?versionId=1", {}, ("GetObject", "k")),
        ("PUT", "/b//lead", {}, ("PutObject", "/lead")),
    ],
)
def test_classify(
    method: str, target: str, headers: dict[str, str], expected: tuple[str, str]
) -> None:
    assert classify(method, target, headers) == expected
    assert expected[0] in OPERATIONS
