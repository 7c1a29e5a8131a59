"""PPO on an Atari game with its envs stepped by Ray actors, on a Ray cluster or on this machine.

    ray start --head --port=6379                 # on the head machine
    ray start --address=HEAD_IP:6379             # on every other machine
    python examples/ray_cluster_ppo.py --address auto --n-envs 64 --n-workers 16

Each worker (a group of ``n_envs / n_workers`` envs) is a Ray actor, spread over the nodes with a
CPU of its own (``--num-cpus`` changes how much it reserves); observations come back encoded
by the lossless ``delta`` codec (about 100 bytes per Atari frame instead of 100 KB), rewards, flags
and infos with them in the same Ray call. The policy and the PPO update stay in this process. Without
``--address`` a local Ray is started, listening on 127.0.0.1 only, and shut down at the end, so this
also runs on one machine.
SB3's ``make_atari_env`` factories import SB3 (and torch) in each actor: a few seconds per actor.
Actors never import this script; each imports the packages that registered this process's envs
(``ale_py`` here, imported and registered below) before it makes its envs.
"""

import argparse

import ale_py
import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack

from shmvec import ShmVecEnv
from shmvec.errors import install_hint

try:
    import ray
except ModuleNotFoundError:
    raise SystemExit(f"this example needs Ray: {install_hint('ray')}") from None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--address", default=None, help="Ray cluster address ('auto': the running one)")
    parser.add_argument("--env", default="PongNoFrameskip-v4", help="an Atari id that does not skip frames")
    parser.add_argument("--n-envs", type=int, default=8, help="parallel envs")
    parser.add_argument("--n-workers", type=int, default=2, help="Ray actors (groups of envs)")
    parser.add_argument("--num-cpus", type=float, default=1.0, help="CPUs reserved per actor")
    parser.add_argument("--steps", type=int, default=100_000, help="total env steps")
    parser.add_argument("--seed", type=int, default=0, help="seed of the envs and the algorithm")
    args = parser.parse_args()

    if args.address is not None:
        ray.init(address=args.address)  # else ShmVecEnv starts a local Ray and shuts it down on close
    ray_options = {"num_cpus": args.num_cpus}
    gym.register_envs(ale_py)
    venv = make_atari_env(
        args.env,
        n_envs=args.n_envs,
        seed=args.seed,
        vec_env_cls=ShmVecEnv,
        vec_env_kwargs={"backend": "ray", "n_workers": args.n_workers, "ray_options": ray_options},
    )
    venv = VecFrameStack(venv, n_stack=4)
    try:
        model = PPO("CnnPolicy", venv, n_steps=128, batch_size=256, n_epochs=4, seed=args.seed, verbose=1)
        model.learn(total_timesteps=args.steps)
    finally:
        venv.close()


if __name__ == "__main__":
    main()
