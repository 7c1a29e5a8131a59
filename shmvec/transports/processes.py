"""The worker processes of the local transport: started from their factories, killed, and their
ends told apart (signal, exit code, the faulthandler's traceback) for the errors that name them.

:class:`Processes` keeps what a restart needs in the main process (the factories, pickled once when
the start method needs them) and what must be released in
:class:`~shmvec.transports.resources.Resources`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from shmvec.transports.base import Fault, pickle_factories
from shmvec.transports.failures import crash_error, timeout_error
from shmvec.transports.resources import Resources
from shmvec.worker.loop import worker_main
from shmvec.worker.process import environ, thread_env


class Processes:
    """Starts and ends the worker processes of one local transport.

    :param ctx: the multiprocessing context.
    :param start_method: its name (for error hints and whether factories are pickled).
    :param worker_envs: the env indices of each worker.
    :param env_fns: all env factories.
    :param worker_threads: BLAS/OpenMP threads per worker (None: the libraries' defaults).
    :param isolate_rng: give each env its own process-global RNG state in its worker.
    :param worker_cpus: the CPU of each worker (None: the OS places them).
    """

    def __init__(
        self,
        ctx: Any,
        start_method: str,
        worker_envs: list[range],
        env_fns: list[Callable[[], Any]],
        worker_threads: int | None,
        isolate_rng: bool,
        worker_cpus: Sequence[int] | None,
    ) -> None:
        self.ctx, self.start_method, self.worker_envs = ctx, start_method, worker_envs
        self.isolate_rng, self.worker_cpus, self.worker_threads = isolate_rng, worker_cpus, worker_threads
        # Kept in the main process: a replaced worker is rebuilt from them.
        self.worker_fns: list[bytes | list[Callable[[], Any]]] = []
        needed_by, way_out = f"the '{start_method}' start method", "use start_method='fork'"
        for group in worker_envs:
            group_fns = [env_fns[i] for i in group]
            pickled = start_method != "fork"
            self.worker_fns.append(
                pickle_factories(group_fns, group.start, needed_by, way_out) if pickled else group_fns
            )

    def launch(self, w: int, res: Resources) -> None:
        """Start worker ``w`` (new, or in place of a dead one), its pipe and fault log kept in ``res``."""
        fault_log = tempfile.mkstemp(prefix=f"shmvec-worker-{w}-", suffix=".fault")
        if w < len(res.fault_logs):
            res.close_fault_log(w)
            res.fault_logs[w] = fault_log
        else:
            res.fault_logs.append(fault_log)
        remote, work_remote = self.ctx.Pipe()
        # The pipe is created right before its own worker so no other worker inherits the
        # child end: a dead worker then shows up as EOF instead of a silent hang.
        cpu = None if self.worker_cpus is None else self.worker_cpus[w]
        process = self.ctx.Process(
            target=worker_main,
            args=(
                w,
                work_remote,
                res.wake,
                self.worker_fns[w],
                self.worker_envs[w].start,
                self.worker_threads,
                fault_log[1],
                self.isolate_rng,
                cpu,
            ),
            daemon=True,
            name=f"shmvec-worker-{w}",
        )
        with environ(thread_env(self.worker_threads)):
            process.start()
        work_remote.close()
        if w < len(res.processes):
            res.processes[w], res.remotes[w] = process, remote
        else:
            res.processes.append(process)
            res.remotes.append(remote)

    @staticmethod
    def kill(w: int, res: Resources) -> None:
        """SIGKILL worker ``w`` and reap it (a hung or broken env gets no chance to clean up: its envs
        are rebuilt anyway, and the shared memory belongs to the main process)."""
        process = res.processes[w]
        if process.is_alive():
            process.kill()
        process.join(5.0)

    def lost(self, w: int, command: str, res: Resources) -> Fault:
        """The fault of dead worker ``w`` (waits up to 1 s for its exit code)."""
        process = res.processes[w]
        process.join(1.0)
        text = res.read_fault_log(w)
        error = crash_error(
            w, process.pid, self.worker_envs[w], process.exitcode, command, text, self.start_method
        )
        return Fault(w, error.args[0], error)

    def hung(self, w: int, command: str, timeout: float, res: Resources, verb: str = "answer") -> Fault:
        """The fault of worker ``w`` that did not answer (or take) ``command`` within ``timeout`` s."""
        pid = res.processes[w].pid
        error = timeout_error(w, pid, self.worker_envs[w], command, timeout, "it was killed", verb)
        return Fault(w, error.args[0], error)
