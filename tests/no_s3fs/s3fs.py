"""Stands in for s3fs in the framework tests: put this folder first on ``PYTHONPATH`` of a
subprocess (its children inherit it) and ``import s3fs`` fails there, as in an environment
without s3fs, which is how the integrations must work (issue 17: no s3fs in the environment)."""

raise ImportError("s3fs is blocked in this test (tests/no_s3fs): s3ckpt must not need it")
