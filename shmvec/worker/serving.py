"""A worker's command table: the handler of each command (:class:`~shmvec.worker.envs.EnvGroup`'s
methods), running one command into its reply, and building the group at start-up. Served by a local
worker process (:mod:`shmvec.worker.loop`) and by a Ray actor (:mod:`shmvec.transports.ray.actor`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cloudpickle
import gymnasium as gym

from shmvec.wire import messages as m
from shmvec.worker.envapi import make_env
from shmvec.worker.envs import EnvGroup
from shmvec.worker.process import GlobalRngs

Handler = Callable[[Any], m.Reply]


def handlers(group: EnvGroup) -> dict[type, Handler]:
    """The handler of each command a worker serves (all but :class:`~shmvec.wire.messages.Close`)."""
    return {
        m.Attach: group.attach,
        m.Configure: group.configure,
        m.Step: group.step,
        m.Reset: group.reset,
        m.GetAttr: group.get_attr,
        m.HasAttr: group.has_attr,
        m.SetAttr: group.set_attr,
        m.EnvMethod: group.env_method,
        m.SetWrapperAttr: group.set_wrapper_attr,
        m.IsWrapped: group.is_wrapped,
        m.Render: group.render,
    }


def answer(group: EnvGroup, table: dict[type, Handler], msg: m.Command, pid: int) -> m.Reply:
    """Run one command: its reply, or :class:`~shmvec.wire.messages.Failed` naming the env that raised."""
    try:
        return table[type(msg)](msg)
    except Exception as exc:
        env_index = None if group.current is None else group.first_env + group.current
        group.current = None
        return m.Failed(m.RemoteError.capture(exc, env_index, msg.label, pid))


def start_group(
    env_fns: bytes | list[Callable[[], Any]], first_env: int, isolate_rng: bool, pid: int
) -> tuple[EnvGroup | None, m.Ready | m.Failed]:
    """Create a worker's envs (in a worker process or a Ray actor): the group and its start-up reply
    (the spaces of each env), or None and :class:`~shmvec.wire.messages.Failed`."""
    envs: list[gym.Env] = []
    try:
        fns = cloudpickle.loads(env_fns) if isinstance(env_fns, bytes) else env_fns
        rngs = GlobalRngs(len(fns)) if isolate_rng else None
        for i, fn in enumerate(fns):
            if rngs is not None:
                rngs.enter(i)
            envs.append(make_env(fn))
            if rngs is not None:
                rngs.leave(i)
        spaces = [(env.observation_space, env.action_space) for env in envs]
        group = EnvGroup(envs, first_env, rngs)
    except BaseException as exc:  # noqa: BLE001 - anything a user factory raises goes back
        return None, m.Failed(m.RemoteError.capture(exc, first_env + len(envs), m.MAKE_ENV, pid))
    return group, m.Ready(spaces)
