"""``python -m s3ckpt``: the ``s3ckpt`` command, for environments without the console script
on ``PATH`` (a venv not activated, ``python -m`` in a job spec)."""

from __future__ import annotations

from s3ckpt.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
