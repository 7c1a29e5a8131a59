"""A worker's envs (a contiguous group of the vector env's) and the handler of each command.

Each ``Step`` writes observations, rewards and flags of the worker's envs into the ring slot named
by the main process and returns the few non-empty info dicts, and the values of the observation
leaves that have no place in the ring (object leaves: Text, Sequence, Graph...). An exception in an
env becomes a :class:`~shmvec.wire.messages.Failed` reply (with env index and traceback) and the
worker goes on, so one failing ``get_attr`` or ``step`` never leaves the main process waiting on a
dead worker. The same group runs in a local worker process (:mod:`shmvec.worker.loop`) and in a Ray actor
(:mod:`shmvec.transports.ray.actor`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from shmvec.errors import ObservationError
from shmvec.memory.infos import InfoColumns
from shmvec.memory.layout import (
    AS_RETURNED,
    Leaf,
    check_finite,
    flatten,
    inf_allowed,
    leaves,
    leaves_as_returned,
    write_leaf,
)
from shmvec.memory.ring import Ring
from shmvec.native import NativeStatus
from shmvec.wire import messages as m
from shmvec.worker.envapi import check_reset, check_step, has_wrapper_attr, is_wrapped
from shmvec.worker.process import GlobalRngs
from shmvec.worker.step_paths import adapt
from shmvec.worker.taps import Taps

if TYPE_CHECKING:
    from shmvec.worker.encoder import LeafEncoder


class EnvGroup:
    """State of one worker: its envs and its rows of the ring.

    :param envs: the worker's envs, in env order.
    :param first_env: global index of the first.
    :param rngs: per-env global RNG states, or None to leave the globals shared.
    """

    def __init__(self, envs: list[gym.Env], first_env: int, rngs: GlobalRngs | None = None) -> None:
        self.rngs = rngs
        self.envs = envs
        self.first_env = first_env
        self.current: int | None = None  # local index of the env being called, for error reports
        self.space = envs[0].observation_space
        self.every: list[Leaf] = []  # every leaf of the observation space
        self.leaves: list[Leaf] = []  # the fixed-size leaves (in the ring)
        self.objects: list[int] = []  # positions (in leaves() order) of the object leaves, if any
        self.ring: Ring | None = None
        self.obs: list[Any] = []  # per leaf: the batched ring array, or an EncodedArea
        self.final: list[Any] = []
        self.encoders: list[LeafEncoder] = []
        self.finite_rules: list[bool | None] | None = None  # set by Configure(check_finite=True)
        self.names: list[str] = []
        # Autoreset: "same_step" (reset inside the step that ends an episode, SB3's way), "next_step"
        # (reset in place of the following step) or "disabled" (the caller resets).
        self.autoreset = "same_step"
        self.ended = [False] * len(envs)  # envs whose next step is a reset (next_step mode, rebuilt)
        self.next_seeds: list[int | None] = [None] * len(envs)  # seeds of those resets
        self.infos: InfoColumns | None = None  # typed info columns, once the engine sends a schema
        self.spin_s = 0.0  # how long the worker process polls for its next command (see waiting.py)
        self.actions: np.ndarray | None = None
        # Per env: its native step (shmvec.native), which writes the observation into the ring row.
        self.native: list[Any] = [None] * len(envs)
        self.scratch: np.ndarray | None = None  # where native steps write when the row is encoded
        self.taps: Taps | None = None  # what it writes into recording tapes (shmvec.worker.taps)

    def attach(self, msg: m.Attach, ring: Ring | None = None) -> m.Returned:
        """Map the ring (``ring``: a Ray actor's private ring of this worker's envs only, rows from 0,
        instead of the spec's), set up an encoder per encoded leaf and find each env's native step
        path; the reply holds each env's :class:`~shmvec.native.NativeStatus`."""
        # The main process has checked the space can be laid out before sending the ring.
        self.every = every = leaves(self.space)
        self.objects = [j for j, leaf in enumerate(every) if not leaf.fixed]
        self.leaves = [leaf for leaf in every if leaf.fixed]
        self.ring = Ring.attach(msg.spec) if ring is None else ring
        lo = self.first_env if ring is None else 0
        hi = lo + len(self.envs)
        self.obs, self.final = [], []
        for j, leaf in enumerate(every):
            if not leaf.fixed:
                continue
            codec = msg.codecs[j] if msg.codecs else None
            if codec is None:
                self.obs.append(self.ring.obs(j)[:, lo:hi])
                self.final.append(self.ring.final(j)[lo:hi])
                continue
            # Imported only with a codec: the default path loads nothing more in the worker.
            from shmvec.worker.encoder import LeafEncoder

            encoder = LeafEncoder(codec, leaf, self.ring, j, range(lo, hi), msg.verify_every)
            self.encoders.append(encoder)
            self.obs.append(encoder.obs)
            self.final.append(encoder.final)
        self.rewards = self.ring.rewards[:, lo:hi]
        self.terminated = self.ring.terminated[:, lo:hi]
        self.truncated = self.ring.truncated[:, lo:hi]
        actions = self.ring.actions
        self.actions = None if actions is None else actions[lo:hi]
        self.names = [leaf.name for leaf in every]
        return m.Returned(self._find_native(msg.native))

    def _find_native(self, wanted: bool) -> list[NativeStatus]:
        if not wanted:
            return [NativeStatus(None, "native_step=False")] * len(self.envs)
        if len(self.every) != 1 or not self.every[0].fixed:
            return [NativeStatus(None, "a Dict or Tuple observation space")] * len(self.envs)
        statuses = []
        for i, env in enumerate(self.envs):
            self.native[i], status = adapt(env)
            statuses.append(status)
        if any(self.native):
            leaf = self.every[0]
            self.scratch = np.zeros(leaf.shape, leaf.dtype)
        return statuses

    def _sync(self, i: int) -> None:
        """Before a call into env ``i`` other than its native step: let the native step write back
        what it keeps in its own form (see :mod:`shmvec.native`)."""
        native = self.native[i]
        if native is not None:
            native.sync()

    def _reset(self, i: int, **kwargs: Any) -> Any:
        """``env.reset(**kwargs)`` of env ``i``, by its native step's ``reset`` where it has one
        (a recognised chain restates its frequent resets: :mod:`shmvec.atari.sb3`; it syncs
        itself before any call into the wrappers)."""
        reset = getattr(self.native[i], "reset", None)
        if reset is None:
            self._sync(i)
            reset = self.envs[i].reset
        return reset(**kwargs)

    def configure(self, msg: m.Configure) -> m.Returned:
        """Apply the options of ``msg`` that are set (see :class:`~shmvec.wire.messages.Configure`)."""
        if msg.spin_us is not None:
            self.spin_s = msg.spin_us / 1e6
        if msg.check_finite:
            self.finite_rules = inf_allowed(self.space)
        if msg.autoreset is not None:
            self.autoreset = msg.autoreset
        if msg.key_frames:
            for encoder in self.encoders:
                for i in range(len(self.envs)):
                    encoder.restart(i)
        if msg.info_schema is not None and self.ring is not None and self.ring.info_words is not None:
            self.infos = InfoColumns(msg.info_schema, *self.ring.info_words)
        if msg.reset_seeds is not None:
            self.ended = [True] * len(self.envs)
            self.next_seeds = list(msg.reset_seeds)
        if msg.record is not None:
            self.taps = Taps.replace(self.taps, msg.record, self)
        return m.Returned()

    def write(self, dst: list[np.ndarray], i: int, obs: Any, terminal: bool = False) -> list[Any]:
        """Write env ``i``'s observation ``obs`` into ``dst`` (one array per fixed-size leaf); all its
        leaf values, in :func:`~shmvec.memory.layout.leaves` order (the object leaves' values too,
        which the ring has no place for)."""
        env_index = self.first_env + i
        values = flatten(self.space, obs, [])
        if self.finite_rules is not None:
            # Checked on the values, before any codec: works the same for raw and encoded leaves.
            arrays = [v if r is None else np.asarray(v)[None] for v, r in zip(values, self.finite_rules)]
            found = check_finite(arrays, self.finite_rules, self.names)
            if found is not None:
                raise ObservationError(f"env {env_index}, {'terminal ' if terminal else ''}{found[1]}")
        fixed = [v for j, v in enumerate(values) if j not in self.objects] if self.objects else values
        for leaf, arr, value in zip(self.leaves, dst, fixed):
            write_leaf(arr, i, value, leaf, env_index)
        return values

    def step(self, msg: m.Step) -> m.Stepped:
        slot = msg.slot
        actions = self.actions if msg.actions is None else msg.actions
        assert actions is not None, "a step without actions needs the ring's typed action buffer"
        obs_slot = [a[slot] for a in self.obs]
        rewards, terminated, truncated = self.rewards[slot], self.terminated[slot], self.truncated[slot]
        same_step = self.autoreset == "same_step"
        ended = self.ended
        rngs = self.rngs
        typed = self.infos
        native = self.native
        taps = self.taps
        # Native steps write straight into the ring row unless a codec or a check reads it first.
        direct = not self.encoders and self.finite_rules is None
        replies = []
        objects: m.Objects | None = {} if self.objects else None
        final_objects: m.Objects | None = None
        envs = self.envs
        for i in range(len(envs)) if msg.envs is None else msg.envs:
            env = envs[i]
            self.current = i
            if rngs is not None:
                rngs.enter(i)
            reset_info = final = action = None
            in_place = False  # the observation is in the ring row already
            if ended[i]:
                # next_step mode: the episode ended in the last step; this step is its reset.
                ended[i] = False
                seed, self.next_seeds[i] = self.next_seeds[i], None
                obs, info = check_reset(self._reset(i, seed=seed), self.first_env + i)
                self._restart_codecs(i)
                term = trunc = False
                reward = 0.0
            else:
                action = actions[i]
                if isinstance(action, np.ndarray):
                    # A view into the ring (or into the unpickled batch) must not be kept by the env.
                    action = action.copy()
                if native[i] is not None:
                    obs = obs_slot[0][i] if direct else self.scratch
                    reward, term, trunc, info = native[i].step_into(action, obs)
                    in_place = direct
                else:
                    obs, reward, term, trunc, info = check_step(env.step(action), self.first_env + i)
                if term or trunc:
                    if same_step:
                        # The terminal observation goes to its own area before the reset obs fills
                        # the slot, and the info is copied: an env may reuse and mutate both in reset().
                        values = self.write(self.final, i, obs, terminal=True)
                        if taps is not None:
                            taps.ended(i)
                            final = values
                        if self.objects:
                            final_objects = final_objects or {}
                            final_objects[i] = copy.deepcopy([values[j] for j in self.objects])
                        info = copy.deepcopy(info)
                        # Leaves the ring would give back changed (an int as np.int64...) travel
                        # as the env returned them: the faces' final observation is the env's.
                        returned = leaves_as_returned(self.every, values, self.objects)
                        obs, reset_info = check_reset(self._reset(i), self.first_env + i)
                        in_place = False
                        if returned:
                            reset_info = {**reset_info, AS_RETURNED: returned}
                        self._restart_codecs(i)
                    elif self.autoreset == "next_step":
                        ended[i] = True
            if rngs is not None:
                rngs.leave(i)
            if not in_place:
                values = self.write(obs_slot, i, obs)
            if objects is not None:
                objects[i] = [values[j] for j in self.objects]
            if taps is not None:
                now = [obs_slot[0][i]] if in_place else values
                if action is None:
                    taps.reset(i, now, seed)
                else:
                    taps.stepped(i, action, reward, term, trunc, now, final)
            rewards[i] = reward
            terminated[i] = term
            truncated[i] = trunc
            if typed is not None:
                info = typed.put(slot, self.first_env + i, info)
            if info or reset_info is not None:
                replies.append((i, info, reset_info))
        self.current = None
        return m.Stepped(replies, objects, final_objects)

    def _restart_codecs(self, i: int) -> None:
        for encoder in self.encoders:
            encoder.restart(i)

    def reset(self, msg: m.Reset) -> m.ResetDone:
        """Reset the envs (all, or those of the mask); their reset infos, None for envs not reset.
        Each env's ``reset`` gets its seed and its keyword arguments."""
        obs_slot = [a[msg.slot] for a in self.obs]
        infos: list[dict | None] = []
        objects: m.Objects | None = {} if self.objects else None
        for i in range(len(self.envs)):
            if msg.mask is not None and not msg.mask[i]:
                infos.append(None)
                continue
            self.current = i
            self.ended[i], self.next_seeds[i] = False, None
            if self.rngs is not None:
                self.rngs.enter(i)
            obs, info = check_reset(self._reset(i, seed=msg.seeds[i], **msg.kwargs[i]), self.first_env + i)
            if self.rngs is not None:
                self.rngs.leave(i)
            self._restart_codecs(i)
            values = self.write(obs_slot, i, obs)
            if objects is not None:
                objects[i] = [values[j] for j in self.objects]
            if self.taps is not None:
                self.taps.reset(i, values, msg.seeds[i], explicit=True)
            infos.append(info)
        self.current = None
        return m.ResetDone(infos, objects)

    def _each(self, indices: list[int], call: Callable[[gym.Env], Any]) -> m.Returned:
        results = []
        for i in indices:
            self.current = i
            if self.rngs is not None:
                self.rngs.enter(i)
            self._sync(i)
            results.append(call(self.envs[i]))
            if self.rngs is not None:
                self.rngs.leave(i)
        self.current = None
        return m.Returned(results)

    def get_attr(self, msg: m.GetAttr) -> m.Returned:
        return self._each(msg.indices, lambda env: env.get_wrapper_attr(msg.attr))

    def has_attr(self, msg: m.HasAttr) -> m.Returned:
        return self._each(msg.indices, lambda env: has_wrapper_attr(env, msg.attr))

    def set_attr(self, msg: m.SetAttr) -> m.Returned:
        self._each(msg.indices, lambda env: setattr(env, msg.attr, msg.value))
        return m.Returned()

    def env_method(self, msg: m.EnvMethod) -> m.Returned:
        def one(env: gym.Env) -> Any:
            attr = env.get_wrapper_attr(msg.attr)
            if msg.value_if_attribute and not callable(attr):
                return attr
            return attr(*msg.args, **msg.kwargs)

        return self._each(msg.indices, one)

    def set_wrapper_attr(self, msg: m.SetWrapperAttr) -> m.Returned:
        for i in msg.indices:
            self.current = i
            self._sync(i)
            self.envs[i].set_wrapper_attr(msg.attr, msg.values[self.first_env + i])
        self.current = None
        return m.Returned()

    def is_wrapped(self, msg: m.IsWrapped) -> m.Returned:
        return self._each(msg.indices, lambda env: is_wrapped(env, msg.wrapper_class))

    def render(self, msg: m.Render) -> m.Returned:
        return self._each(msg.indices, lambda env: env.render())

    def close(self) -> None:
        for env in self.envs:
            with contextlib.suppress(Exception):
                env.close()
        # Views into the mapping must go before it can be unmapped.
        self.obs = self.final = []
        self.native = [None] * len(self.envs)
        self.encoders = []
        self.actions = None
        if self.taps is not None:
            self.taps.close()
            self.taps = None
        if self.ring is not None:
            self.ring.close()
