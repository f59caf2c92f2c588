"""S3 errors as exceptions: code, HTTP status, message and the extra elements S3 adds.

The server renders one as ``<Error><Code>..</Code><Message>..</Message>(extra)<RequestId>..
</RequestId><HostId>..</HostId></Error>`` (no body for a HEAD). Messages are S3's (as moto
5.2 also writes them), so clients that log them read familiar text.
"""

from __future__ import annotations

__all__ = ["S3Error"]


class S3Error(Exception):
    """One S3 error response."""

    def __init__(self, status: int, code: str, message: str, **extra: object) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.extra = {k: str(v) for k, v in extra.items() if v is not None}

    # -- the errors the server raises, by S3 code ---------------------------------------------

    @classmethod
    def no_such_bucket(cls, bucket: str) -> S3Error:
        """404: the bucket does not exist."""
        return cls(404, "NoSuchBucket", "The specified bucket does not exist", BucketName=bucket)

    @classmethod
    def no_such_key(cls, key: str | None) -> S3Error:
        """404: the key does not exist (moto leaves the Key out for a failed If-Match PUT)."""
        return cls(404, "NoSuchKey", "The specified key does not exist.", Key=key)

    @classmethod
    def no_such_upload(cls, upload_id: str) -> S3Error:
        """404: the multipart upload does not exist (aborted, completed or never created)."""
        return cls(
            404,
            "NoSuchUpload",
            "The specified upload does not exist. The upload ID may be invalid, or the upload "
            "may have been aborted or completed.",
            UploadId=upload_id,
        )

    @classmethod
    def precondition_failed(cls, condition: str) -> S3Error:
        """412: an If-Match / If-None-Match / If-(Un)Modified-Since condition did not hold."""
        return cls(
            412,
            "PreconditionFailed",
            "At least one of the pre-conditions you specified did not hold",
            Condition=condition,
        )

    @classmethod
    def invalid_range(cls, size: int, requested: str) -> S3Error:
        """416: the range starts at or after the end of the object."""
        return cls(
            416,
            "InvalidRange",
            "The requested range is not satisfiable",
            ActualObjectSize=size,
            RangeRequested=requested,
        )

    @classmethod
    def slow_down(cls) -> S3Error:
        """503: the partition's request rate is exceeded."""
        return cls(503, "SlowDown", "Please reduce your request rate.")

    @classmethod
    def invalid_part(cls, upload_id: str, part_number: int, etag: str) -> S3Error:
        """400: a listed part was not uploaded, or its ETag does not match."""
        return cls(
            400,
            "InvalidPart",
            "One or more of the specified parts could not be found. The part might not have "
            "been uploaded, or the specified entity tag might not have matched the part's "
            "entity tag.",
            UploadId=upload_id,
            PartNumber=part_number,
            ETag=etag,
        )

    @classmethod
    def invalid_part_order(cls, upload_id: str) -> S3Error:
        """400: the parts of a CompleteMultipartUpload are not in ascending order."""
        return cls(
            400,
            "InvalidPartOrder",
            "The list of parts was not in ascending order. Parts must be ordered by part number.",
            UploadId=upload_id,
        )

    @classmethod
    def entity_too_small(cls, size: int, minimum: int, part_number: int, etag: str) -> S3Error:
        """400: a part other than the last is smaller than the minimum part size."""
        return cls(
            400,
            "EntityTooSmall",
            "Your proposed upload is smaller than the minimum allowed object size.",
            ProposedSize=size,
            MinSizeAllowed=minimum,
            PartNumber=part_number,
            ETag=etag,
        )

    @classmethod
    def malformed_xml(cls) -> S3Error:
        """400: a request body is not the XML the operation expects."""
        return cls(
            400,
            "MalformedXML",
            "The XML you provided was not well-formed or did not validate against our "
            "published schema",
        )

    @classmethod
    def bad_digest(cls, algorithm: str) -> S3Error:
        """400: the body does not match the checksum the client sent."""
        what = "Content-MD5" if algorithm == "MD5" else algorithm
        verb = "what we received" if algorithm == "MD5" else "the calculated checksum"
        return cls(400, "BadDigest", f"The {what} you specified did not match {verb}.")

    @classmethod
    def invalid_request(cls, message: str) -> S3Error:
        """400: a request S3 rejects as a whole (bad checksum header, copy onto itself...)."""
        return cls(400, "InvalidRequest", message)

    @classmethod
    def invalid_argument(
        cls, message: str, name: str | None = None, value: str | None = None
    ) -> S3Error:
        """400: one argument is out of range."""
        return cls(400, "InvalidArgument", message, ArgumentName=name, ArgumentValue=value)

    @classmethod
    def not_implemented(cls, what: str = "") -> S3Error:
        """501: an operation s3sim does not implement."""
        msg = "A header you provided implies functionality that is not implemented"
        return cls(501, "NotImplemented", f"{msg}{': ' + what if what else ''}")
