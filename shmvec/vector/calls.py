"""Env calls of :class:`shmvec.ShmVectorEnv` (``call``, ``call_async`` / ``call_wait``, ``get_attr``,
``set_attr``, ``render``), as ``gymnasium.vector.AsyncVectorEnv`` answers them: one value per env in a
tuple, ``PendingCallError`` (Gymnasium's ``AlreadyPendingCallError``) while a step, reset or call is
pending, ``NoPendingCallError`` for a ``call_wait`` with nothing sent. The calls themselves are the
engine's (:class:`shmvec.engine.calls.EnvCalls`).
"""

from __future__ import annotations

from typing import Any

from shmvec.engine.core import Engine
from shmvec.errors import NoPendingCallError, PendingCallError
from shmvec.wire import messages as m


class CallMethods:
    """The env-call methods of :class:`shmvec.ShmVectorEnv` (a mixin, as
    :class:`shmvec.vector.pool.PoolMethods`)."""

    num_envs: int

    @property
    def _eng(self) -> Engine:
        raise NotImplementedError

    def _refuse_if_pending(self, call: str) -> None:
        """:raises PendingCallError: while a step, reset or call is pending (the face's one check
        before it sends anything)."""
        pending = self._eng.pending_call()
        if pending is not None:
            raise PendingCallError.of(call, pending)

    def call(self, name: str, /, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``env.get_wrapper_attr(name)(*args, **kwargs)`` of every env, or the attribute's value when
        it is not callable (as SyncVectorEnv). ``name`` is positional-only, so a method's own ``name``
        keyword reaches the env. :meth:`call_async` then :meth:`call_wait`.

        :raises PendingCallError: while a step, reset or call is pending (Gymnasium's
            ``AlreadyPendingCallError``, as AsyncVectorEnv raises it).
        """
        self.call_async(name, *args, **kwargs)
        return self.call_wait()

    def call_async(self, name: str, /, *args: Any, **kwargs: Any) -> None:
        """Send :meth:`call`'s call to every env and return at once (``AsyncVectorEnv.call_async``);
        :meth:`call_wait` collects the results.

        :raises PendingCallError: while a step, reset or call is pending.
        """
        self._refuse_if_pending("call_async")
        self._eng.post_call(
            lambda local: m.EnvMethod(local, name, args, kwargs, value_if_attribute=True),
            range(self.num_envs),
        )

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """The results of the call sent by :meth:`call_async`, one per env.

        :param timeout: as for :meth:`step_wait`: past it, ``multiprocessing.TimeoutError``, and the
            call stays pending (AsyncVectorEnv forgets it).
        :raises NoPendingCallError: if no call is pending (Gymnasium's ``NoAsyncCallError``).
        """
        engine = self._eng
        engine.check_open()
        if engine.pending_call() != "call":
            raise NoPendingCallError.of("call_wait")
        return tuple(engine.wait_call(timeout))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """``call(name)``: the attribute of every env (called if it is a method, as SyncVectorEnv)."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """``env.set_wrapper_attr(name, value)`` on every env: one value for all, or a list or tuple
        of one value per env.

        :raises ValueError: for a list or tuple whose length is not ``num_envs``.
        :raises PendingCallError: while a step, reset or call is pending.
        """
        self._refuse_if_pending("set_attr")
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        values = list(values)
        self._eng.call(lambda local: m.SetWrapperAttr(local, name, values), range(self.num_envs))

    def render(self) -> tuple[Any, ...]:
        """``env.render()`` of every env."""
        self._refuse_if_pending("call_async")  # AsyncVectorEnv renders with call("render")
        return tuple(self._eng.call(m.Render, range(self.num_envs)))


__all__ = ["CallMethods"]
