"""Registers the benchmark markers; the matrix itself is in ``test_vec_envs.py``."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "first: issue 2's first benchmark (Pong raw, synthetic 512x512x3, n=8)"
    )
