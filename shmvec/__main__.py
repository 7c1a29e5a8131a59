"""``python -m shmvec`` runs the command-line interface (see :mod:`shmvec.cli.main`)."""

from shmvec.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
