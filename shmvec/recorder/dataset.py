"""Dataset recording: every step of chosen envs, written into a Minari dataset by a side process
(:mod:`shmvec.recorder.episodes`) from the records workers write into a tape
(:class:`~shmvec.worker.taps.StepTap`). The main process only starts and finishes it: nothing of a
step goes through it or through the pipes."""

from __future__ import annotations

import multiprocessing
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from shmvec.errors import UnsupportedSpaceError
from shmvec.memory.layout import ARRAY_SPACES, leaves
from shmvec.memory.tape import Tape
from shmvec.recorder.episodes import _DESCRIPTIVE, Settings, write
from shmvec.recorder.video import RecordingWarning, engine_of
from shmvec.wire import messages as m

#: Records per env the tape holds by default (the side process's lead on the writers).
DEPTH = 256
#: How long (s) finishing waits for the side process to write what is left.
FINISH_S = 600.0
#: How long (s) starting waits for the side process (a fresh interpreter importing minari, h5py)
#: to have created the dataset's storage.
START_S = 120.0


def check_spaces(observation_space: spaces.Space, action_space: spaces.Space, jpeg: bool) -> None:
    """:raises UnsupportedSpaceError: for spaces a dataset recording cannot hold (said why)."""
    for leaf in leaves(observation_space):
        if not leaf.fixed:
            raise UnsupportedSpaceError(
                "a dataset recording holds fixed-size observation leaves only; "
                f"{leaf.name} has no fixed size (Text, Sequence, Graph...: no place in the tape)"
            )
    if not isinstance(action_space, ARRAY_SPACES):
        raise UnsupportedSpaceError(
            "a dataset recording holds Box, Discrete, MultiDiscrete or MultiBinary actions, "
            f"not {action_space}"
        )
    if jpeg:
        from minari.dataset.minari_storage import is_image_space

        for leaf in leaves(observation_space):
            sub = observation_space
            for key in leaf.path:
                sub = sub[key]  # type: ignore[index]
            if is_image_space(sub) and len(leaf.shape) == 3 and leaf.shape[2] not in (1, 3):
                raise UnsupportedSpaceError(
                    f"Minari's JPEG encodes images of 1 or 3 channels; {leaf.name} has "
                    f"shape {leaf.shape} (a frame stack?): record it with codec=None (lossless)"
                )


class DatasetRecording:
    """A dataset recording of some envs of a shmvec vector env (either face), made by
    :func:`record_dataset`; :meth:`finish` ends it and returns the dataset's path.

    :param env: a :class:`~shmvec.ShmVecEnv` or :class:`~shmvec.ShmVectorEnv`, or wrappers over one.
    :param dataset_id: Minari's id (``"namespace/name-v0"``); it must not exist yet.
    :param env_ids: the envs recorded (default: every env).
    :param codec: None (default: raw arrays, lossless) or ``"jpeg"`` (Minari's JPEG of image
        observations: smaller, lossy); what the dataset gives back of the observations is measured and
        stated in its metadata (``shmvec_fidelity``).
    :param data_format: Minari's storage, ``"hdf5"`` (default) or ``"arrow"``.
    :param depth: records per env the tape holds (default 256): how far the writer may lag.
    :param metadata: Minari's descriptive metadata (``author``, ``author_email``, ``algorithm_name``,
        ``code_permalink``, ``description``, ``eval_env``, ``ref_min_score``, ``ref_max_score``,
        ``requirements``), as ``DataCollector.create_dataset`` takes them.
    :raises UnsupportedSpaceError: for observation or action spaces it cannot hold.
    :raises RuntimeError: when the side process could not create the dataset's storage (Minari
        refused it; the message says why); nothing is recorded and nothing is left behind.
    """

    def __init__(
        self,
        env: Any,
        dataset_id: str,
        env_ids: Sequence[int] | None = None,
        codec: str | None = None,
        data_format: str = "hdf5",
        depth: int = DEPTH,
        **metadata: Any,
    ) -> None:
        from minari.storage import get_dataset_path

        engine = engine_of(env, "shmvec vector env")
        if engine.options.backend != "local":
            raise NotImplementedError(
                "recording reads the workers' steps in shared memory: backend='local' only"
            )
        if codec not in (None, "jpeg"):
            raise ValueError(
                f"codec must be None (raw arrays, lossless) or 'jpeg' (Minari's JPEG), not {codec!r}"
            )
        unknown = set(metadata) - set(_DESCRIPTIVE)
        if unknown:
            raise TypeError(f"unknown metadata {sorted(unknown)}; these are known: {list(_DESCRIPTIVE)}")
        if get_dataset_path(dataset_id).exists():
            raise ValueError(
                f"a Minari dataset {dataset_id!r} exists already ({get_dataset_path(dataset_id)})"
            )
        space = engine.observation_space
        single_obs = getattr(env.unwrapped, "single_observation_space", space)
        single_act = getattr(env.unwrapped, "single_action_space", engine.action_space)
        check_spaces(single_obs, single_act, codec == "jpeg")
        self.engine = engine
        self.env_ids = list(range(engine.num_envs)) if env_ids is None else [int(e) for e in env_ids]
        fixed = leaves(single_obs)
        action = leaves(single_act)[0]
        records = [(f"obs{j}", leaf.shape, leaf.dtype) for j, leaf in enumerate(fixed)]
        records += [
            ("action", action.shape, action.dtype),
            ("reward", (), np.dtype(np.float64)),
            ("terminated", (), np.dtype(bool)),
            ("truncated", (), np.dtype(bool)),
            ("seed", (), np.dtype(np.int64)),
        ]
        spec = engine.call(lambda local: m.GetAttr(local, "spec"), self.env_ids[:1])[0]
        settings = Settings(dataset_id, single_obs, single_act, spec, codec == "jpeg", data_format, metadata)
        self.final = get_dataset_path(dataset_id)
        # The side process builds the dataset here; on failure (it may die: HDF5 on a full disk)
        # this process removes it.
        self.tmp = tempfile.mkdtemp(dir=get_dataset_path(), prefix=".shmvec-")
        self.tape = Tape.create(records, self.env_ids, depth)
        context = multiprocessing.get_context("spawn")  # minari and h5py in a process of their own
        self._conn, child = context.Pipe()
        self.process = context.Process(
            target=write, args=(child, self.tape.spec, settings, self.tmp), name="shmvec-dataset", daemon=True
        )
        try:
            self.process.start()
            child.close()
            # Minari refusing the spaces or the folder is said here, before any step is recorded;
            # and the side process's start-up (its imports) is over before the first step.
            try:
                ready = (
                    tuple(self._conn.recv()) if self._conn.poll(START_S) else ("failed", "no reply in time")
                )
            except (EOFError, OSError):
                ready = ("failed", f"the side process died (exit code {self.process.exitcode})")
            if ready[0] != "ready":
                raise RuntimeError(f"the dataset recording could not start: {ready[1]}")
            self.order = m.RecordSteps(self.tape.spec)
            engine.record((*engine.recording, self.order))
        except BaseException:
            self._stop_process()
            self.tape.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        self.path: str | None = None
        self.stats: dict[str, int] = {}
        self.finished = False

    def finish(self) -> str | None:
        """Stop recording, have the side process write what is left and move the dataset into
        Minari's datasets folder; its path (what ``minari.load_dataset(dataset_id)`` reads), or None
        when writing it failed (a :class:`RecordingWarning` says why; nothing is left under the id)."""
        if self.finished:
            return self.path
        self.finished = True
        engine = self.engine
        if not engine.closed:
            try:
                engine.record(tuple(o for o in engine.recording if o is not self.order))
            except Exception:  # the VecEnv failed meanwhile: its workers write nothing more anyway
                pass
        reply: tuple[Any, ...]
        try:
            self._conn.send("finish")
            reply = tuple(self._conn.recv()) if self._conn.poll(FINISH_S) else ("failed", "no reply in time")
        except (EOFError, OSError):
            reply = ("failed", f"the side process died (exit code {self.process.exitcode})")
        self._stop_process()
        self.tape.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        if reply[0] == "done":
            self.path, self.stats = reply[1], reply[-1]
        else:
            shutil.rmtree(self.final, ignore_errors=True)  # it did not exist before: a partial move
            warnings.warn(f"the dataset was not written: {reply[1]}", RecordingWarning, stacklevel=2)
        return self.path

    close = finish

    def _stop_process(self) -> None:
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.process.close()  # its sentinel's file descriptor
        self._conn.close()

    def __enter__(self) -> DatasetRecording:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.finish()


def record_dataset(env: Any, dataset_id: str, **options: Any) -> DatasetRecording:
    """Record every step of ``env``'s envs into a Minari dataset, written by a side process, until
    ``finish()`` (or the ``with`` block's end); ``options`` as :class:`DatasetRecording` takes them."""
    return DatasetRecording(env, dataset_id, **options)
