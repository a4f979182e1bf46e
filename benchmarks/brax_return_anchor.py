"""Return anchor: our PPO-clip at lag 0 against Brax's own PPO trainer, same task, same step budget.

The VACO study needs a continuous task on which our PPO-clip reaches ≥ 80% of the return Brax's
PPO trainer reaches with the same env steps; this script measures it, side by side, on the same
seeds. Both sides get the same settings where both have the knob (``--num-envs`` envs, unroll /
rollout length T, ``--minibatches`` × ``--epochs`` per batch of ``num_envs · T`` transitions, Adam
at ``--lr`` with global-norm clipping 0.5, γ, λ, PPO ε, entropy coefficient, value coefficient 0.5,
running observation normalisation, per-minibatch advantage standardisation, separate tanh MLPs,
a plain Gaussian policy, episode length 1000, action repeat 1, reward scaling 1). What stays
Brax's design: it minibatches whole length-T sequences and recomputes GAE inside each minibatch
loss; ours shuffles single transitions with advantages frozen per batch.

Score: the deterministic policy's return at the last evaluation (Brax: ``deterministic_eval``
on ``--eval-episodes`` eval envs; ours: the learner's ``eval/return_deterministic`` over as many
episodes), per seed; the ratio of the seed means with a 95% Student-t interval for each side.
Writes ``results/bench/brax_return_anchor.{csv,md}``.

    python benchmarks/brax_return_anchor.py --steps 20000 --seeds 1   # a smoke run (minutes)
    python benchmarks/brax_return_anchor.py                           # the committed table
"""
from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import brax.envs
import flax.linen as nn
import jax
import numpy as np
from brax.training.agents.ppo import networks as brax_ppo_networks
from brax.training.agents.ppo import train as brax_ppo

from fresh_rl.control import TrainConfig, train
from fresh_rl.corrections import PPOClipConfig
from fresh_rl.eval import eval_final_score
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_csv
from fresh_rl.report import interval, interval_text
from fresh_rl.sweep.keys import seed_keys

THRESHOLD = 0.8  # the VACO study's bar: ours ≥ 80% of Brax PPO's return


def train_ours(args) -> np.ndarray:
    """Final deterministic learner return per seed, all seeds vmapped in one program."""
    config = TrainConfig(
        env_name=f"brax/{args.env}", brax_backend=args.backend, num_envs=args.num_envs, rollout_length=args.unroll,
        total_env_steps=args.steps, num_epochs=args.epochs, num_minibatches=args.minibatches, learning_rate=args.lr,
        max_grad_norm=0.5, gamma=args.gamma, gae_lambda=args.gae_lambda, entropy_coef=args.entropy,
        value_coef=0.5, advantage_normalization="standardize", normalize_obs=True, hidden_sizes=tuple(args.hidden),
        activation="tanh", method="ppo_clip", ppo_clip=PPOClipConfig(epsilon_low=args.clip, epsilon_high=args.clip),
        eval_every=max(1, args.steps // (args.num_envs * args.unroll * args.evals)), eval_episodes=args.eval_episodes)
    metrics = jax.jit(jax.vmap(train, (None, 0)), static_argnums=0)(config, seed_keys(range(args.seeds))).metrics
    return eval_final_score(np.asarray(metrics["eval/return_deterministic"]), np.asarray(metrics["eval/valid"]))


def train_brax(args) -> np.ndarray:
    """Brax PPO's final deterministic evaluation return per seed (one ``ppo.train`` call each)."""
    network_factory = functools.partial(
        brax_ppo_networks.make_ppo_networks, policy_hidden_layer_sizes=tuple(args.hidden),
        value_hidden_layer_sizes=tuple(args.hidden), activation=nn.tanh, distribution_type="normal")
    finals = []
    for seed in range(args.seeds):
        curve = []
        brax_ppo.train(
            environment=brax.envs.get_environment(args.env, backend=args.backend), num_timesteps=args.steps,
            num_evals=args.evals + 1, num_envs=args.num_envs, episode_length=1000, action_repeat=1,
            unroll_length=args.unroll, batch_size=args.num_envs // args.minibatches,
            num_minibatches=args.minibatches, num_updates_per_batch=args.epochs, learning_rate=args.lr,
            entropy_cost=args.entropy, discounting=args.gamma, gae_lambda=args.gae_lambda,
            clipping_epsilon=args.clip, max_grad_norm=0.5, normalize_advantage=True, normalize_observations=True,
            reward_scaling=1.0, vf_loss_coefficient=0.5, network_factory=network_factory,
            num_eval_envs=args.eval_episodes, deterministic_eval=True, seed=seed,
            progress_fn=lambda step, m: curve.append(float(m["eval/episode_reward"])))
        finals.append(curve[-1])
    return np.array(finals)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="inverted_pendulum", help="a Brax task name")
    parser.add_argument("--backend", default="spring")
    # defaults: the VACO study's continuous-task candidate, 200 versions of 16 envs × 64 steps (its gymnax runs' length)
    parser.add_argument("--steps", type=int, default=204_800, help="env steps per run, both sides")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--unroll", type=int, default=64)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--entropy", type=float, default=0.0)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--evals", type=int, default=10, help="evaluations per run (the last one is the score)")
    parser.add_argument("--eval-episodes", type=int, default=16)
    parser.add_argument("--out", type=Path, default=REPOSITORY_ROOT / "results" / "bench")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    scores = {}
    for side, fn in (("brax ppo", train_brax), ("ours ppo_clip lag 0", train_ours)):
        t0 = time.perf_counter()
        scores[side] = fn(args)
        print(f"{side}: final returns {np.round(scores[side], 1).tolist()} ({time.perf_counter() - t0:.0f} s)", flush=True)
    ratio = scores["ours ppo_clip lag 0"].mean() / scores["brax ppo"].mean()
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "brax_return_anchor.csv",
              [{"side": side, "seed": s, "env": args.env, "steps": args.steps, "final_return": float(v)}
               for side, values in scores.items() for s, v in enumerate(values)])
    header = provenance(started=started)
    settings = ", ".join(f"{k} {v}" for k, v in vars(args).items() if k != "out")
    text = ["# Return anchor: our PPO-clip at lag 0 vs Brax's PPO trainer", "", provenance_line(header), "",
            f"Settings: {settings}. "
            "How both sides are configured: the docstring of `benchmarks/brax_return_anchor.py`.", "",
            "| side | final deterministic return (95% interval over seeds) |", "|---|---|",
            *[f"| {side} | {interval_text(*interval(values))} |" for side, values in scores.items()], "",
            f"Ours / Brax = {ratio:.2f} (bar: ≥ {THRESHOLD:.0%}; {'met' if ratio >= THRESHOLD else 'not met'})."]
    (args.out / "brax_return_anchor.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
