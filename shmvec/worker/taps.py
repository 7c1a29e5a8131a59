"""What a worker writes into recording tapes (:mod:`shmvec.memory.tape`) while a recording is on.

- :class:`FrameTap`: render frames of some envs, for a video (:mod:`shmvec.recorder.video`). The
  frame is what ``env.render()`` returns: for a native Atari path, ALE's RGB screen read straight
  into the tape (``Emulator.render_into``: the env keeps its native step); for any other env, its
  ``render()`` through its wrappers. Which steps are captured is said by the main process (the
  tape's ``want`` word, SB3's ``VecVideoRecorder`` triggers on steps), or decided here at each
  reset by an ``episode_trigger`` (Gymnasium's ``RecordVideo``: whole episodes).
- :class:`StepTap`: every step and reset of some envs (observation leaves, action, reward, flags),
  for a dataset (:mod:`shmvec.recorder.dataset`).

A worker without a recording holds no tap: its step checks one attribute and writes nothing. A
frame that cannot be captured (``render()`` failed or gave another shape, or the reader left the
tape full for :data:`WAIT_S`) ends its clip as cut short; a step tape left full drops that env's
records for good (its ``want`` word says so; the reader drops the torn episode). Training goes on
either way, after one wait of :data:`WAIT_S` per env at most.

Imported by workers: numpy, cloudpickle and shmvec's memory and wire only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

import cloudpickle
import numpy as np

from shmvec.memory.tape import EXPLICIT, RESET, RESET_SEEDED, STEP, Tape, cut
from shmvec.wire import messages as m

#: How long (s) a writer waits for the reader to free a record of a full tape row.
WAIT_S = 2.0
_POLL_S = 0.0005


def _wait_for_room(tape: Tape, row: int) -> bool:
    if tape.room(row):
        return True
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        time.sleep(_POLL_S)
        if tape.room(row):
            return True
    return False


def native_frame(native: Any) -> Callable[[np.ndarray], None] | None:
    """The native step's way to write ``render()``'s frame into an array, if it has one (a native
    Atari path's emulator, under any stacking step), else None."""
    while native is not None:
        emu: Any = getattr(native, "emu", None)
        render_into = getattr(emu, "render_into", None)
        if render_into is not None and emu.renders_rgb():
            return render_into  # type: ignore[no-any-return,unused-ignore]
        native = getattr(native, "inner", None)
    return None


class FrameTap:
    """Render frames of the envs of a :class:`~shmvec.wire.messages.RecordFrames` order that are
    this worker's.

    :param order: the order.
    :param group: the worker's :class:`~shmvec.worker.envs.EnvGroup` (its envs, native steps, sync).
    """

    def __init__(self, order: m.RecordFrames, group: Any) -> None:
        self.tape = tape = Tape.attach(order.tape)
        self.group = group
        first, n = group.first_env, len(group.envs)
        self.rows = {env - first: row for env, row in tape.rows.items() if first <= env < first + n}
        self.trigger = None if order.episode_trigger is None else cloudpickle.loads(order.episode_trigger)
        self.length = order.video_length or float("inf")
        # Per row (episode trigger): the episode it is in, its clip's tag (0: none), frames so far.
        self.episode = {r: -1 for r in self.rows.values()}
        self.tag = dict.fromkeys(self.rows.values(), 0)
        self.frames = dict.fromkeys(self.rows.values(), 0)
        for r, (episode, tag, frames) in enumerate(order.episodes):
            if r in self.tag:
                self.episode[r], self.tag[r], self.frames[r] = episode, tag, frames
        self.given = dict.fromkeys(self.rows.values(), 0)  # step trigger: the tag last captured for

    def ended(self, i: int) -> None:
        """Env ``i``'s step ended its episode and it is about to be reset within the step."""
        row = self.rows.get(i)
        if row is not None and self.trigger is not None:
            self._episode_step(i, row)

    def stepped(self, i: int, reset_within: bool) -> None:
        """Env ``i`` stepped (``reset_within``: and was reset at the end of its episode)."""
        row = self.rows.get(i)
        if row is None:
            return
        if self.trigger is None:
            self._wanted(i, row)
        elif reset_within:
            self._episode_reset(i, row)
        else:
            self._episode_step(i, row)

    def reset(self, i: int) -> None:
        """Env ``i`` was reset (a reset command, or next-step autoreset)."""
        row = self.rows.get(i)
        if row is None:
            return
        if self.trigger is None:
            self._wanted(i, row)
        else:
            self._episode_reset(i, row)

    def _wanted(self, i: int, row: int) -> None:
        want = self.tape.want[row]
        if not want:
            return
        tag = abs(want)
        if self.given[row] == -tag:
            return  # that clip was cut here: nothing more of it
        if not self._capture(i, row, tag):
            self.given[row] = -tag
            return
        self.given[row] = tag
        if want < 0:
            self._close(row, -tag)

    def _episode_reset(self, i: int, row: int) -> None:
        self.episode[row] += 1
        if self.tag[row] and self.length == float("inf"):
            self._close(row, -self.tag[row])
        if self.trigger(self.episode[row]):  # type: ignore[misc]
            if self.tag[row]:
                self._close(row, -self.tag[row])
            self.tag[row], self.frames[row] = self.episode[row] + 1, 0
        self._episode_step(i, row)

    def _episode_step(self, i: int, row: int) -> None:
        tag = self.tag[row]
        if not tag:
            return
        if not self._capture(i, row, tag):
            self.tag[row] = 0
            return
        self.frames[row] += 1
        if self.frames[row] > self.length:
            self._close(row, -tag)

    def _close(self, row: int, mark: int) -> None:
        if mark < 0 and self.trigger is not None:
            self.tag[row] = 0
        if _wait_for_room(self.tape, row):
            self.tape.commit(row, mark, 0)

    def _capture(self, i: int, row: int, tag: int) -> bool:
        """Write env ``i``'s render frame as clip ``tag``'s next; False (the clip ended, cut) if it
        could not be."""
        tape = self.tape
        if not _wait_for_room(tape, row):
            return False  # no room even for the cut mark: the reader sees the clip stop
        out = tape.record("frame", row, tape.head[row])
        try:
            render_into = native_frame(self.group.native[i])
            if render_into is not None:
                render_into(out)
            else:
                self.group._sync(i)
                frame = self.group.envs[i].render()
                if not isinstance(frame, np.ndarray) or frame.shape != out.shape:
                    raise ValueError(f"render() gave {getattr(frame, 'shape', type(frame))}, not {out.shape}")
                np.copyto(out, frame, casting="unsafe")
        except Exception:
            tape.commit(row, cut(tag), 0)
            return False
        tape.commit(row, tag, 0)
        return True

    def close(self) -> None:
        self.tape.close()


class StepTap:
    """Every step and reset of the envs of a :class:`~shmvec.wire.messages.RecordSteps` order that
    are this worker's: records ``obs<j>`` (the fixed-size observation leaves), ``action``,
    ``reward``, ``terminated``, ``truncated`` and ``seed``, marked ``STEP`` (its observation: the
    next one, the terminal one when the step ended the episode) or ``RESET`` / ``RESET_SEEDED``
    (``| EXPLICIT`` for an asked-for reset once this tap has written records of the env: a rebuilt
    worker's first reset is never one, so the episode a crash tore is dropped, not ended).

    :param order: the order.
    :param first_env: the worker's first env.
    :param n_envs: its number of envs.
    """

    def __init__(self, order: m.RecordSteps, first_env: int, n_envs: int) -> None:
        self.tape = tape = Tape.attach(order.tape)
        self.rows = {
            env - first_env: row for env, row in tape.rows.items() if first_env <= env < first_env + n_envs
        }
        n_obs = sum(1 for name in tape.spec.record_fields() if name.startswith("obs"))
        # Per row, each record array's views over its slots, taken once: a step writes each
        # field with one index (no name lookup, no view made per field per step).
        names = [f"obs{j}" for j in range(n_obs)]
        names += ["action", "reward", "terminated", "truncated", "seed"]
        self.columns = {r: [tape.views[name][r] for name in names] for r in self.rows.values()}
        self.gap = dict.fromkeys(self.rows.values(), False)  # records dropped since the last reset
        self.off = dict.fromkeys(self.rows.values(), False)  # the reader left it full: no more records
        self.wrote = dict.fromkeys(self.rows.values(), False)  # this tap has written records of it
        # Go on from the stamps a worker before this one (restart mode) left.
        self.steps = {r: int(tape.step[r, (tape.head[r] - 1) % tape.depth]) + 1 for r in self.rows.values()}

    def reset(self, i: int, obs: list[Any], seed: int | None, explicit: bool = False) -> None:
        """Env ``i`` was reset to ``obs`` (its fixed-size leaves) with ``seed``; ``explicit``: by
        ``reset()``, not by an autoreset or restart mode."""
        row = self.rows.get(i)
        if row is None or self.off[row]:
            return
        self.gap[row] = False
        mark = RESET if seed is None else RESET_SEEDED
        self._put(row, obs, mark | EXPLICIT if explicit and self.wrote[row] else mark, seed=seed)

    def stepped(
        self, i: int, action: Any, reward: float, terminated: bool, truncated: bool, obs: list[Any]
    ) -> None:
        """Env ``i`` took ``action`` and gave ``obs`` (the terminal observation if it ended)."""
        row = self.rows.get(i)
        if row is None or self.gap[row]:
            return
        self._put(row, obs, STEP, action, reward, terminated, truncated)

    def _put(
        self,
        row: int,
        obs: list[Any],
        mark: int,
        action: Any = None,
        reward: float = 0.0,
        terminated: bool = False,
        truncated: bool = False,
        seed: int | None = None,
    ) -> None:
        tape = self.tape
        if not _wait_for_room(tape, row):
            # The reader is gone or far behind: this env's records stop here (once: no wait per step).
            self.gap[row] = self.off[row] = True
            tape.want[row] = -1
            return
        slot = tape.head[row] % tape.depth
        *leaves, actions, rewards, terms, truncs, seeds = self.columns[row]
        for column, value in zip(leaves, obs):
            column[slot] = value
        if action is not None:
            actions[slot] = action
        rewards[slot] = reward
        terms[slot] = terminated
        truncs[slot] = truncated
        seeds[slot] = 0 if seed is None else seed
        tape.commit(row, mark, self.steps[row])
        self.steps[row] += 1
        self.wrote[row] = True

    def close(self) -> None:
        self.columns = {}  # views of the segment: it is unmapped once none is left
        self.tape.close()


class Taps:
    """The worker's taps (from its last ``Configure(record=...)``), called by its step and reset.

    :param orders: the orders.
    :param group: the worker's env group.
    :param kept: step taps of the worker's previous orders to go on with, by tape segment name.
    """

    def __init__(self, orders: tuple[Any, ...], group: Any, kept: dict[str, StepTap] | None = None) -> None:
        kept = kept or {}
        self.frames = [FrameTap(o, group) for o in orders if isinstance(o, m.RecordFrames)]
        self.steps = [
            kept.get(o.tape.shm_name) or StepTap(o, group.first_env, len(group.envs))
            for o in orders
            if isinstance(o, m.RecordSteps)
        ]

    @classmethod
    def replace(cls, taps: Taps | None, orders: tuple[Any, ...], group: Any) -> Taps | None:
        """The taps of ``orders`` in place of ``taps`` (None: no orders). A dataset's step tap that
        the new orders still hold goes on as it was: what it knows of each env (that it wrote
        records of it, so a ``reset()`` cuts an episode short rather than tearing it) outlives
        another recording starting or stopping. The other taps are closed."""
        wanted = {o.tape.shm_name for o in orders if isinstance(o, m.RecordSteps)}
        kept = {}
        if taps is not None:
            kept = {t.tape.spec.shm_name: t for t in taps.steps if t.tape.spec.shm_name in wanted}
            taps.close(keep=kept.values())
        return cls(orders, group, kept) if orders else None

    def ended(self, i: int) -> None:
        """Before env ``i``'s reset within the step that ended its episode."""
        for tap in self.frames:
            tap.ended(i)

    def stepped(
        self,
        i: int,
        action: Any,
        reward: float,
        terminated: bool,
        truncated: bool,
        obs: list[Any],
        final: list[Any] | None,
    ) -> None:
        """After env ``i``'s step; ``obs``: its fixed-size observation leaves now (the reset's, when
        ``final``, the terminal observation's leaves, says it was reset within the step)."""
        for tap in self.frames:
            tap.stepped(i, final is not None)
        for step_tap in self.steps:
            step_tap.stepped(i, action, reward, terminated, truncated, obs if final is None else final)
            if final is not None:
                step_tap.reset(i, obs, None)

    def reset(self, i: int, obs: list[Any], seed: int | None, explicit: bool = False) -> None:
        """After env ``i``'s reset to ``obs`` with ``seed``; ``explicit``: asked for by ``reset()``."""
        for tap in self.frames:
            tap.reset(i)
        for step_tap in self.steps:
            step_tap.reset(i, obs, seed, explicit)

    def close(self, keep: Collection[StepTap] = ()) -> None:
        """Close every tap but the step taps of ``keep``."""
        for tap in self.frames:
            tap.close()
        for step_tap in self.steps:
            if step_tap not in keep:
                step_tap.close()
