"""Start methods and the ``__main__`` guard: what goes wrong without it, and the error you get.

    python examples/start_method.py            # guarded: works with every start method
    python examples/start_method.py --no-guard # shows the error a missing guard produces

With ``spawn`` and ``forkserver`` (ShmVecEnv's default, like SubprocVecEnv's) every worker starts
a fresh interpreter that re-imports your main script. Code at the top level of the script runs
again in each worker; if that code creates a VecEnv, the worker tries to start workers of its own
and Python refuses. ShmVecEnv notices the worker died before it was ready and says why, instead
of hanging. ``fork`` copies the running process and needs no guard (but is unsafe with threads,
which is why SB3 does not default to it).
"""

import argparse
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

from shmvec import ShmVecEnv, WorkerCrashedError
from shmvec.synthetic import SyntheticImageEnv

UNGUARDED = textwrap.dedent(
    """
    from shmvec import ShmVecEnv
    from shmvec.synthetic import SyntheticImageEnv

    venv = ShmVecEnv([SyntheticImageEnv] * 2, start_method="spawn")  # no __main__ guard!
    venv.close()
    """
)


def guarded() -> None:
    for method in ("fork", "forkserver", "spawn"):
        with ShmVecEnv([SyntheticImageEnv] * 4, start_method=method) as venv:
            venv.reset()
            venv.step(np.zeros(4, np.int64))
        print(f"{method}: ok ({venv.n_workers} workers)")


def unguarded() -> None:
    # Run the unguarded script (a file: spawn re-imports files, not `python -c` code) in a child
    # interpreter so this example itself keeps working.
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(UNGUARDED)
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    print(f"exit status {proc.returncode}; the error a user sees:\n{last}")
    assert WorkerCrashedError.__name__ in last


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--no-guard",
        action="store_true",
        help="run a script without the __main__ guard in a child interpreter and show the error",
    )
    args = parser.parse_args()
    unguarded() if args.no_guard else guarded()


if __name__ == "__main__":
    main()
