"""``device=``: observations as torch tensors, equal to the numpy results array for array on both
faces (``"cpu"`` everywhere, ``"cuda"`` where a GPU is: the same tests, skipped with the reason
without one), ``"cpu"`` tensors lent by the same rules as numpy views; option errors before any
worker starts. What only the CUDA path has (fences against a delayed copy, registered pages) is in
test_device_cuda.py."""

from __future__ import annotations

import functools
import subprocess
import sys
from contextlib import closing

import numpy as np
import pytest
import torch

from shmvec import ShmVecEnv, ShmVectorEnv
from shmvec.engine.slots import Slots
from shmvec.synthetic import SyntheticImageEnv
from shmvec.transports.local import LocalTransport
from tests.device_checks import Expect, assert_same, gym_run, sb3_run
from tests.envs import DictImageEnv, FaultyEnv, TupleEnv
from tests.helpers import ROOT, require, run_script
from tests.object_envs import make_object_env

IMAGE = functools.partial(SyntheticImageEnv, (12, 10, 3), episode_len=(2, 5))
ACTIONS = np.zeros(3, np.int64)
CPU = Expect("cpu")
NO_CUDA = f"needs a CUDA GPU (torch {torch.__version__}, no CUDA device visible)"
#: Where the equality tests run: the CPU always, a GPU when there is one.
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)),
]


def _slot_addresses(env) -> set[int]:
    obs = env._eng.ring.obs(0)
    return {int(obs[s].__array_interface__["data"][0]) for s in range(obs.shape[0])}


# ---------------------------------------------------------------- the same results as numpy


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("copy", [True, False])
@pytest.mark.parametrize(
    "fns", [[IMAGE] * 3, [DictImageEnv] * 3, [TupleEnv] * 3], ids=["box", "dict", "tuple"]
)
def test_sb3_face_tensors_equal_the_numpy_results(no_leaks, fns, copy, device):
    kwargs = dict(n_workers=2, copy=copy)
    want = sb3_run(fns, 15, Expect(None), **kwargs)
    assert_same(sb3_run(fns, 15, Expect(device), device=device, **kwargs), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["next_step", "same_step", "disabled"])
def test_gymnasium_face_tensors_equal_the_numpy_results(no_leaks, mode, device):
    kwargs = dict(n_workers=2, autoreset_mode=mode)
    fns = [DictImageEnv] * 3
    want = gym_run(fns, 15, Expect(None), **kwargs)
    assert_same(gym_run(fns, 15, Expect(device), device=device, **kwargs), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("copy", [True, False])
def test_pool_mode_tensors_equal_the_numpy_results(no_leaks, copy, device):
    kwargs = dict(n_workers=2, batch_size=2, pool_order="deterministic", copy=copy)
    fns = [functools.partial(FaultyEnv)] * 4
    want = gym_run(fns, 20, Expect(None), **kwargs)
    assert_same(gym_run(fns, 20, Expect(device), device=device, **kwargs), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("face", ["sb3", "gymnasium"])
def test_device_fields_move_rewards_flags_and_terminal_observations(no_leaks, face, device):
    fields = ("rewards", "flags", "final_obs")
    run, extra = (sb3_run, {}) if face == "sb3" else (gym_run, {"autoreset_mode": "same_step"})
    fns = [DictImageEnv] * 3
    want = run(fns, 15, Expect(None), n_workers=2, **extra)
    ended = [("terminal_observation" in str(batch[-1])) or ("final_obs" in batch[-1]) for batch in want[1:]]
    assert any(ended), "no episode ended: no terminal observation was compared"
    got = run(fns, 15, Expect(device, fields), n_workers=2, device=device, device_fields=fields, **extra)
    assert_same(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("copy", [True, False])
def test_with_a_codec(no_leaks, copy, device):
    kwargs = dict(n_workers=2, codec="delta", copy=copy)
    want = sb3_run([DictImageEnv] * 3, 12, Expect(None), **kwargs)
    assert_same(sb3_run([DictImageEnv] * 3, 12, Expect(device), device=device, **kwargs), want)


@pytest.mark.parametrize("device", DEVICES)
def test_with_frame_stack(no_leaks, device):
    for run in (sb3_run, gym_run):
        want = run([IMAGE] * 3, 12, Expect(None), n_workers=2, frame_stack=3)
        assert_same(run([IMAGE] * 3, 12, Expect(device), n_workers=2, frame_stack=3, device=device), want)


@pytest.mark.parametrize("device", DEVICES)
def test_in_restart_mode(no_leaks, device):
    fns = [FaultyEnv] * 4
    fns[3] = functools.partial(FaultyEnv, "kill", 3)
    kwargs = dict(n_workers=2, on_crash="restart")
    want = sb3_run(fns, 8, Expect(None), **kwargs)
    assert any(info.get("shmvec.restarted") for batch in want[1:] for info in batch[3])  # it restarted
    assert_same(sb3_run(fns, 8, Expect(device), device=device, **kwargs), want)


def test_leaves_without_a_fixed_size_stay_as_they_are(no_leaks):
    fn = functools.partial(make_object_env, "text-in-dict")
    for run in (sb3_run, gym_run):
        want = run([fn] * 3, 10, Expect(None), n_workers=2)
        got = run([fn] * 3, 10, CPU, n_workers=2, device="cpu")  # as_numpy: "mission" untouched
        assert_same(got, want)


# ---------------------------------------------------------------- lending


def test_a_held_tensor_keeps_its_slot_and_dropping_it_frees_the_slot(no_leaks):
    # 4 slots: the held batch, the previous one (the loop's obs), the one written, one to lend next.
    with ShmVecEnv([IMAGE] * 3, "fork", n_workers=2, n_slots=4, device="cpu") as env:
        env.seed(0)
        env.reset()
        held = env.step(ACTIONS)[0]
        address = held.data_ptr()
        assert address in _slot_addresses(env)  # the ring slot itself: no copy
        snapshot = held.clone()
        view = held[1:, ::2]  # a view of the tensor keeps the slot too
        del held
        for _ in range(20):
            obs = env.step(ACTIONS)[0]
            assert obs.data_ptr() != address, "the workers wrote a slot a tensor still references"
        assert torch.equal(view, snapshot[1:, ::2])
        assert env.copy_fallbacks == 0
        del view, obs
        seen = {env.step(ACTIONS)[0].data_ptr() for _ in range(4)}
        assert address in seen, "the slot stayed lent after its last tensor was dropped"


def test_copy_false_tensors_are_the_read_only_views_and_change_when_they_do(no_leaks):
    with (
        ShmVecEnv([IMAGE] * 3, "fork", n_workers=2, device="cpu", copy=False) as env,
        ShmVecEnv([IMAGE] * 3, "fork", n_workers=2, copy=False) as ref,
    ):
        env.seed(0)
        ref.seed(0)
        env.reset(), ref.reset()
        tensor, view = env.step(ACTIONS)[0], ref.step(ACTIONS)[0]
        assert tensor.data_ptr() in _slot_addresses(env)
        snapshot = view.copy()
        np.testing.assert_array_equal(tensor.numpy(), view)
        env.step(ACTIONS), ref.step(ACTIONS)  # valid for n_slots - 1 = 1 more step, as the view
        np.testing.assert_array_equal(tensor.numpy(), snapshot)
        env.step(ACTIONS), ref.step(ACTIONS)  # then both are the ring's newer batch
        assert not np.array_equal(view, snapshot)
        np.testing.assert_array_equal(tensor.numpy(), view)


def test_jax_and_numpy_take_the_tensors_by_dlpack_and_keep_the_slot_lent(tmp_path):
    require("jax", "pip install jax")
    # Its own interpreter: importing JAX starts threads, and forking workers after that may deadlock.
    done = run_script(
        tmp_path / "dlpack.py",
        """
        import functools
        import numpy as np
        from shmvec import ShmVecEnv
        from shmvec.synthetic import SyntheticImageEnv

        if __name__ == "__main__":
            frames = functools.partial(SyntheticImageEnv, (16, 16, 4), episode_len=(2, 5))  # 64-byte slots
            actions = np.zeros(4, np.int64)
            with ShmVecEnv([frames] * 4, "fork", n_workers=2, device="cpu") as env:
                import jax
                import jax.numpy as jnp

                env.seed(0)
                env.reset()
                tensor = env.step(actions)[0]
                address = tensor.data_ptr()
                arr = jnp.from_dlpack(tensor)
                assert arr.unsafe_buffer_pointer() == address, "JAX copied"  # it needs 64-byte alignment
                assert jax.dlpack.from_dlpack(tensor).unsafe_buffer_pointer() == address
                assert np.from_dlpack(tensor).__array_interface__["data"][0] == address
                snapshot = np.array(arr)
                del tensor
                for _ in range(10):
                    assert env.step(actions)[0].data_ptr() != address, "a slot JAX still reads was written"
                np.testing.assert_array_equal(np.array(arr), snapshot)
                del arr
                seen = {env.step(actions)[0].data_ptr() for _ in range(3)}
                assert address in seen, "the slot stayed lent after the JAX array was dropped"
            print("ok")
        """,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_numpy_reads_the_tensors_by_dlpack_without_a_copy(no_leaks):
    with closing(ShmVectorEnv([DictImageEnv] * 3, start_method="fork", n_workers=2, device="cpu")) as env:
        obs, _ = env.reset(seed=0)
        for key, tensor in obs.items():
            array = np.from_dlpack(tensor)
            assert array.__array_interface__["data"][0] == tensor.data_ptr(), key
            np.testing.assert_array_equal(array, tensor.numpy())


def test_fenced_slots_are_skipped_or_waited_for(no_leaks):
    """A slot whose (GPU) copy is in flight is lent until its event completed: with copy=True the
    workers write other slots; with copy=False (plain rotation) the step waits for the event first."""

    class Event:
        def __init__(self, ring_slot):
            self.done, self.ring_slot, self.snapshot = False, ring_slot, ring_slot.copy()
            self.untouched_when_waited = None

        def query(self):
            return self.done

        def synchronize(self):
            self.untouched_when_waited = np.array_equal(self.ring_slot, self.snapshot)
            self.done = True

    for copy in (True, False):
        with ShmVecEnv([IMAGE] * 3, "fork", n_workers=2, copy=copy) as env:
            env.seed(0)
            env.reset()
            slots, ring = env._eng.slots, env._eng.ring.obs(0)
            env.step(ACTIONS)
            fenced = slots.current
            event = Event(ring[fenced])
            slots.fence(fenced, event)
            for _ in range(6):
                env.step(ACTIONS)
                if copy:
                    assert slots.current != fenced and np.array_equal(ring[fenced], event.snapshot)
            if copy:
                assert event.untouched_when_waited is None  # never waited: other slots were free
                event.done = True
                seen = set()
                for _ in range(3):
                    env.step(ACTIONS)
                    seen.add(slots.current)
                assert fenced in seen
            else:
                assert event.untouched_when_waited is True  # waited before the workers wrote it


def test_slots_fence_unit():
    class Event:
        done = False
        waited = 0

        def query(self):
            return self.done

        def synchronize(self):
            self.waited += 1
            self.done = True

    slots, event = Slots(3, copy=True), Event()
    slots.fence(1, event)
    assert not slots.free(1) and slots.advance_all() == 2
    event.done = True
    assert slots.free(1) and slots.fences[1] is None
    rotation, event = Slots(2, copy=False), Event()
    rotation.fence(1, event)
    assert rotation.advance_all() == 1 and event.waited == 1 and rotation.fences[1] is None


# ---------------------------------------------------------------- errors before any worker starts

BAD = [
    (dict(device="cuda:7"), ValueError, r"needs CUDA|CUDA device\(s\)"),
    (dict(device="gpu"), ValueError, r"device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    (dict(device="meta"), ValueError, r"'cpu' or 'cuda' devices only"),
    (dict(device=0), TypeError, r"device must be a string"),
    (
        dict(device="cpu", device_fields=["reward"]),
        ValueError,
        r"unknown field 'reward'.*did you mean 'rewards'",
    ),
    (dict(device="cpu", device_fields="rewards"), TypeError, r"must be a list of names"),
    (dict(device_fields=["rewards"]), ValueError, r"needs device="),
    (dict(device="cpu", pin_memory=True), ValueError, r"pin_memory applies to device='cuda'"),
    (dict(pin_memory=False), ValueError, r"pin_memory applies to device='cuda'"),
    (dict(device="cpu", pin_memory="yes"), TypeError, r"pin_memory must be True, False or None"),
]


@pytest.mark.parametrize("face", [ShmVecEnv, ShmVectorEnv])
@pytest.mark.parametrize(("kwargs", "error", "match"), BAD, ids=[str(b[0]) for b in BAD])
def test_bad_device_options_fail_before_any_worker_starts(no_leaks, monkeypatch, face, kwargs, error, match):
    def started(*args, **kw):
        raise AssertionError("a worker was started before the options were checked")

    monkeypatch.setattr(LocalTransport, "start", started)
    # n_workers="auto" with more envs than CPUs: even the probe's throwaway worker comes after the check
    with pytest.raises(error, match=match):
        face([IMAGE] * 8, n_workers="auto", **kwargs)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="CUDA is available here: the CPU-only message cannot show"
)
@pytest.mark.parametrize("face", [ShmVecEnv, ShmVectorEnv])
def test_cuda_without_a_gpu_says_why(no_leaks, face):
    with pytest.raises(
        ValueError, match=r"device='cuda' needs CUDA, but torch.cuda.is_available\(\) is False"
    ):
        face([IMAGE] * 2, n_workers=1, device="cuda")


def test_without_device_torch_is_never_imported(tmp_path):
    script = tmp_path / "no_torch.py"
    script.write_text(
        "import sys\n"
        "from contextlib import closing\n"
        "import numpy as np\n"
        "import shmvec\n"
        "from tests.envs import DictImageEnv\n"
        "if __name__ == '__main__':\n"
        "    with closing(shmvec.ShmVectorEnv([DictImageEnv] * 2, n_workers=2)) as env:\n"
        "        env.reset(seed=0)\n"
        "        env.step(np.zeros((2, 2), np.float32))\n"
        "    assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
