"""The ``shmvec`` command (also ``python -m shmvec``): parsing and printing only, over the tools.

- :mod:`~shmvec.cli.main`: the parser, ``shmvec bench`` and the entry point :func:`~shmvec.cli.main.main`;
- :mod:`~shmvec.cli.codecs_command`: ``shmvec codecs``;
- :mod:`~shmvec.cli.native_command`: ``shmvec native`` (which step path an env takes, and why);
- :mod:`~shmvec.cli.usage`: what every subcommand shares (bad input as one line on stderr).

Nothing else in shmvec imports it.
"""
