"""``python -m s3ckpt.demo``: the demo (and, with ``--child``, one of its training processes)."""

from __future__ import annotations

import sys

from s3ckpt.demo import main

__all__: list[str] = []

if __name__ == "__main__":
    main(sys.argv[1:])
