"""``python -m s3ckpt.demo``: the demo (and, with ``--child``, one of its training processes)."""

from s3ckpt.demo import main

if __name__ == "__main__":
    main()  # the arguments: sys.argv[1:]
