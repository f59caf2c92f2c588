"""Benchmarks and the tools they share (not part of the s3ckpt wheel).

A package only so that tests can import ``benchmarks.s3sim`` from the repository root; the
scripts here still run as ``python benchmarks/<script>.py``.
"""
