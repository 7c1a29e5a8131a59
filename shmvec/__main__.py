"""``python -m shmvec`` runs the command-line interface (see :mod:`shmvec.cli`)."""

from shmvec.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
