"""``shmvec.rllib.ShmEnvCreator`` as the vector env of RLlib's EnvRunners, on a local two-node Ray
cluster (every process on 127.0.0.1): with the same seeds, a PPO EnvRunner samples the same episodes
as with RLlib's default vectorization (``"sync"``, Gymnasium's SyncVectorEnv), a PPO training
iteration on them gives the same losses, and ``algo.stop()`` leaves no actor, worker or segment.

Marked ``rl_library`` and slow: CI's RLlib stage (a venv of its own: RLlib pins gymnasium 1.2.2)
runs them.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np
import psutil
import pytest

from shmvec.rllib import VECTORIZE_MODE, ShmEnvCreator
from shmvec.synthetic import SyntheticImageEnv
from tests.helpers import require
from tests.ray_helpers import local_cluster, loopback_environ, nothing_left_in_ray

pytestmark = [pytest.mark.rl_library, pytest.mark.slow]

N_ENVS = 4


def pixel_env(config: dict) -> gym.Env:
    """RLlib's env creator for a 42x42 RGB pixel env (float32: RLlib's default CNN takes no uint8)
    whose episodes end after 5-20 steps."""
    env = SyntheticImageEnv((42, 42, 3), episode_len=(5, 20))
    return gym.wrappers.DtypeObservation(env, np.float32)


@pytest.fixture(scope="module")
def cluster():
    loopback_environ()  # before Ray is imported
    require("ray.rllib", 'pip install -e ".[rllib]"')
    import ray

    with local_cluster(2, cpus=1) as cluster:
        assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
        yield cluster


def build_ppo(name: str, creator, mode: str, seed: int):
    """PPO with one remote EnvRunner of ``N_ENVS`` envs vectorized by ``mode``."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.tune.registry import register_env

    register_env(name, creator)
    config = (
        PPOConfig()
        .environment(name)
        .env_runners(
            num_env_runners=1,
            num_envs_per_env_runner=N_ENVS,
            rollout_fragment_length=32,
            gym_env_vectorize_mode=mode,
        )
        .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1)
        .debugging(seed=seed)
    )
    return config.build_algo()


def sample(algo) -> list:
    """The episodes (finished and cut) of 96 env steps sampled by the remote EnvRunner with the policy."""
    return algo.env_runner_group.foreach_env_runner(
        lambda runner: runner.sample(num_timesteps=96, explore=True), local_env_runner=False
    )[0]


def assert_same_episodes(got: list, want: list) -> None:
    """Same number of episodes, each with equal observations, actions, action log-probs, rewards,
    infos and end flags."""
    assert len(got) == len(want), f"{len(got)} episodes against {len(want)}"
    for k, (a, b) in enumerate(zip(got, want)):
        where = f"episode {k}"
        assert (len(a), a.is_terminated, a.is_truncated) == (len(b), b.is_terminated, b.is_truncated), where
        for field in ("observations", "actions", "rewards"):
            x, y = (np.asarray(getattr(e, f"get_{field}")()) for e in (a, b))
            assert x.shape == y.shape and x.dtype == y.dtype, f"{where} {field}: {x.shape} {y.shape}"
            assert np.array_equal(x, y), f"{where} {field} differ"
        logp = [np.asarray(e.get_extra_model_outputs("action_logp")) for e in (a, b)]
        assert np.array_equal(*logp), f"{where} action_logp differ"
        assert [dict(i) for i in a.get_infos()] == [dict(i) for i in b.get_infos()], f"{where} infos differ"


def losses(result: dict) -> dict:
    stats = result["learners"]["default_policy"]
    return {
        key: float(stats[key]) for key in ("total_loss", "policy_loss", "vf_loss", "mean_kl_loss", "entropy")
    }


def run_ppo(name: str, creator, mode: str, seed: int) -> tuple[list, dict, list]:
    """Build PPO, sample episodes, train one iteration, stop (one at a time: the cluster has a CPU
    for one EnvRunner besides the driver's). Returns the episodes, the iteration's losses and what
    vector env the EnvRunner held."""
    algo = build_ppo(name, creator, mode, seed)
    try:
        kinds = algo.env_runner_group.foreach_env_runner(
            lambda r: type(r.env.unwrapped).__name__, local_env_runner=False
        )
        episodes = sample(algo)
        result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled"] > 0
        return episodes, losses(result), kinds
    finally:
        algo.stop()


def test_ppo_samples_and_trains_as_with_rllibs_own_vectorization(cluster):
    """The same seed: shmvec's EnvRunner samples RLlib's SyncVectorEnv episodes and its PPO iteration
    gives the same losses; seeded otherwise (the negative control) the episodes differ."""
    got, trained, kinds = run_ppo("pixels-shm", ShmEnvCreator(pixel_env, n_workers=2), VECTORIZE_MODE, 7)
    want, reference, ref_kinds = run_ppo("pixels-sync", pixel_env, "sync", 7)
    assert kinds == ["ShmVectorEnv"] and ref_kinds == ["SyncVectorEnv"]
    assert any(e.is_done for e in want) and len(want) > N_ENVS  # episodes ended and were reset
    assert_same_episodes(got, want)
    assert np.isfinite(list(trained.values())).all()
    assert trained == reference
    other, other_trained, _ = run_ppo(
        "pixels-other", ShmEnvCreator(pixel_env, n_workers=2), VECTORIZE_MODE, 8
    )
    with pytest.raises(AssertionError, match="differ|episodes against"):
        assert_same_episodes(other, want)
    assert other_trained != reference


def _segments_of(pids: set[int]) -> set[str]:
    from shmvec.memory.ring import SEGMENT_PREFIX

    return {n for n in os.listdir("/dev/shm") if any(n.startswith(f"{SEGMENT_PREFIX}{p}_") for p in pids)}


def test_stop_leaves_no_actor_worker_or_segment(cluster):
    """After ``algo.stop()``: the EnvRunner actors are gone, and so are the shmvec workers they
    started and the shared-memory segments they made."""
    with nothing_left_in_ray():
        algo = build_ppo("pixels-shm-stop", ShmEnvCreator(pixel_env, n_workers=2), VECTORIZE_MODE, seed=1)
        try:
            sample(algo)
            owners = algo.env_runner_group.foreach_env_runner(
                lambda r: (os.getpid(), [p.pid for p in r.env.unwrapped.processes]), local_env_runner=False
            )
        finally:
            algo.stop()
        actors = {pid for pid, _ in owners}
        workers = {w for _, ws in owners for w in ws}
        assert len(actors) == 1 and len(workers) == 2
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (_alive(workers) or _segments_of(actors)):
            time.sleep(0.2)
        assert _alive(workers) == set(), "shmvec workers outlived their EnvRunner"
        assert _segments_of(actors) == set(), "shared-memory segments left by the EnvRunner"


def _alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out
