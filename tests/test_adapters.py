"""The adapters for other RL libraries are faces: only ``shmvec/<library>.py`` imports its library
(tests/test_import_graph.py checks that nothing in shmvec imports an adapter), ``import shmvec``
loads none of TorchRL's and RLlib's; and ``ShmEnvCreator``
(RLlib's env creator, which imports no Ray) builds through Gymnasium's ``vector_entry_point`` what
RLlib's EnvRunner gets from it. Needs none of the libraries: part of the default suite."""

from __future__ import annotations

import ast
import pickle
from contextlib import closing
from pathlib import Path

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest

import shmvec
from shmvec import ShmVectorEnv
from shmvec.rllib import VECTORIZE_MODE, ShmEnvCreator
from tests.envs import DictImageEnv
from tests.helpers import ADAPTERS, assert_obs_equal, run_python

PACKAGE = Path(shmvec.__file__).resolve().parent
# adapter module -> the top-level packages only it may import
LIBRARIES = {
    "shmvec.tianshou": {"tianshou"},
    "shmvec.torchrl": {"torchrl", "tensordict"},
    "shmvec.rllib": {"ray"},
}


def _imports(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names (absolute imports; shmvec's are absolute)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def test_only_each_adapter_imports_its_library():
    assert set(LIBRARIES) == set(ADAPTERS)  # every adapter, and only adapters, has its libraries here
    bad = []
    for path in PACKAGE.rglob("*.py"):
        module = _module(path)
        for name in _imports(path):
            top = name.split(".")[0]
            for adapter, libraries in LIBRARIES.items():
                # Ray is also the ray backend's (shmvec.transports.ray, shmvec.bench): not RLlib's.
                if top in libraries - {"ray"} and module != adapter:
                    bad.append(f"{module} imports {name}, which only {adapter} may")
            if name.startswith("ray.rllib") and module != "shmvec.rllib":
                bad.append(f"{module} imports {name}")
    assert not bad, bad
    # the check reads what it should
    assert "torchrl.envs" in _imports(PACKAGE / "torchrl.py")
    assert any(n.startswith("tianshou") for n in _imports(PACKAGE / "tianshou.py"))


def test_import_shmvec_loads_no_adapter_library():
    done = run_python(
        "-c",
        "import sys, shmvec, shmvec.vector_env, shmvec.rllib; "
        "bad = [m for m in ('torch', 'torchrl', 'tensordict', 'ray', 'shmvec.torchrl') if m in sys.modules]; "
        "sys.exit(f'loaded: {bad}' if bad else 0)",
    )
    assert done.returncode == 0, done.stderr + done.stdout


def _pixels(config: dict) -> gym.Env:
    assert "num_envs" not in config
    return DictImageEnv(size=int(config.get("size", 16)))


def test_vector_entry_point_builds_a_shm_vector_env_equal_to_sync(no_leaks):
    """What RLlib does in an EnvRunner: register the creator as ``vector_entry_point`` and
    ``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")``; the env config reaches each
    env without ``num_envs``; the result steps as SyncVectorEnv of the same envs."""
    creator = pickle.loads(cloudpickle.dumps(ShmEnvCreator(_pixels, n_workers=2)))  # it travels to actors
    gym.register(
        "shmvec-test/Pixels-v0",
        entry_point=lambda: _pixels({}),
        vector_entry_point=lambda num_envs, **kwargs: creator({"size": 8} | {"num_envs": num_envs}),
    )
    try:
        with closing(gym.make_vec("shmvec-test/Pixels-v0", 3, vectorization_mode=VECTORIZE_MODE)) as env:
            assert isinstance(env.unwrapped, ShmVectorEnv) and env.unwrapped.n_workers == 2
            assert env.single_observation_space["image"].shape == (8, 8, 3)
        reference = gym.vector.SyncVectorEnv([lambda: _pixels({"size": 8})] * 3)
        with closing(creator({"size": 8, "num_envs": 3})) as env, closing(reference):
            assert_obs_equal(env.reset(seed=4)[0], reference.reset(seed=4)[0])
            rng = np.random.default_rng(0)
            for t in range(40):
                actions = rng.uniform(-1, 1, (3, 2)).astype(np.float32)
                got, want = env.step(actions), reference.step(actions)
                assert_obs_equal(got[0], want[0], f"step {t} obs")
                for a, b in zip(got[1:4], want[1:4]):
                    assert np.array_equal(a, b) and a.dtype == b.dtype, f"step {t}"
    finally:
        gym.registry.pop("shmvec-test/Pixels-v0")


def test_one_env_asked_of_the_creator_is_refused():
    with pytest.raises(ValueError, match="gym_env_vectorize_mode='vector_entry_point'"):
        ShmEnvCreator(_pixels)({"size": 8})


@pytest.mark.parametrize("option", ["autoreset_mode", "batch_size", "pool_order"])
def test_options_rllib_cannot_use_are_refused(option):
    with pytest.raises(ValueError, match=f"{option}= is not taken"):
        ShmEnvCreator(_pixels, **{option: np.int64(2)})
