"""Video recording from the render frames workers write into a tape (:mod:`shmvec.memory.tape`,
:mod:`shmvec.worker.taps`), encoded by a thread of the main process, off the step path.

:class:`VideoRecording` is what both faces' wrappers drive (:mod:`shmvec.recorder.sb3`,
:mod:`shmvec.recorder.gymnasium`). With a step trigger it decides, before each step or reset is
posted, whether that command's frame is captured, exactly as SB3's ``VecVideoRecorder`` decides it
after the fact (so its ``record_video_trigger`` is called with the same step numbers, once each), and
says so in the tape's ``want`` words; with an episode trigger the workers decide at each reset, as
Gymnasium's ``RecordVideo`` does inside an env. :class:`Encoder` reads the tape and writes each clip
(:mod:`shmvec.recorder.clip`).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import numpy as np

from shmvec.engine.core import Engine
from shmvec.memory.tape import Tape, clip_of
from shmvec.recorder.clip import ClipFile, Encoding, tile
from shmvec.wire import messages as m

#: The most shared memory (bytes) a video tape takes; fewer frames than a clip are then in flight.
TAPE_BYTES = 64 << 20
_POLL_S = 0.01


class RecordingWarning(UserWarning):
    """A recording stopped or a clip was cut short; training goes on."""


class Encoder:
    """A thread that encodes the clips of a video tape.

    :param tape: the tape (its rows: the recorded envs).
    :param tiled: step trigger: every row is in every clip, tiled as SB3's ``VecEnv.render()``
        tiles envs; else (episode trigger) each row has clips of its own.
    :param name_of: ``(row, tag) -> path without .mp4`` of a clip.
    :param fps: frames per second.
    :param encoding: encoder settings.
    """

    def __init__(
        self, tape: Tape, tiled: bool, name_of: Callable[[int, int], str], fps: float, encoding: Encoding
    ) -> None:
        self.tape, self.tiled, self.name_of, self.fps, self.encoding = tape, tiled, name_of, fps, encoding
        self.open: dict[tuple[int, int], ClipFile] = {}  # (row or -1 when tiled, tag) -> clip
        self.dead: set[tuple[int, int]] = set()  # clips cut: their remaining records are dropped
        self.written: list[str] = []  # complete clips
        self.incomplete: list[str] = []  # clips cut short, closed as valid videos
        self.error: BaseException | None = None
        # Tiled clips the main process started and this thread finished: it polls the tape while
        # one is to come or open, and sleeps until woken otherwise.
        self.started = self.finished = 0
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="shmvec-video", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """A clip starts: its frames are coming (poll the tape until it ends)."""
        self.started += 1
        self._wake.set()

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                self._drain()
            except Exception as exc:  # e.g. ENOSPC: the clips go, the recording stops
                self.error = exc
                for clip in self.open.values():
                    clip.abandon()
                self.open.clear()
                self.finished = self.started
                self._discard()
            if stopping:
                return
            waiting = self.open or self.finished < self.started or not self.tiled
            self._wake.wait(_POLL_S if waiting else None)
            self._wake.clear()

    def _discard(self) -> None:
        tape = self.tape
        for row in range(len(tape.spec.env_ids)):
            tape.tail[row] = tape.head[row]

    def _drain(self) -> None:
        if self.error is not None:
            self._discard()
        elif self.tiled:
            self._drain_tiled()
        else:
            for row in range(len(self.tape.spec.env_ids)):
                self._drain_row(row)

    def _drain_row(self, row: int) -> None:
        tape = self.tape
        while tape.tail[row] < tape.head[row]:
            index = tape.tail[row]
            tag, ends, cut = clip_of(int(tape.mark[row, index % tape.depth]))
            key = (row, tag)
            if key not in self.dead:
                if ends:
                    self._finish(key, not cut)
                else:
                    self._clip(key).add(tape.record("frame", row, index))
            tape.tail[row] = index + 1

    def _drain_tiled(self) -> None:
        tape = self.tape
        rows = range(len(tape.spec.env_ids))
        while all(tape.tail[r] < tape.head[r] for r in rows):
            index = [tape.tail[r] for r in rows]
            marks = [clip_of(int(tape.mark[r, index[r] % tape.depth])) for r in rows]
            tag = min(mark[0] for mark in marks)
            key = (-1, tag)
            same = [r for r in rows if marks[r][0] == tag]
            if key in self.dead:
                pass
            elif len(same) < len(rows) or any(mark[2] for mark in marks):
                self._finish(key, False)  # a row's clip was cut: the tiled clip is cut there
            elif marks[0][1]:
                self._finish(key, all(mark[1] for mark in marks))
            else:
                frames = [tape.record("frame", r, index[r]) for r in rows]
                self._clip(key).add(tile(frames))
            for r in same:
                tape.tail[r] = index[r] + 1

    def _clip(self, key: tuple[int, int]) -> ClipFile:
        clip = self.open.get(key)
        if clip is None:
            for other in [k for k in self.open if k[0] == key[0]]:
                self._finish(other, True)  # a new clip of the same envs ends the one before (SB3's way)
            clip = self.open[key] = ClipFile(self.name_of(max(key[0], 0), key[1]), self.fps, self.encoding)
        return clip

    def _finish(self, key: tuple[int, int], complete: bool) -> None:
        clip = self.open.pop(key, None)
        if key[0] == -1:
            self.finished += 1
        if not complete:
            self.dead.add(key)
        if clip is not None:
            path = clip.finish(complete)
            if path is not None:
                (self.written if complete else self.incomplete).append(path)

    def close(self) -> None:
        """Encode what the tape holds, close the clips still open as cut short, stop the thread."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
        for key in list(self.open):
            try:
                self._finish(key, False)
            except Exception as exc:
                self.error = self.error or exc
                self.open.pop(key, None)


class VideoRecording:
    """A video recording of some envs of a shmvec engine (what the faces' wrappers drive).

    :param engine: the face's engine.
    :param folder: where the clips go (made if missing).
    :param env_ids: the envs recorded (global indices).
    :param video_length: with a step trigger, a clip is its first frame and this many more (as
        SB3's ``VecVideoRecorder``); with an episode trigger, frames after the first at most (0:
        whole episodes, as Gymnasium's ``RecordVideo``).
    :param step_trigger: ``trigger(step_id) -> bool``, SB3's ``record_video_trigger``.
    :param episode_trigger: ``trigger(episode_id) -> bool`` per env (called in the worker).
    :param step_name: ``(prefix, step_id, video_length) -> file name`` of a step clip.
    :param name_prefix: start of every file name.
    :param fps: frames per second (None: the env's ``metadata["render_fps"]``, else 30).
    :param encoding: encoder settings (:class:`~shmvec.recorder.clip.Encoding`).
    """

    def __init__(
        self,
        engine: Engine,
        folder: str,
        env_ids: Sequence[int],
        video_length: int,
        step_trigger: Callable[[int], bool] | None,
        episode_trigger: Callable[[int], bool] | None,
        step_name: Callable[[str, int, int], str],
        name_prefix: str = "rl-video",
        fps: float | None = None,
        encoding: Encoding | None = None,
    ) -> None:
        import os

        if (step_trigger is None) == (episode_trigger is None):
            raise ValueError("give one trigger: a step trigger or an episode trigger")
        try:  # here, not at the first clip: the import would hold the GIL in the middle of training
            import av  # noqa: F401
        except ImportError as exc:
            raise ModuleNotFoundError(
                f"video recording needs PyAV: pip install 'shmvec[record]' ({exc})"
            ) from exc
        if engine.options.backend != "local":
            raise NotImplementedError(
                "recording reads the workers' frames in shared memory: backend='local' only"
            )
        engine.check_open()
        self.engine, self.env_ids = engine, [int(e) for e in env_ids]
        if not self.env_ids or not all(0 <= e < engine.num_envs for e in self.env_ids):
            raise ValueError(f"env_ids must name envs of 0..{engine.num_envs - 1}, got {list(env_ids)}")
        modes = engine.call(lambda local: m.GetAttr(local, "render_mode"), self.env_ids)
        if any(mode != "rgb_array" for mode in modes):
            raise ValueError(
                "a video needs envs made with render_mode='rgb_array' (these have "
                f"{sorted(set(map(str, modes)))}): gym.make(env_id, render_mode='rgb_array'), or "
                "make_atari_env(..., env_kwargs={'render_mode': 'rgb_array'})"
            )
        if fps is None:
            fps = engine.call(lambda local: m.GetAttr(local, "metadata"), self.env_ids[:1])[0].get(
                "render_fps", 30
            )
        self.folder = os.path.abspath(folder)
        os.makedirs(self.folder, exist_ok=True)
        self.video_length, self.name_prefix, self.fps = video_length, name_prefix, float(fps or 30)
        self.step_trigger, self.episode_trigger, self.step_name = step_trigger, episode_trigger, step_name
        self.encoding = encoding or Encoding()
        self.tape: Tape | None = None
        self.order: m.RecordFrames | None = None
        self.encoder: Encoder | None = None
        self.names: dict[int, str] = {}  # step clips: tag -> file name
        self.step_id = 0
        self.recording = False  # a step clip is open
        self.frames = 0  # frames of the open step clip
        self.tag = 0  # the open step clip's tag (tags count clips from 1)
        self.stopped = False  # an error stopped the recording
        self._warned = False
        self._reset_clip = False  # the trigger started a clip at the reset being posted
        self._start(None, False)

    # ------------------------------------------------------------------ the tape

    def _start(self, frames: list[Any] | None, reset: bool) -> bool:
        """Lay out the tape and tell the workers, from render frames (None: ask the envs for them now,
        which fails before their first reset when they enforce it: then it is tried after it;
        ``reset``: the envs were just reset, and their first frames are ``frames``)."""
        if self.tape is not None:
            return True
        if frames is None:
            try:
                frames = self.engine.call(m.Render, self.env_ids)
            except Exception:
                return False
        if not all(_is_frame(f) for f in frames) or len({f.shape for f in frames}) != 1:
            return False
        shape = frames[0].shape
        depth = max(8, min(self.video_length + 2, TAPE_BYTES // (frames[0].nbytes * len(self.env_ids))))
        self.tape = tape = Tape.create([("frame", shape, np.dtype(np.uint8))], self.env_ids, depth)
        self.encoder = Encoder(tape, self.step_trigger is not None, self._name_of, self.fps, self.encoding)
        if self.recording:  # a clip opened before its first frame could be rendered (at the first reset)
            self.encoder.wake()
        trigger = None if self.episode_trigger is None else cloudpickle.dumps(self.episode_trigger)
        episodes: list[tuple[int, int, int]] = []
        if trigger is not None and reset:
            # The envs were reset before the tape existed: their episode 0 is under way.
            for row, frame in enumerate(frames):
                tag = 1 if self.episode_trigger(0) else 0  # type: ignore[misc]
                if tag:
                    self._put(row, frame, tag)
                episodes.append((0, tag, 1 if tag else 0))
        self.order = m.RecordFrames(tape.spec, trigger, self.video_length, tuple(episodes))
        self.engine.record((*self.engine.recording, self.order))
        return True

    def _put(self, row: int, frame: np.ndarray, mark: int) -> None:
        """Write a frame the main process has (before any worker writes this tape)."""
        assert self.tape is not None
        self.tape.record("frame", row, self.tape.head[row])[...] = frame
        self.tape.commit(row, mark, 0)

    def _name_of(self, row: int, tag: int) -> str:
        import os

        if self.step_trigger is not None:
            return os.path.join(self.folder, self.names[tag])
        env = "" if len(self.env_ids) == 1 else f"-env-{self.env_ids[row]}"
        return os.path.join(self.folder, f"{self.name_prefix}{env}-episode-{tag - 1}")

    def _want(self, value: int) -> None:
        tape = self.tape
        if tape is not None:
            for row in range(len(self.env_ids)):
                tape.want[row] = value

    # ------------------------------------------------------------------ what the wrappers call

    def before_reset(self) -> None:
        """Before the face's reset is posted: SB3's trigger at a reset (a clip starts with its frame)."""
        if self.step_trigger is None or self.stopped:
            return
        self._reset_clip = bool(self.step_trigger(self.step_id))
        if self._reset_clip:
            self._new_clip(self.step_id)
            self._want(self.tag)
        else:
            self._want(0)

    def after_reset(self) -> None:
        """After the face's reset: a tape that could not be laid out before is laid out now."""
        if self.tape is None and not self.stopped:
            try:
                frames = self.engine.call(m.Render, self.env_ids)
            except Exception:
                frames = None
            if self._start(frames, True) and self._reset_clip:
                for row, frame in enumerate(frames or ()):
                    self._put(row, frame, self.tag)  # the reset's frame, taken before the tape was there
        self._check()

    def before_step(self) -> None:
        """Before the face's step is posted: whether its frame is captured (SB3's decision)."""
        if self.step_trigger is None or self.stopped:
            return
        if self.recording:
            self.frames += 1
            last = self.frames > self.video_length
            self._want(-self.tag if last else self.tag)
            self.recording = not last
        elif self.step_trigger(self.step_id + 1):
            self._new_clip(self.step_id + 1)  # SB3 checks the clip's length from its next frame on
            self._want(self.tag)
        else:
            self._want(0)

    def after_step(self) -> None:
        """After the face's step."""
        self.step_id += 1
        self._check()

    def _new_clip(self, step_id: int) -> None:
        self.tag += 1
        self.names[self.tag] = self.step_name(self.name_prefix, step_id, self.video_length)
        self.recording, self.frames = True, 1
        if self.encoder is not None:
            self.encoder.wake()  # it polls the tape while a clip is open (frames in batches, not one by one)

    def _check(self) -> None:
        encoder = self.encoder
        if encoder is not None and encoder.error is not None and not self.stopped:
            self._stop(f"writing a clip failed ({encoder.error!r}); the recording stopped, training goes on")

    def _stop(self, why: str) -> None:
        self.stopped, self.recording = True, False
        self._want(0)
        self._unrecord()
        warnings.warn(why, RecordingWarning, stacklevel=3)

    def _unrecord(self) -> None:
        """The workers stop writing this tape (when the engine still runs them)."""
        engine = self.engine
        if not engine.closed and self.order in engine.recording:
            try:
                engine.record(tuple(o for o in engine.recording if o is not self.order))
            except Exception:  # the VecEnv failed meanwhile: its workers write nothing more anyway
                pass

    @property
    def written(self) -> list[str]:
        """The complete clips so far (paths)."""
        return [] if self.encoder is None else list(self.encoder.written)

    @property
    def incomplete(self) -> list[str]:
        """The clips cut short (paths of valid videos named ``*.incomplete.mp4``)."""
        return [] if self.encoder is None else list(self.encoder.incomplete)

    def close(self) -> None:
        """Finish: encode what is in the tape, close a clip still open as cut short, free the tape."""
        if self.encoder is not None:
            self._want(0)
            self.encoder.close()
            if self.encoder.incomplete and not self._warned:
                self._warned = True
                warnings.warn(
                    "clips cut short (the VecEnv closed or a worker failed mid-clip): "
                    f"{self.encoder.incomplete}",
                    RecordingWarning,
                    stacklevel=3,
                )
        if self.tape is not None:
            self._unrecord()
            self.tape.close()
            self.tape = None


def engine_of(venv: Any, face: str) -> Any:
    """The shmvec engine under ``venv`` (through its wrappers).

    :raises TypeError: when ``venv`` is not over a shmvec VecEnv.
    """
    base = getattr(venv, "unwrapped", venv)
    engine = getattr(base, "_engine", None)
    if engine is None or type(base).__module__.split(".")[0] != "shmvec":
        raise TypeError(
            f"shmvec.recording records a {face} (at any depth of wrappers), not a {type(base).__name__}: "
            "use the library's own recorder for other vector envs"
        )
    engine.check_open()
    return engine


def _is_frame(frame: Any) -> bool:
    return (
        isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8
    )
