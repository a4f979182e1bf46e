"""A FreshPER replay grid (τ × seeds) through fresh_rl.sweep, for the multi-process tests:
``python tests/scripts/replay_tau_grid.py OUT.npz`` (run once, or by ``launch_local`` as
several processes; process 0 writes OUT.npz). Each grid point streams rewards into a FreshPER
buffer with its own traced τ, replays a batch per version and writes priorities back."""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.sweep import initialize_distributed, is_primary, product_grid, run_sharded, to_host

initialize_distributed()

from fresh_rl.replay import ReplayConfig, magnitude_priority, make_trajectory_buffer  # noqa: E402

VERSIONS, INSERT, SAMPLE = 40, 8, 8
buffer = make_trajectory_buffer(ReplayConfig(capacity=128, sample_batch_size=SAMPLE, sampling="freshper",
                                             age_decay_tau=100.0, new_item_priority="given"))


def stream(key, tau):
    def version_step(state, inputs):
        version, key = inputs
        k_reward, k_sample = jax.random.split(key)
        rewards = jnp.exp(-version / 10.0) * jax.random.normal(k_reward, (INSERT,))
        state = buffer.add(state, {"reward": rewards}, version, magnitude_priority(rewards))
        sample = buffer.sample(state, k_sample, current_version=version)
        state = buffer.set_priorities(state, sample.indices, magnitude_priority(sample.experience["reward"]))
        return state, {"mean_age": sample.age.astype(jnp.float32).mean(), "weight_mean": sample.importance_weights.mean()}

    state = buffer.set_age_decay_tau(buffer.init({"reward": jnp.zeros((), jnp.float32)}), tau)
    versions = jnp.arange(VERSIONS, dtype=jnp.int32)
    return jax.lax.scan(version_step, state, (versions, jax.random.split(key, VERSIONS)))[1]


grid = product_grid(2, seed=0, age_decay_tau=[5.0, 20.0, 80.0, np.inf])  # 8 points
metrics = to_host(run_sharded(stream, grid.keys, jnp.asarray(grid.values["age_decay_tau"], jnp.float32)))
if is_primary():
    np.savez(sys.argv[1], devices=jax.device_count(), processes=jax.process_count(), **metrics)
