"""The pytest plugin of :mod:`shmvec.testing`: the ``vec_env_benchmark`` fixture.

Opt-in: ``pytest -p shmvec.testing``, or ``pytest_plugins = ["shmvec.testing"]`` in your top-level
``conftest.py``. A test that uses the fixture is run once per backend (``dummy``, ``subproc``,
``shm`` unless its ``@pytest.mark.vec_env_backends(...)`` or the ini option ``vec_env_backends``
names others), each a pytest-benchmark case; all the backends of one env and ``n_envs`` share a
group, so pytest-benchmark's table puts them side by side and ``--benchmark-compare`` compares each
with its saved self::

    import pytest

    @pytest.mark.parametrize("n_envs", [4, 8])
    def test_step_speed(vec_env_benchmark, n_envs):
        vec_env_benchmark(make_my_env, n_envs)

Needs pytest-benchmark (the ``bench`` extra).
"""

from __future__ import annotations

from typing import Any

import pytest

from shmvec.testing.benchmark import DEFAULT_BACKENDS, VecEnvBenchmark

MARKER = "vec_env_backends"
BACKEND_FIXTURE = "vec_env_backend"


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ini option ``vec_env_backends``: the backends of every test that has no marker."""
    parser.addini(
        MARKER,
        type="args",
        default=list(DEFAULT_BACKENDS),
        help=f"backends vec_env_benchmark times each test with (default: {' '.join(DEFAULT_BACKENDS)})",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker; refuse to run without pytest-benchmark, whose fixture times the cases."""
    if not config.pluginmanager.hasplugin("benchmark"):
        raise pytest.UsageError("shmvec.testing's plugin needs pytest-benchmark: pip install 'shmvec[bench]'")
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*names): the backends vec_env_benchmark times this test with "
        f"(default {', '.join(DEFAULT_BACKENDS)}; names as in shmvec.bench.backends)",
    )


def _parametrized_by_test(metafunc: pytest.Metafunc, name: str) -> bool:
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One case per backend for each test that uses ``vec_env_benchmark`` (unless the test
    parametrizes ``vec_env_backend`` itself)."""
    if BACKEND_FIXTURE not in metafunc.fixturenames or _parametrized_by_test(metafunc, BACKEND_FIXTURE):
        return
    marker = metafunc.definition.get_closest_marker(MARKER)
    backends = tuple(marker.args) if marker is not None and marker.args else metafunc.config.getini(MARKER)
    metafunc.parametrize(BACKEND_FIXTURE, backends, indirect=True)


@pytest.fixture
def vec_env_backend(request: pytest.FixtureRequest) -> str:
    """The backend of this case, one of the names the plugin parametrizes the test with."""
    if not hasattr(request, "param"):
        pytest.fail(f"{BACKEND_FIXTURE} is parametrized by the shmvec.testing plugin; this test was not")
    return request.param


@pytest.fixture
def vec_env_benchmark(
    request: pytest.FixtureRequest, benchmark: Any, vec_env_backend: str
) -> VecEnvBenchmark:
    """Call it once with your env factories to time this case's backend: see
    :class:`shmvec.testing.VecEnvBenchmark`. The VecEnv is closed before the call returns.

    It asks for pytest-benchmark's ``benchmark`` fixture by name, so pytest-benchmark's
    ``--benchmark-only`` and ``--benchmark-skip`` see these tests as benchmarks."""
    return VecEnvBenchmark(benchmark, vec_env_backend, request.node.originalname)
