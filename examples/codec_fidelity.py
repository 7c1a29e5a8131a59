"""Check what a codec does to the observations, then train with it.

    python examples/codec_fidelity.py --env ALE/Breakout-v5 --steps 20000

A codec that changes pixels changes what the agent learns from. So before turning one on: collect
real frames, measure each candidate (bit-exact? max error, PSNR, compression ratio, speed) and its
effect on a policy's actions, and only then train with the chosen one. ShmVecEnv re-checks a
lossless codec while training (a crc32 of the raw observation every ``verify_every`` frames) and
refuses a lossy one unless you state a tolerance.
"""

import argparse

from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import VecTransposeImage

from shmvec import ShmVecEnv, codecs, fidelity
from shmvec.bench.envs import env_factory
from shmvec.errors import install_hint


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--env", default="ALE/Breakout-v5", help="gymnasium Atari id")
    parser.add_argument("--frames", type=int, default=300, help="frames collected for the report")
    parser.add_argument("--steps", type=int, default=20_000, help="total env steps of training")
    parser.add_argument("--n-envs", type=int, default=4, help="parallel envs")
    args = parser.parse_args()
    missing = codecs.missing()
    if missing:
        raise SystemExit(f"this example needs the {', '.join(missing)} codecs: {install_hint('codecs')}")

    make_env = env_factory(args.env)
    frames = fidelity.collect_frames(make_env, args.frames, seed=0)

    # An untrained policy is enough to see whether a codec moves the policy's inputs at all; pass a
    # trained model (fidelity.load_model) for the effect that matters.
    probe_env = VecTransposeImage(ShmVecEnv([make_env], start_method="fork"))
    probe = PPO("CnnPolicy", probe_env, seed=0, device="cpu")
    print(f"{args.env}: {len(frames)} frames {frames.shape[1:]}")
    header = f"{'codec':<22}{'ratio':>9}{'exact':>7}{'max err':>9}{'PSNR dB':>9}{'us/frame':>10}"
    print(header + f"{'actions changed':>17}")
    for name in ("lz4", "zstd", "delta", "jpeg:quality=50"):
        codec = codecs.parse(name)
        report = fidelity.check(codec, frames)
        decoded = fidelity.roundtrip(codec, frames)[0]
        # The policy sees channel-first images (VecTransposeImage), so probe it that way.
        effect = fidelity.policy_effect(probe, frames.transpose(0, 3, 1, 2), decoded.transpose(0, 3, 1, 2))
        psnr = "inf" if report.bit_exact else f"{report.psnr_db:.1f}"
        print(
            f"{name:<22}{report.compression_ratio:>8.0f}x{'yes' if report.bit_exact else 'no':>7}"
            f"{report.max_abs_error:>9g}{psnr:>9}{report.us_per_frame:>10.1f}{effect.action_change_rate:>16.1%}"
        )
    probe_env.close()

    # Lossless and the best ratio on Atari frames: train with it. A lossy codec here would need
    # tolerance=codecs.Tolerance(min_psnr_db=...), or ShmVecEnv refuses it.
    venv = VecTransposeImage(ShmVecEnv([make_env] * args.n_envs, codec="delta", verify_every=50))
    try:
        model = PPO("CnnPolicy", venv, n_steps=128, batch_size=128, seed=0, verbose=1)
        model.learn(total_timesteps=args.steps)
        print(f"trained {args.steps} steps with codec=delta; every 50th frame of each env was verified")
    finally:
        venv.close()


if __name__ == "__main__":
    main()
