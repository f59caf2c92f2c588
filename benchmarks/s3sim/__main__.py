"""``python -m benchmarks.s3sim``: run the server in the foreground (see README.md)."""

from benchmarks.s3sim._server import main

raise SystemExit(main())
