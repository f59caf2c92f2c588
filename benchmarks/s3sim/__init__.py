"""s3sim: an in-memory S3-compatible endpoint for benchmarks and scale tests (not a product).

The server runs in its own process (asyncio, one event loop), stores objects as
memoryviews of the request bodies they arrived in, and models S3's latency, per-connection
bandwidth and per-partition request rates when asked (:class:`Shaping`). See README.md.

Example::

    from benchmarks.s3sim import S3Sim, Shaping

    with S3Sim(shaping=Shaping.s3(rate_scale=0.01), buckets=["ckpt"]) as sim:
        s3 = boto3.client("s3", endpoint_url=sim.endpoint)
        ...
        sim.stats()["ops"]["PutObject"]["slowdown"]

From a shell (repository root): ``python -m benchmarks.s3sim --port 9000 --profile s3``.
"""

from ._client import S3Sim
from ._options import Options
from ._shaping import Shaping, Throttle

__all__ = ["Options", "S3Sim", "Shaping", "Throttle"]
