"""What the tests of the Gymnasium face (``ShmVectorEnv``) share: the envs they compare, building
one, comparing its results with SyncVectorEnv's, and the fault scenarios (which env misbehaves,
where, and what a restart leaves in the infos)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym

import shmvec
from shmvec.engine.restart import REASON_KEY, RESTARTED_KEY
from shmvec.synthetic import SyntheticImageEnv
from shmvec.testing import assert_equivalent
from shmvec.testing.compare import gymnasium_difference, value_difference
from shmvec.vector_env import AutoresetMode
from tests import fault_helpers
from tests.envs import CRASHES, make_dict_env, make_tuple_env
from tests.fault_helpers import ACTIONS, N_ENVS
from tests.helpers import check
from tests.vector_envs import make_mutating

NEXT, SAME, DISABLED = AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED
#: The modes Gymnasium's own SyncVectorEnv has, the reference (Gymnasium 1.0: next-step autoreset only).
REFERENCE_MODES = [NEXT, SAME, DISABLED] if hasattr(gym.vector, "AutoresetMode") else [NEXT]

# name -> factory (shmvec.testing copies what the reference's envs return: the mutating envs' true values)
ENVS = {
    "image": functools.partial(SyntheticImageEnv, (24, 20, 3), episode_len=(3, 9)),
    "dict": functools.partial(make_dict_env, 12, 8),
    "tuple": make_tuple_env,
    "mutating": make_mutating,
    "mutating-dict": functools.partial(make_mutating, True),
}


def make(fns, **kwargs) -> gym.vector.VectorEnv:
    """A ShmVectorEnv, on fork (the fastest start) with 2 workers unless the test says otherwise."""
    kwargs.setdefault("start_method", "fork")
    kwargs.setdefault("n_workers", min(2, len(fns)))
    return shmvec.ShmVectorEnv(fns, **kwargs)


# ---------------------------------------------------------------- comparing results


def assert_value_equal(got: Any, want: Any, where: str) -> None:
    """Equality of any value (infos, lists of them): arrays by dtype, shape and content, containers
    element by element, dicts in any key order, Python scalars by type and value."""
    check(value_difference(got, want, where, ordered=False))


def assert_reset_equal(got: tuple, want: tuple, where: str) -> None:
    check(gymnasium_difference(got, want), where)


def assert_step_equal(got: tuple, want: tuple, where: str) -> None:
    assert len(got) == 5, f"{where}: step returned {len(got)} items"
    check(gymnasium_difference(got, want), where)


def run_both(
    kind: str | Any,
    mode: AutoresetMode,
    n_envs: int = 5,
    steps: int = 40,
    seed: int = 3,
    wrap_reference: Callable[[gym.vector.VectorEnv], gym.vector.VectorEnv] | None = None,
    **kwargs,
):
    """ShmVectorEnv against SyncVectorEnv through :func:`shmvec.testing.assert_equivalent`: every
    array of every step (DISABLED mode resets the envs that ended with ``reset_mask``), an explicit
    ``reset()`` half-way. ``kind``: a key of :data:`ENVS`, a factory, or a pair whose first item is
    the factory (the reference's copy of the outputs is made by shmvec.testing). ``wrap_reference``:
    what the SyncVectorEnv is wrapped in before it is compared (a reference computed in the test).
    Returns how the episodes ended ("terminated", "truncated").
    """
    fn = ENVS[kind] if isinstance(kind, str) else kind
    fn = fn[0] if isinstance(fn, tuple) else fn
    kwargs.setdefault("start_method", "fork")
    kwargs.setdefault("n_workers", min(2, n_envs))
    report = assert_equivalent(
        [fn] * n_envs,
        steps,
        seed,
        "gymnasium",
        options={"level": 1},
        wrap_reference=wrap_reference,
        autoreset_mode=mode,
        **kwargs,
    )
    return {name for name in ("terminated", "truncated") if getattr(report, name)}


# Where the victim misbehaves: FaultyEnv's `where`, its `at`, and how the test triggers it.
WHERE = {"step": ("step", 3), "reset": ("reset", 2), "call": ("method", 1)}


def faulty_fns(fault: str | None, where: str = "step", victim: int = 3, **kwargs):
    """:func:`tests.fault_helpers.faulty_fns`, the victim misbehaving where :func:`trigger` makes it."""
    fault_where, at = WHERE[where]
    return fault_helpers.faulty_fns(fault, at, fault_where, victim, **kwargs)


def trigger(env, where: str):
    """Run the command in which the victim misbehaves: its third step, its second reset, or a call."""
    if where == "step":
        env.step(ACTIONS)
        env.step(ACTIONS)
        return env.step(ACTIONS)
    if where == "reset":
        env.step(ACTIONS)
        return env.reset(seed=10)
    return env.call("misbehave_now")


def restart_reason(fault: str, command: str) -> str:
    if fault in CRASHES:
        return CRASHES[fault].format(command=command)
    if fault == "raise":
        return rf"env 3 raised RuntimeError during {command}: simulated env failure"
    return rf"worker 1 \(pid \d+, envs 2\.\.3\) did not answer {command} within 1 s"


def assert_restarted(infos: dict, envs: list[int], fault: str, command: str) -> None:
    """The restart info keys, with their mask, on exactly the envs of the rebuilt worker."""
    assert RESTARTED_KEY in infos and REASON_KEY in infos, sorted(infos)
    mask = [i in envs for i in range(N_ENVS)]
    assert infos[f"_{RESTARTED_KEY}"].tolist() == mask
    assert infos[f"_{REASON_KEY}"].tolist() == mask
    for i in envs:
        assert infos[RESTARTED_KEY][i] == True  # noqa: E712 (a numpy bool)
        assert re.search(restart_reason(fault, command), infos[REASON_KEY][i]), infos[REASON_KEY][i]


def not_restarted(infos: dict) -> bool:
    return RESTARTED_KEY not in infos or not infos[f"_{RESTARTED_KEY}"].any()
