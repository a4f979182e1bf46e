"""fresh_rl.sweep: the sharded grid equals the plain vmapped one on 8 simulated CPU devices and
really splits the work; a SIGKILLed run resumes bit-identically; bad checkpoints fail clearly
and leave the previous good one usable."""
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from fresh_rl.control.train import TrainConfig, init_state, train, train_iteration
from fresh_rl.lag import DelayConfig
from fresh_rl.sweep import CheckpointError, RunCheckpointer, product_grid, run_resumable

ROOT = Path(__file__).resolve().parents[1]
CONFIG = TrainConfig(env_name="CartPole-v1", num_envs=4, rollout_length=8, total_env_steps=4 * 8 * 6,
                     num_epochs=1, num_minibatches=2, hidden_sizes=(8,), method="vaco",
                     delay=DelayConfig.fixed(2, 3))
KEY = jax.random.PRNGKey(3)

_PRELUDE = textwrap.dedent("""
    import functools, json, os, sys, time
    import jax, jax.numpy as jnp, numpy as np
    from fresh_rl.control.train import TrainConfig, SweepParams, init_state, train, train_iteration
    from fresh_rl.lag import DelayConfig
    CONFIG = TrainConfig(env_name="CartPole-v1", num_envs=4, rollout_length=8, total_env_steps=4 * 8 * 6,
                         num_epochs=1, num_minibatches=2, hidden_sizes=(8,), method="vaco",
                         delay=DelayConfig.fixed(2, 3))
""")


def _python(code: str, env_extra=None, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-c", _PRELUDE + textwrap.dedent(code)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_sharded_grid_equals_plain_vmap_on_8_devices():
    code = """
        from fresh_rl.sweep import product_grid, run_sharded, to_host
        assert jax.device_count() == 8, jax.devices()
        grid = product_grid(4, seed=0, lag=[0, 2], vaco_delta=[0.1, 0.2])   # 16 points
        fn = lambda key, lag, delta: train(CONFIG, key, SweepParams(lag=lag, vaco_delta=delta)).metrics
        args = (grid.keys, jnp.asarray(grid.values["lag"]), jnp.asarray(grid.values["vaco_delta"], jnp.float32))
        sharded = run_sharded(fn, *args)
        chunked = run_sharded(fn, *args, chunk_size=8)
        plain = jax.jit(jax.vmap(fn))(*args)
        ret = sharded["episode_return"]
        diff = lambda a, b: max(float(np.abs(np.asarray(x) - np.asarray(y)).max())
                                for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
        print(json.dumps({
            "devices": jax.device_count(),
            "shard_devices": sorted(str(s.device) for s in ret.addressable_shards),
            "shard_rows": [s.data.shape[0] for s in ret.addressable_shards],
            "shard_index": [s.index[0].start for s in ret.addressable_shards],
            "sharded_vs_plain": diff(sharded, plain),
            "chunked_vs_plain": diff(to_host(chunked), plain),
            "gap_by_lag": [float(np.asarray(plain["lag/version_gap_mean"])[grid.values["lag"] == l].mean()) for l in (0, 2)],
        }))
    """
    proc = _python(code, {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"})
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["devices"] == 8
    assert len(set(result["shard_devices"])) == 8  # one shard per device …
    assert result["shard_rows"] == [2] * 8  # … of 16 / 8 grid points each
    assert sorted(result["shard_index"]) == list(range(0, 16, 2))
    assert result["sharded_vs_plain"] == 0.0
    assert result["chunked_vs_plain"] < 1e-5  # another vmap width may reorder float reductions
    assert result["gap_by_lag"][0] == 0.0 and result["gap_by_lag"][1] > 1.0


def test_product_grid_keys_depend_only_on_the_seed():
    grid = product_grid(3, seed=7, lag=[0, 4], delta=[0.1, 0.2, 0.4])
    assert grid.size == 3 * 2 * 3
    keys = np.asarray(grid.keys)
    for i, row in enumerate(grid.rows):
        np.testing.assert_array_equal(keys[i], np.asarray(jax.random.fold_in(jax.random.PRNGKey(7), row["seed"])))
    assert grid.rows[0] == {"seed": 0, "lag": 0, "delta": 0.1} and grid.rows[1]["seed"] == 1
    with pytest.raises(ValueError, match="num_seeds"):
        product_grid(0)
    with pytest.raises(ValueError, match="lag"):
        product_grid(1, lag=[])


def _resumable(directory, every=1, fingerprint=repr(CONFIG)):
    return run_resumable(functools.partial(init_state, CONFIG), functools.partial(train_iteration, CONFIG),
                         KEY, CONFIG.num_iterations, RunCheckpointer(directory, fingerprint), every=every)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    state, metrics = _resumable(tmp_path_factory.mktemp("plain"))
    return state, metrics


def test_resumable_run_equals_train(uninterrupted):
    state, metrics = uninterrupted
    ref = jax.jit(train, static_argnums=0)(CONFIG, KEY)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for name, value in ref.metrics.items():
        np.testing.assert_array_equal(metrics[name], np.asarray(value), err_msg=name)


def test_sigkill_mid_training_then_resume_is_bit_identical(tmp_path, uninterrupted):
    code = f"""
        from fresh_rl.sweep import RunCheckpointer, run_resumable
        def slow(done, total, seconds):  # give the parent time to kill us mid-run
            print("checkpoint", done, flush=True)
            time.sleep(0.5)
        run_resumable(functools.partial(init_state, CONFIG), functools.partial(train_iteration, CONFIG),
                      jax.random.PRNGKey(3), CONFIG.num_iterations,
                      RunCheckpointer({str(tmp_path)!r}, repr(CONFIG)), every=1, on_checkpoint=slow)
        print("finished", flush=True)
    """
    proc = _python(code)
    seen = []
    for line in proc.stdout:
        if line.startswith("checkpoint"):
            seen.append(int(line.split()[1]))
            if seen[-1] >= 2:
                proc.send_signal(signal.SIGKILL)
                break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    steps = RunCheckpointer(tmp_path, repr(CONFIG)).steps()
    assert steps and max(steps) < CONFIG.num_iterations, steps  # really interrupted mid-run
    state, metrics = _resumable(tmp_path)
    ref_state, ref_metrics = uninterrupted
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(ref_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for name in ref_metrics:
        np.testing.assert_array_equal(metrics[name], ref_metrics[name], err_msg=name)


def test_corrupt_or_foreign_checkpoint_fails_clearly_and_keeps_the_previous(tmp_path, uninterrupted):
    _resumable(tmp_path, every=2)
    checkpointer = RunCheckpointer(tmp_path, repr(CONFIG))
    assert checkpointer.steps() == [4, 6]  # max_to_keep = 2
    state, metrics = uninterrupted
    abstract = jax.eval_shape(lambda: {"state": state, "metrics": metrics, "step": np.int64(0)})
    with pytest.raises(CheckpointError, match="another configuration"):
        RunCheckpointer(tmp_path, "a different config").restore_latest(abstract)
    for f in (tmp_path / "6" / "run").rglob("*"):  # corrupt the newest checkpoint
        if f.is_file():
            f.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=str(tmp_path / "6")):
        checkpointer.restore_latest(abstract)
    assert checkpointer.steps() == [4, 6]  # nothing deleted
    step, tree = checkpointer.restore_latest(abstract, fallback=True)
    assert step == 4
    np.testing.assert_array_equal(tree["metrics"]["episode_return"][:4], metrics["episode_return"][:4])
    wrong = jax.eval_shape(lambda: {"state": state.params, "step": np.int64(0)})
    with pytest.raises(CheckpointError, match="does not match"):
        RunCheckpointer(tmp_path, repr(CONFIG)).restore_latest(wrong)
