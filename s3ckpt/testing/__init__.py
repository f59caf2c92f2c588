"""``s3ckpt.testing``: test a training job's save and resume against a real S3 API.

An embedded S3 server (moto, on 127.0.0.1) with a fresh bucket and the environment pointed
at it, and assertions on what a run prefix holds. Install with
``pip install "s3ckpt[testing]"``; the guide is ``docs/testing.md``::

    from s3ckpt import Checkpointer
    from s3ckpt.testing import assert_committed, local_s3

    with local_s3() as s3:                       # AWS_ENDPOINT_URL & co. set meanwhile
        url = s3.url_for("run")
        with Checkpointer(url) as ckpt:
            ckpt.save(4, model, optimizer)
        assert_committed(url, step=4)            # committed, every CRC32C re-read

With pytest the same comes as fixtures (``s3ckpt_server``, ``s3ckpt_s3``, ``s3ckpt_url``),
registered by s3ckpt's entry point: see
:mod:`s3ckpt.testing.pytest_plugin`.

Modules: ``_server`` (the embedded server and the environment), ``_asserts`` (the
assertions) and ``pytest_plugin``.
Importing this package imports neither moto nor torch; a server start imports moto,
``assert_committed`` with ``verify=True`` imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from s3ckpt.testing._asserts import (
        assert_clean,
        assert_committed,
        assert_no_partial_uploads,
        committed_steps,
    )
    from s3ckpt.testing._server import LocalS3, local_s3

# Imported on first use: the pytest plugin (s3ckpt.testing.pytest_plugin) loads this package
# in every pytest run of every project that installs s3ckpt.
_ASSERTS = ("assert_clean", "assert_committed", "assert_no_partial_uploads", "committed_steps")
_HOME = {**dict.fromkeys(_ASSERTS, "_asserts"), "LocalS3": "_server", "local_s3": "_server"}


def __getattr__(name: str) -> Any:
    if (home := _HOME.get(name)) is None:
        raise AttributeError(f"module 's3ckpt.testing' has no attribute {name!r}")
    import importlib

    value = globals()[name] = getattr(importlib.import_module(f"s3ckpt.testing.{home}"), name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "LocalS3",
    "assert_clean",
    "assert_committed",
    "assert_no_partial_uploads",
    "committed_steps",
    "local_s3",
]
