"""backend="ray": workers as Ray actors on a local two-node cluster (every process on 127.0.0.1).

Compared array for array with DummyVecEnv / SyncVectorEnv; actors killed on purpose; what close()
leaves behind counted. One cluster for the module (Ray start-up is ~15 s on 2 cores); slow-marked,
CI installs the ``[ray]`` extra before its slow step.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest

from tests.ray_helpers import (
    CorruptingCodec,
    local_cluster,
    loopback_environ,
    nothing_left_in_ray,
    worker_nodes,
)

loopback_environ()  # before Ray is imported
ray = pytest.importorskip("ray", reason='Ray is not installed (pip install -e ".[ray]")')

import gymnasium as gym  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

from shmvec import CodecMismatchError, EnvTimeoutError, ShmVecEnv, ShmVectorEnv, WorkerCrashedError  # noqa: E402
from shmvec.engine.restart import RESTARTED_KEY  # noqa: E402
from tests.conftest import shm_segments  # noqa: E402
from tests.envs import DictImageEnv, SlowStepEnv, make_dict_env  # noqa: E402
from tests.helpers import assert_obs_equal, assert_steps_equal, sample_actions  # noqa: E402
from tests.object_envs import make_object_env  # noqa: E402
from tests.pool_helpers import FAULTY, check_split_steps, check_trajectories, run_pool  # noqa: E402
from tests.vector_helpers import SAME, run_both  # noqa: E402

pytestmark = pytest.mark.slow

# 32x32x3 images (3 KiB): above the size the Ray backend encodes by default.
DICT32 = functools.partial(make_dict_env, 32, 12)


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(2, cpus=1) as cluster:
        yield cluster


@pytest.fixture
def leaks(cluster):
    """Fail if a test leaves a shared-memory segment, a placement group or a live actor, or leaves
    the driver's Ray connection changed."""
    segments = shm_segments()
    address = ray.get_runtime_context().gcs_address
    with nothing_left_in_ray():
        yield
    assert shm_segments() - segments == set(), "shared-memory segments leaked"
    assert ray.is_initialized() and ray.get_runtime_context().gcs_address == address


def assert_actors_dead(actors: list, within: float = 30.0) -> None:
    """Every actor is dead, or dies within ``within`` seconds (ray.kill takes effect asynchronously:
    a call made at once may still be served)."""
    deadline = time.monotonic() + within
    for actor in actors:
        while True:
            try:
                ray.get(actor.ready.remote(), timeout=within)
            except ray.exceptions.RayActorError:
                break
            assert time.monotonic() < deadline, f"{actor} still alive {within} s after close()"
            time.sleep(0.2)


@pytest.mark.parametrize("codec", [None, "raw"], ids=["default-codec", "raw"])
def test_same_as_dummy_vec_env(leaks, codec):
    """Dict image env, 5 envs unevenly split over 2 actors, episodes ending both ways, infos, seeds."""
    fns = [DICT32] * 5
    venv = ShmVecEnv(fns, n_workers=2, backend="ray", codec=codec, verify_every=1)
    actors = venv.actors
    want = DummyVecEnv(fns)
    try:
        assert len(actors) == 2 and venv.worker_envs == [range(0, 3), range(3, 5)]
        expected_codec = "DeltaCodec" if codec is None else "RawCodec"
        codecs = {part.leaf.name: repr(part.codec) for part in venv._eng.reader.decoded.values()}
        assert expected_codec in codecs["image"], codecs
        for v in (venv, want):
            v.seed(7)
        assert_obs_equal(venv.reset(), want.reset())
        assert venv.reset_infos == want.reset_infos
        rng = np.random.default_rng(0)
        assert_steps_equal(venv, want, 40, rng)
        assert venv.get_attr("size", indices=[1, -1]) == [32, 32]
        venv.set_attr("max_len", 3, indices=4)
        want.set_attr("max_len", 3, indices=4)
        assert venv.env_method("get_wrapper_attr", "max_len") == want.env_method(
            "get_wrapper_attr", "max_len"
        )
        assert venv.env_is_wrapped(gym.wrappers.TimeLimit) == want.env_is_wrapped(gym.wrappers.TimeLimit)
        for a, b in zip(venv.get_images(), want.get_images()):
            assert_obs_equal(a, b, "render")
        assert_steps_equal(venv, want, 20, rng, first=40)
    finally:
        venv.close()
        want.close()
    assert_actors_dead(actors)


def test_gymnasium_face_same_as_sync_vector_env(leaks):
    fns = [DICT32] * 3
    venv = ShmVectorEnv(fns, n_workers=2, backend="ray", verify_every=1)
    want = gym.vector.SyncVectorEnv(fns)
    try:
        obs, infos = venv.reset(seed=5)
        w_obs, w_infos = want.reset(seed=5)
        assert_obs_equal(obs, w_obs)
        rng = np.random.default_rng(1)
        for t in range(40):
            actions = sample_actions(want.single_action_space, 3, rng)
            got, exp = venv.step(actions), want.step(actions)
            for k, (a, b) in enumerate(zip(got[:4], exp[:4])):
                assert_obs_equal(a, b, f"step {t} item {k}")
            assert got[4].keys() == exp[4].keys(), f"step {t} infos"
        assert venv.render()[0].shape == want.render()[0].shape
    finally:
        venv.close()
        want.close()


def test_text_in_dict_same_as_sync_vector_env(leaks):
    """Object leaves (a Text at a Dict key, as MiniGrid's) travel in the pickled reply; final_obs too."""
    fn = functools.partial(make_object_env, "text-in-dict")
    assert run_both((fn, fn), SAME, n_envs=3, steps=30, backend="ray", start_method=None) == {
        "terminated",
        "truncated",
    }


@pytest.mark.parametrize("order", ["first_ready", "deterministic"])
def test_pool_mode_on_ray_steps_each_env_as_alone(leaks, order):
    """Pool mode through the transport contract: every env's trajectory equals that env stepped
    alone, whichever group comes back first."""
    venv = ShmVectorEnv([FAULTY] * 4, batch_size=2, n_workers=2, backend="ray", pool_order=order)
    try:
        got, order_seen = run_pool(venv, 0, each=6)
    finally:
        venv.close()
    check_trajectories(FAULTY, got)
    assert all(len(ids) == 2 for ids in order_seen)


@pytest.mark.parametrize("on_crash", ["raise", "restart"])
def test_pool_mode_on_ray_killed_actor(leaks, on_crash):
    """A killed actor in pool mode: raise mode closes with the crash naming worker and envs, as a
    killed local worker does; restart mode ends its envs' episode (truncated, restart keys) in place
    of the lost step and the other envs lose nothing."""
    venv = ShmVectorEnv([FAULTY] * 4, batch_size=2, n_workers=2, backend="ray", on_crash=on_crash)
    try:
        venv.async_reset(seed=0)
        for _ in range(4):
            venv.recv()
            venv.send(np.zeros(2, np.int64))
        ray.kill(venv.actors[1])
        if on_crash == "raise":
            with pytest.raises(WorkerCrashedError, match=r"worker 1 \(pid \d+, envs 2\.\.3\), a Ray actor"):
                for _ in range(8):
                    venv.recv()
                    venv.send(np.zeros(2, np.int64))
            assert venv.closed
            return
        restarted = []
        for _ in range(8):
            _, rewards, _, truncs, infos = venv.recv()
            ids = infos["env_id"].tolist()
            if RESTARTED_KEY in infos:
                marked = [i for pos, i in enumerate(ids) if infos[f"_{RESTARTED_KEY}"][pos]]
                assert all(truncs[ids.index(i)] and rewards[ids.index(i)] == 0.0 for i in marked)
                restarted += marked
            venv.send(np.zeros(2, np.int64))
        assert sorted(restarted) == [2, 3] and venv.n_restarts == 1
    finally:
        venv.close()


def test_default_placement_puts_two_workers_on_two_nodes(leaks):
    """Without ray_options each worker reserves a CPU of its own node (Ray's default packs)."""
    placed = worker_nodes(10, 2, DICT32)
    together = [nodes for nodes in placed if len(set(nodes)) != 2]
    assert not together, f"{len(together)} of 10 runs had both workers on one node"


def test_actors_spread_over_nodes(leaks):
    # SPREAD alone is best effort (CI once got both actors on one node); each node has 1 CPU, so
    # actors that need 1 CPU each can only be spread.
    options = {"scheduling_strategy": "SPREAD", "num_cpus": 1}
    venv = ShmVecEnv([DICT32] * 4, n_workers=2, backend="ray", ray_options=options)
    try:
        nodes = venv._eng.transport.nodes
        assert len(set(nodes)) == 2, f"both actors on one node: {nodes}"
        assert {n["NodeID"] for n in ray.nodes()} == set(nodes)
    finally:
        venv.close()


@pytest.mark.timeout(120)
def test_killed_actor_is_a_worker_crash_naming_its_envs(leaks):
    venv = ShmVecEnv([DICT32] * 5, n_workers=2, backend="ray")
    actors = venv.actors
    venv.reset()
    venv.step(np.zeros((5, 2), np.float32))
    ray.kill(actors[1])
    with pytest.raises(WorkerCrashedError, match=r"worker 1 \(pid \d+, envs 3\.\.4\), a Ray actor") as info:
        for _ in range(20):  # Ray reports the death within a few calls at most
            venv.step(np.zeros((5, 2), np.float32))
    assert (info.value.worker_index, info.value.env_indices) == (1, [3, 4])
    assert venv.closed
    assert_actors_dead(actors)


def test_restart_mode_recreates_the_actor_and_ends_its_episodes_truncated(leaks):
    venv = ShmVecEnv([DICT32] * 5, n_workers=2, backend="ray", on_crash="restart", verify_every=1)
    try:
        venv.reset()
        actions = np.zeros((5, 2), np.float32)
        venv.step(actions)
        old = venv.actors[0]
        ray.kill(old)
        for _ in range(20):
            _, _, dones, infos = venv.step(actions)
            if venv.n_restarts:
                break
        assert venv.n_restarts == 1
        for i in range(3):
            assert dones[i] and infos[i]["TimeLimit.truncated"] and infos[i]["shmvec.restarted"]
            assert "terminal_observation" in infos[i]
        assert not any(infos[i].get("shmvec.restarted") for i in (3, 4))
        assert venv.actors[0] != old
        for _ in range(30):  # the rebuilt actor steps on, codec streams in step (verify_every=1)
            venv.step(actions)
    finally:
        venv.close()


def test_hung_actor_times_out(leaks):
    venv = ShmVecEnv([functools.partial(SlowStepEnv, 60.0)] * 2, n_workers=2, backend="ray", timeout=2.0)
    actors = venv.actors
    venv.reset()
    with pytest.raises(
        EnvTimeoutError, match=r"worker 0 \(pid \d+, envs 0\.\.0\) did not answer step within 2 s"
    ):
        venv.step(np.zeros(2, np.int64))
    assert venv.closed
    assert_actors_dead(actors)


def test_checksum_catches_a_corrupted_frame(leaks):
    fns = [functools.partial(DictImageEnv, 32, 50)] * 2
    venv = ShmVecEnv(fns, n_workers=1, backend="ray", codec={"image": CorruptingCodec()}, verify_every=1)
    # Seeded: episodes last 1-49 steps, and one that ended at step 1 would encode its terminal and
    # reset frames before env 1's (frame 4 then env 0's). With seeds 0 and 1 they last 42 and 24.
    venv.seed(0)
    try:
        venv.reset()  # frames 1 and 2
        venv.step(np.zeros((2, 2), np.float32))  # 3 and 4: env 1's is corrupted
        pytest.fail("the corrupted frame was not noticed")
    except CodecMismatchError as exc:
        assert (exc.env_index, exc.key) == (1, "image")
    finally:
        venv.close()


def test_close_kills_every_actor_and_frees_their_cpus(leaks):
    total = ray.cluster_resources()["CPU"]
    venv = ShmVecEnv([DICT32] * 2, n_workers=2, backend="ray", ray_options={"num_cpus": 1})
    actors = venv.actors
    assert ray.available_resources().get("CPU", 0) == 0  # both 1-CPU nodes taken
    venv.close()
    venv.close()  # idempotent
    assert_actors_dead(actors)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == total


def test_ppo_parameters_identical_to_dummy_vec_env(leaks):
    import torch

    from tests.training import ALGOS, assert_same_parameters, train_tiny

    algo, kwargs = ALGOS["ppo"]
    torch.set_num_threads(1)
    want = train_tiny(algo, DummyVecEnv, **kwargs)
    got = train_tiny(algo, ShmVecEnv, vec_env_kwargs={"backend": "ray", "n_workers": 2}, **kwargs)
    assert_same_parameters(got, want)


def test_starts_and_shuts_down_its_own_ray_when_none_is_running(cluster, monkeypatch):
    """Without a connection: one of its own (ray.init(), which joins the cluster named by RAY_ADDRESS
    as for a user's script), shared by every VecEnv that needs it, shut down when the last closes."""
    address = cluster.address
    # Without it ray.init() finds this cluster_utils cluster through its session files, and actors
    # created on that connection die before they start (seen with Ray 2.60 after ray.shutdown()).
    monkeypatch.setenv("RAY_ADDRESS", address)
    ray.shutdown()
    try:
        first = ShmVecEnv([DICT32] * 2, n_workers=1, backend="ray")
        second = ShmVectorEnv([DICT32] * 2, n_workers=1, backend="ray")
        assert ray.is_initialized()
        first.reset()
        first.close()
        assert ray.is_initialized(), "closing one VecEnv cut the connection the other one uses"
        second.reset(seed=1)
        second.close()
        assert not ray.is_initialized()
    finally:
        if not ray.is_initialized():
            ray.init(address=address)


def test_ppo_training_goes_on_after_an_actor_is_killed(leaks):
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    from tests.envs import TinyImageEnv

    class KillOnce(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.truncated_by_restart = 0

        def _on_step(self) -> bool:
            if self.n_calls == 10:
                ray.kill(self.training_env.unwrapped.actors[1])
            for info in self.locals["infos"]:
                if info.get("shmvec.restarted"):
                    assert info["TimeLimit.truncated"]
                    self.truncated_by_restart += 1
            return True

    torch.set_num_threads(1)
    venv = make_vec_env(
        TinyImageEnv,
        n_envs=4,
        seed=3,
        vec_env_cls=ShmVecEnv,
        vec_env_kwargs={"backend": "ray", "n_workers": 2, "on_crash": "restart"},
    )
    try:
        model = PPO("CnnPolicy", venv, n_steps=32, batch_size=64, n_epochs=1, seed=3, device="cpu")
        callback = KillOnce()
        model.learn(256, callback=callback)
        assert venv.n_restarts == 1
        assert callback.truncated_by_restart == 2  # the killed actor's two envs, once
        assert model.num_timesteps >= 256
    finally:
        venv.close()


@pytest.mark.parametrize("backend", ["ray", "ray-naive"])
def test_bench_backends_step_like_dummy_vec_env(leaks, backend):
    """`shmvec bench --backends ray,ray-naive`: both built from the same factories, same batches."""
    from shmvec.bench.backends import make_vec_env

    fns = [DICT32] * 3
    venv = make_vec_env(backend, fns, n_workers=2)
    want = DummyVecEnv(fns)
    try:
        venv.seed(4)
        want.seed(4)
        obs = venv.reset()
        w_obs = want.reset()
        for k in w_obs:
            np.testing.assert_array_equal(obs[k], w_obs[k])
        for t in range(15):
            actions = sample_actions(want.action_space, 3, np.random.default_rng(t))
            venv.step_async(actions)
            _, rewards, dones, _ = venv.step_wait()
            _, w_rewards, w_dones, _ = want.step(actions)
            np.testing.assert_array_equal(rewards, w_rewards)
            np.testing.assert_array_equal(dones, w_dones)
    finally:
        venv.close()
        want.close()


def test_native_atari_step_matches_dummy(leaks, tmp_path):
    """SB3's Atari recipe in Ray actors takes the native step path (its frames encoded by the
    default delta codec on the way) and equals DummyVecEnv, Monitor files included."""
    from tests.atari_helpers import registered, run_sb3

    env_fn = functools.partial(registered, "BreakoutNoFrameskip-v4")
    ends = run_sb3(env_fn, tmp_path, n_envs=2, steps=300, backend="ray", n_workers=2)
    assert ends["life lost"] >= 1, ends


def test_make_atari_env_one_liner_works_without_registering_in_the_factory(leaks, monkeypatch):
    """SB3's ``make_atari_env`` factories call ``gym.make`` without importing ale-py, and actors never
    import the driver's script: each actor first imports the packages that registered the driver's
    envs, so the one-line form runs in Ray actors and equals DummyVecEnv. Negative control: with
    that list empty the actors cannot find the game, and the error says how to register it."""
    import ale_py
    from stable_baselines3.common.env_util import make_atari_env

    import shmvec.transports.ray.transport as ray_transport

    gym.register_envs(ale_py)
    make = functools.partial(make_atari_env, "PongNoFrameskip-v4", n_envs=2, seed=3)
    venv = make(vec_env_cls=ShmVecEnv, vec_env_kwargs={"backend": "ray", "n_workers": 2})
    want = make(vec_env_cls=DummyVecEnv)
    try:
        assert "ale_py" in ray_transport.env_packages()
        assert_obs_equal(venv.reset(), want.reset())
        rng = np.random.default_rng(0)
        assert_steps_equal(venv, want, 60, rng)
    finally:
        venv.close()
        want.close()
    monkeypatch.setattr(ray_transport, "env_packages", lambda: ())
    with pytest.raises(Exception, match=r"gym\.register_envs\(ale_py\)"):
        make(vec_env_cls=ShmVecEnv, vec_env_kwargs={"backend": "ray", "n_workers": 2})


def test_a_split_send_steps_only_the_envs_named(leaks):
    """``send(..., split=True)`` (Tianshou's face): an actor steps only the envs named, its packed
    batch carries the others' rows unread, and a stateful codec's streams stay in step."""
    check_split_steps("disabled", backend="ray", codec={"image": "delta"}, verify_every=1)
