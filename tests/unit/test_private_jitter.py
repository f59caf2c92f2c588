"""s3ckpt's back-off and heartbeat jitter never draw from the global ``random``: a save or a
retry in a background thread must not move a training job's Python RNG, or a resumed run
stops repeating the interrupted one (issue 17, found by the accelerate integration)."""

from __future__ import annotations

import random

from tenacity import retry_if_exception_type

from s3ckpt.config import TransferConfig
from s3ckpt.errors import TransientStoreError
from s3ckpt.store.retry import retrying


def test_retry_back_off_leaves_the_global_rng_alone() -> None:
    random.seed(1234)
    before = random.getstate()
    waits: list[float] = []
    calls = 0

    def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise TransientStoreError("slow down")
        return calls

    r = retrying(
        TransferConfig(max_attempts=5),
        retry=retry_if_exception_type(TransientStoreError),
        sleep=waits.append,
    )
    assert r(flaky) == 4
    assert len(waits) == 3 and all(w >= 0 for w in waits)
    assert random.getstate() == before
