"""What every face shows of its engine: the workers, their restarts, the native step paths.

One mixin, so that :class:`shmvec.ShmVecEnv`, :class:`shmvec.ShmVectorEnv` and the adapters for other
libraries (:mod:`shmvec.tianshou`) answer these questions the same way. Each face supplies ``_eng``,
its engine, raising its own error once closed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shmvec.engine.core import Engine
    from shmvec.native import NativeStatus


class EngineHandle:
    """The engine's workers and step paths as properties of a face (see the module docstring)."""

    @property
    def _eng(self) -> Engine:  # each face's own: which error a closed face raises is its own
        raise NotImplementedError

    @property
    def n_workers(self) -> int:
        """The number of worker processes (the one chosen, for ``n_workers="auto"``)."""
        return self._eng.n_workers

    @property
    def processes(self) -> list[Any]:
        """The worker processes (``multiprocessing.Process``), in worker order (empty with Ray)."""
        return self._eng.transport.processes

    @property
    def actors(self) -> list[Any]:
        """``backend="ray"``: the Ray actor handles, one per worker, in worker order (else empty)."""
        return list(getattr(self._eng.transport, "actors", []))

    @property
    def n_restarts(self) -> int:
        """Worker restarts so far (restart mode)."""
        return self._eng.n_restarts

    @property
    def native_steps(self) -> list[NativeStatus]:
        """Per env, in env order: whether its worker steps it natively (``path``, e.g.
        ``"sb3-atari"``) or through its wrappers (``path`` None, ``reason`` says why). See
        :mod:`shmvec.native` and the ``native_step`` option."""
        return list(self._eng.native_steps)
