"""The ``backend`` and ``ray_options`` parameters, checked without a Ray cluster: bad values are one-line
errors before anything starts, and the local backend never imports Ray."""

from __future__ import annotations

import pytest

from shmvec import ShmVecEnv, ShmVectorEnv
from tests.envs import make_dict_env
from tests.helpers import require, run_script


@pytest.mark.parametrize("face", [ShmVecEnv, ShmVectorEnv])
def test_unknown_backend_is_named(no_leaks, face):
    with pytest.raises(ValueError, match=r"backend must be one of \('local', 'ray'\), got 'rey'"):
        face([make_dict_env], backend="rey")


def test_ray_options_need_the_ray_backend(no_leaks):
    with pytest.raises(ValueError, match=r"ray_options needs backend='ray', got backend='local'"):
        ShmVecEnv([make_dict_env], ray_options={"num_cpus": 1})


def test_ray_options_must_be_a_mapping(no_leaks):
    with pytest.raises(TypeError, match=r"ray_options must be a dict of Ray actor options.*got list"):
        ShmVecEnv([make_dict_env], backend="ray", ray_options=[("num_cpus", 1)])


@pytest.mark.slow  # CI installs Ray for its slow stage only
def test_unpicklable_factory_on_ray_names_the_backend(tmp_path):
    # The factories are pickled before Ray is started: no cluster needed. In a script of its own:
    # Ray must not be imported in this process before test_ray sets up its loopback environment.
    require("ray", 'pip install -e ".[ray]"')
    proc = run_script(
        tmp_path / "unpicklable.py",
        """
        import threading
        import ray
        from shmvec import ShmVecEnv
        from tests.envs import make_dict_env

        if __name__ == "__main__":
            lock = threading.Lock()

            def make():
                assert not lock.locked()  # the closure captures a lock, which cannot be pickled
                return make_dict_env()

            try:
                ShmVecEnv([make_dict_env, make], backend="ray", n_workers=2)
            except TypeError as exc:
                print("error:", exc)
            print("ray started:", ray.is_initialized())
        """,
    )
    out = proc.stdout
    expected = (
        "error: the factory of env 1 refers to `lock` (a _thread.lock), which cannot be pickled: do not "
        "capture it in the factory, create it inside the factory or the env instead. Pickling it, which "
        'backend="ray" needs, failed: TypeError:'
    )
    assert expected in out, out + proc.stderr[-2000:]
    assert "start method" not in out and "start_method" not in out, out
    assert "ray started: False" in out, out


def test_local_backend_never_imports_ray(tmp_path):
    proc = run_script(
        tmp_path / "local.py",
        """
        import sys
        import numpy as np
        import shmvec
        from shmvec import ShmVectorEnv
        from tests.envs import make_dict_env

        if __name__ == "__main__":
            # The Gymnasium face: the same engine without SB3's (slow) import.
            venv = ShmVectorEnv([make_dict_env] * 2, start_method="fork", codec="delta")
            venv.reset()
            venv.step(np.zeros((2, 2), np.float32))
            venv.close()
            assert "ray" not in sys.modules, "the local backend imported Ray"
            print("ok")
        """,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_ray_backend_without_ray_says_what_to_install(tmp_path):
    proc = run_script(
        tmp_path / "noray.py",
        """
        import sys
        sys.modules["ray"] = None  # as if Ray were not installed
        from shmvec import ShmVectorEnv
        from tests.envs import make_dict_env

        if __name__ == "__main__":
            try:
                ShmVectorEnv([make_dict_env], backend="ray")
            except ImportError as exc:
                print("error:", exc)
        """,
    )
    assert 'error: backend="ray" needs Ray: pip install -e ".[ray]" (in a clone of shmvec' in proc.stdout, (
        proc.stderr[-2000:]
    )


def test_ray_wire_default_is_delta_with_zstd_for_frames_and_raw_for_small_leaves():
    """On the Ray wire bytes are the limit: the default stays delta's zstd backend even though the
    local default of ``codec="delta"`` is lz4; a leaf under 1 KiB travels raw."""
    import numpy as np
    from gymnasium import spaces

    from shmvec import codecs
    from shmvec.memory.layout import leaves
    from shmvec.transports import default_codecs

    require("zstandard", 'pip install -e ".[codecs]"')
    space = spaces.Dict(
        {
            "frame": spaces.Box(0, 255, (210, 160, 3), np.uint8),
            "speed": spaces.Box(-1.0, 1.0, (3,), np.float32),
        }
    )
    wire = default_codecs(leaves(space))
    assert wire is not None
    frame, speed = wire
    assert speed is None
    assert frame is not None and frame.name == "delta" and frame.params()["backend"] == "zstd"
    assert codecs.get("delta").params()["backend"] == "lz4"
