"""s3ckpt's pytest plugin: fixtures for testing a training job's checkpoints on S3.

Installed with s3ckpt (entry point ``pytest11``, name ``s3ckpt``), so any project that has
s3ckpt installed can use these fixtures with no ``conftest.py``; the embedded server needs
``pip install "s3ckpt[testing]"``. ``pytest -p no:s3ckpt`` turns the plugin off. Loading it
imports only pytest and s3ckpt's package face: moto starts with the first test that uses a
fixture.

Fixtures:

``s3ckpt_server`` (session)
    A :class:`~s3ckpt.testing.LocalS3`: one embedded S3 server (moto) on 127.0.0.1 for the
    whole session, with a bucket of its own. From its first use to the end of the session,
    ``os.environ`` points at it (``AWS_ENDPOINT_URL``, dummy credentials, the region; no
    profile, no session token; the AWS config and credentials files are ``os.devnull``), and
    is restored at the end of the session.
``s3ckpt_s3`` (function)
    A :class:`~s3ckpt.testing.LocalS3` with a new, empty bucket on the session's server; the
    environment points at the server for the test (set again, whatever an earlier test did
    to it) and is restored after it.
``s3ckpt_url`` (function)
    ``"s3://{fresh bucket}/run"``: a run prefix for a :class:`~s3ckpt.Checkpointer`, in the
    bucket of ``s3ckpt_s3``.

Child processes a test starts (``subprocess``, ``torch.multiprocessing`` spawn) inherit the
environment, and so reach the same server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from s3ckpt.testing._server import LocalS3

__all__ = ["s3ckpt_s3", "s3ckpt_server", "s3ckpt_url"]


@pytest.fixture(scope="session")
def s3ckpt_server() -> Iterator[LocalS3]:
    """One embedded S3 server for the session, the environment pointed at it (see the
    module docs)."""
    from s3ckpt.testing._server import local_s3

    with local_s3() as s3:
        yield s3


@pytest.fixture
def s3ckpt_s3(s3ckpt_server: LocalS3) -> Iterator[LocalS3]:
    """A new, empty bucket on the session's server; the environment points at the server
    for the test."""
    from s3ckpt.testing._server import patched_env, server_env

    s3 = s3ckpt_server.new_bucket()
    with patched_env(server_env(s3.endpoint_url, s3.region)):
        yield s3


@pytest.fixture
def s3ckpt_url(s3ckpt_s3: LocalS3) -> str:
    """``s3://{fresh bucket}/run``: a run prefix in the bucket of ``s3ckpt_s3``."""
    return s3ckpt_s3.url_for("run")
