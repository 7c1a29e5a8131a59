"""The ``shmvec bench`` backends: each one steps the same envs as DummyVecEnv for the same seeds and
actions (where that is possible), and the ``envpool`` one asks EnvPool for the settings of the ALE id
it is given.

The EnvPool tests need the ``envpool`` extra. They are skipped without it, except where
``SHMVEC_REQUIRE_ENVPOOL=1`` (CI's envpool step), where a missing EnvPool fails them.
"""

from __future__ import annotations

import numpy as np
import pytest

from shmvec.bench.backends import backend_names, make_vec_env, takes_workers
from shmvec.bench.envs import env_factory
from tests.helpers import assert_obs_equal, needs_envpool

TINY = "tests.envs:make_small_synthetic"
# Backends that step Python env factories (EnvPool runs its own C++ envs instead).
FACTORY_BACKENDS = ["subproc", "shm", "async", "sync", "shm-vector", "shm-auto", "shm-pin", "shm-portable"]


def _run(backend: str, n_envs: int, steps: int, n_workers: int | None = None) -> list[tuple]:
    """(obs, rewards, dones) after a seeded reset and ``steps`` seeded random steps."""
    venv = make_vec_env(backend, [env_factory(TINY)] * n_envs, n_workers, "fork")
    try:
        venv.seed(7)
        out = [(venv.reset(), None, None)]
        venv.action_space.seed(7)
        rng = np.random.default_rng(7)
        for _ in range(steps):
            actions = rng.integers(0, venv.action_space.n, n_envs)
            venv.step_async(actions)
            obs, rewards, dones, _ = venv.step_wait()
            out.append((np.array(obs), np.array(rewards), np.array(dones)))
        return out
    finally:
        venv.close()


@pytest.mark.parametrize("backend", FACTORY_BACKENDS)
def test_backend_steps_like_dummy(request, backend):
    """Same seeds, same actions: the same observations, rewards and dones as DummyVecEnv, episode ends
    (same-step auto-reset) included. Rewards are compared as float32 (SubprocVecEnv keeps float64)."""
    if backend != "async":  # gymnasium's mp.Array heap keeps a file descriptor for the process's life
        request.getfixturevalue("no_leaks")
    n_envs, steps = 3, 40
    want = _run("dummy", n_envs, steps)
    got = _run(backend, n_envs, steps, n_workers=2 if takes_workers(backend) else None)
    assert any(d.any() for _, _, d in want[1:]), "no episode ended: auto-reset was not compared"
    for t, ((obs, rew, done), (w_obs, w_rew, w_done)) in enumerate(zip(got, want)):
        assert_obs_equal(obs, w_obs, f"{backend} step {t} obs")
        if t:
            assert_obs_equal(rew.astype(np.float32), w_rew, f"{backend} step {t} rewards")
            assert_obs_equal(done, w_done, f"{backend} step {t} dones")


def test_new_backends_are_registered_and_unknown_is_one_line():
    assert {"sync", "shm-vector", "envpool", "async", "dummy", "subproc", "shm"} <= set(backend_names())
    assert takes_workers("shm-vector") and not takes_workers("sync") and not takes_workers("envpool")
    with pytest.raises(ValueError, match=r"^unknown backend 'shm-vectr'; choose from dummy, .*shm-vector"):
        make_vec_env("shm-vectr", [env_factory(TINY)])


def test_shm_vector_takes_the_worker_count(no_leaks):
    venv = make_vec_env("shm-vector", [env_factory(TINY)] * 3, 3, "fork")
    try:
        assert len(venv.processes) == 3 and all(p.is_alive() for p in venv.processes)
    finally:
        venv.close()


# ---------------------------------------------------------------- envpool


def test_envpool_settings_follow_the_ale_id():
    from shmvec.bench.envpool_backend import envpool_settings

    task, s = envpool_settings("ALE/Pong-v5")
    assert task == "Pong-v5"
    assert (s["frame_skip"], s["repeat_action_probability"], s["max_episode_steps"]) == (4, 0.25, 27_000)
    assert (s["img_height"], s["img_width"], s["gray_scale"], s["stack_num"]) == (210, 160, False, 1)
    assert not (s["episodic_life"] or s["reward_clip"] or s["use_fire_reset"] or s["full_action_space"])
    task, s = envpool_settings("PongNoFrameskip-v4", {"frameskip": 2})
    assert task == "Pong-v5" and (s["frame_skip"], s["repeat_action_probability"]) == (2, 0.0)
    assert s["max_episode_steps"] == 54_000
    task, s = envpool_settings("ALE/MontezumaRevenge-v5", {"obs_type": "grayscale"})
    assert task == "MontezumaRevenge-v5" and s["gray_scale"]


@pytest.mark.parametrize(
    ("env_id", "kwargs", "message"),
    [
        ("CartPole-v1", {}, "runs ALE ids only"),
        ("Pong-v4", {}, "needs a fixed frameskip, got (2, 5)"),
        ("ALE/Pong-v5", {"obs_type": "ram"}, "obs_type 'rgb' or 'grayscale', got 'ram'"),
    ],
)
def test_envpool_refuses_what_it_cannot_reproduce(env_id, kwargs, message):
    from shmvec.bench.envpool_backend import envpool_settings

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        envpool_settings(env_id, kwargs)


def test_envpool_refuses_a_factory_env():
    with pytest.raises(ValueError, match="registered ALE ids only"):
        make_vec_env("envpool", [env_factory(TINY)])


def test_envpool_backend_runs_pong_with_those_settings():
    needs_envpool()
    from shmvec.bench.envpool_backend import envpool_settings

    venv = make_vec_env("envpool", [env_factory("ALE/Pong-v5")] * 2)
    try:
        config = venv._env.spec.config
        _, settings = envpool_settings("ALE/Pong-v5")
        assert {k: getattr(config, k) for k in settings} == settings
        assert venv.num_envs == 2 and venv.action_space.n == 6
        venv.seed(3)
        obs = venv.reset()
        assert obs.shape == (2, 3, 210, 160) and obs.dtype == np.uint8
        frames = []
        for _ in range(30):
            venv.step_async(np.zeros(2, np.int64))
            obs, rewards, dones, _ = venv.step_wait()
            frames.append(obs.copy())
            assert rewards.dtype == np.float32 and dones.dtype == np.bool_
        # Same seed, same actions: the same frames (seed() rebuilt the pool with seed 3 both times).
        venv.seed(3)
        venv.reset()
        for t in range(30):
            venv.step_async(np.zeros(2, np.int64))
            assert_obs_equal(venv.step_wait()[0], frames[t], f"envpool step {t}")
    finally:
        venv.close()


def test_envpool_runs_the_recipe_with_sb3_settings():
    """With --recipe sb3-atari, EnvPool gets SB3's Atari settings and gives 4 stacked 84x84 gray
    frames, channels first (not bit-identical to the recipe: only the shape is compared)."""
    needs_envpool()
    from shmvec.bench.envpool_backend import envpool_recipe_settings
    from shmvec.bench.recipes import atari_settings, recipe_env

    env_fn, stack = recipe_env("sb3-atari", "PongNoFrameskip-v4")
    venv = make_vec_env("envpool", [env_fn] * 2, frame_stack=stack)
    try:
        task, settings = envpool_recipe_settings(atari_settings("PongNoFrameskip-v4"))
        assert task == "Pong-v5" and venv._task == task
        config = venv._env.spec.config
        assert {k: getattr(config, k) for k in settings} == settings
        assert (settings["stack_num"], settings["img_height"], settings["gray_scale"]) == (4, 84, True)
        assert (settings["noop_max"], settings["episodic_life"], settings["reward_clip"]) == (30, True, True)
        assert settings["repeat_action_probability"] == 0.0 and settings["max_episode_steps"] == 27_000
        assert venv.native_steps is None
        venv.seed(3)
        obs = venv.reset()
        for _ in range(10):
            venv.step_async(np.zeros(2, np.int64))
            obs, rewards, dones, _ = venv.step_wait()
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8 and obs.any()
    finally:
        venv.close()
