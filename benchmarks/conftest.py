"""Benchmark collection (``bench_*.py`` files too) and markers; not part of the default test run
(testpaths is ``tests``)."""

from __future__ import annotations

import pytest

# The vec_env_benchmark fixture that benchmarks/test_vec_envs.py times its cases with.
pytest_plugins = ["shmvec.testing"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "first: issue 2's first benchmark (Pong raw, synthetic 512x512x3, n=8)"
    )


def pytest_benchmark_update_machine_info(config, machine_info):
    """The host's wake-up cost (:mod:`shmvec.bench.host`), so the matrix's ratios carry it."""
    from shmvec.bench import host

    machine_info["shmvec_wake_up_us"] = host.wake_up_us()


def pytest_collect_file(file_path, parent):
    # A file named on the command line is collected by pytest itself.
    initial = parent.session.isinitpath(file_path)
    if file_path.suffix == ".py" and file_path.name.startswith("bench_") and not initial:
        return pytest.Module.from_parent(parent, path=file_path)
    return None
