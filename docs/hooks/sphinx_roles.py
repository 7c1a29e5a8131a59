"""MkDocs hook: show the Sphinx roles of shmvec's docstrings (``:class:`X```) as plain code.

The docstrings use Sphinx roles so that IDEs and ``help()`` read well; mkdocstrings' Sphinx style
parses ``:param:`` fields but leaves inline roles as literal text (":class:" before the code).
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const):(?=<code>)")


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub("", html)
