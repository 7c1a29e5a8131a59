"""Megabytes that the installed distributions of this Python take, less pip, setuptools and shmvec
itself (an editable install): what `pip install shmvec` brings. Exits 1 at or above the limit (MB)."""

import importlib.metadata as md
import sys

limit = float(sys.argv[1])
skip = {"pip", "setuptools", "shmvec"}
size = sum(
    f.locate().stat().st_size
    for d in md.distributions()
    if d.metadata["Name"].lower() not in skip
    for f in d.files or ()
    if f.locate().exists()
)
mb = size / 2**20
print(f"Python {sys.version.split()[0]}: pip install shmvec brought {mb:.0f} MB (limit {limit:.0f})")
sys.exit(mb >= limit)
