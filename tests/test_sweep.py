"""fresh_rl.sweep: the VACO study's grid on 8 simulated CPU devices equals the plain vmapped one
on one device (to float32 rounding) and really splits the work; a SIGKILLed run resumes bit-identically; bad
checkpoints fail clearly and leave the previous good one usable."""
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
from hypothesis import given
from hypothesis import strategies as st

from fresh_rl.control import TrainConfig, init_state, train, train_iteration
from fresh_rl.lag import DelayConfig
from fresh_rl.sweep import (CheckpointError, RunCheckpointer, RunIdentityError, product_grid, run_loop, saved_arrays,
                            seed_key, seed_keys, split_run_key, step_key, step_keys)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = TrainConfig(env_name="CartPole-v1", num_envs=4, rollout_length=8, total_env_steps=4 * 8 * 6,
                     num_epochs=1, num_minibatches=2, hidden_sizes=(8,), method="vaco",
                     delay=DelayConfig.fixed(2, 3))
KEY = jax.random.PRNGKey(3)

_PRELUDE = textwrap.dedent("""
    import functools, json, os, sys, time
    import jax, jax.numpy as jnp, numpy as np
    from fresh_rl.control import TrainConfig, HyperParams, init_state, train, train_iteration
    from fresh_rl.lag import DelayConfig
    CONFIG = TrainConfig(env_name="CartPole-v1", num_envs=4, rollout_length=8, total_env_steps=4 * 8 * 6,
                         num_epochs=1, num_minibatches=2, hidden_sizes=(8,), method="vaco",
                         delay=DelayConfig.fixed(2, 3))
""")


def _python(code: str, env_extra=None, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-c", _PRELUDE + textwrap.dedent(code)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.mark.slow  # ~45 s; the default run checks a sharded grid's exactness on 4 devices in
# tests/test_multihost.py (the same run_sharded path, over 2 processes)
def test_study_grid_on_8_devices_equals_1_device():
    """The VACO study's grid path (``variant_grid`` + ``run_variant``, what
    experiments/vaco_lag_sweep.py runs) on 8 simulated devices gives the numbers of the plain
    vmapped program on one device (to float32 rounding), and really splits the grid over the 8
    devices."""
    code = """
        from fresh_rl.control.presets import run_variant, variant_grid
        from fresh_rl.sweep import run_sharded, to_host
        assert jax.device_count() == 8, jax.devices()
        LAGS, DELTAS, SEEDS = [0, 2], [0.1, 0.2], 4   # 16 points
        grid, hparams = variant_grid(CONFIG, LAGS, DELTAS, SEEDS, seed=0)
        fn = lambda key, hp: train(CONFIG, key, hp).metrics
        study = run_variant(CONFIG, LAGS, DELTAS, SEEDS, seed=0)["metrics"]   # [lags, deltas, seeds, iterations]
        sharded = run_sharded(fn, grid.keys, hparams)
        chunked = run_sharded(fn, grid.keys, hparams, chunk_size=8)
        with jax.default_device(jax.devices()[0]):
            plain = jax.jit(jax.vmap(fn))(grid.keys, hparams)   # one device, no sharding
        assert len(jax.tree.leaves(plain)[0].devices()) == 1
        plain = to_host(plain)
        ret = sharded["episode_return"]
        diff = lambda a, b: max(float((np.abs(np.asarray(x) - np.asarray(y)) / (1.0 + np.abs(np.asarray(y)))).max())
                                for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))  # |Δ|/(1 + |y|)
        print(json.dumps({
            "devices": jax.device_count(),
            "shard_devices": sorted(str(s.device) for s in ret.addressable_shards),
            "shard_rows": [s.data.shape[0] for s in ret.addressable_shards],
            "shard_index": [s.index[0].start for s in ret.addressable_shards],
            "study_vs_plain": diff({k: study[k] for k in study},
                                   {k: plain[k].reshape(study[k].shape) for k in study}),
            "study_metrics": sorted(study),
            "sharded_vs_plain": diff(to_host(sharded), plain),
            "chunked_vs_plain": diff(to_host(chunked), plain),
            "gap_by_lag": [float(study["lag/version_gap_mean"][i].mean()) for i in range(2)],
        }))
    """
    proc = _python(code, {"XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8",
                          "JAX_PLATFORMS": "cpu"})
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["devices"] == 8
    assert len(set(result["shard_devices"])) == 8  # one shard per device …
    assert result["shard_rows"] == [2] * 8  # … of 16 / 8 grid points each
    assert sorted(result["shard_index"]) == list(range(0, 16, 2))
    assert {"episode_return", "lag/tv", "lag/version_gap_mean"} <= set(result["study_metrics"])
    # other programs (8-way sharded: vmap width 2 per device; chunked: width 1) may reorder float32
    # reductions and contract multiply-adds differently (tests/test_multihost.py measured 1 ulp): a few
    # ulp per op, kept ≲ 1e-6 relative by Adam's scale-free steps over 12 updates (|g| ≫ ε); the old
    # exact and absolute bounds ignored that and the size of the metrics (value losses ≫ 1):
    # |Δ| ≤ 1e-5·(1 + |y|)
    assert result["study_vs_plain"] < 1e-5  # the study's grid: 8 devices == 1 device
    assert result["sharded_vs_plain"] < 1e-5
    assert result["chunked_vs_plain"] < 1e-5
    assert result["gap_by_lag"][0] == 0.0 and result["gap_by_lag"][1] > 1.0  # integer gaps: 0 and 1.5


def test_product_grid_keys_follow_the_one_seed_schedule():
    grid = product_grid(3, seed=7, lag=[0, 4], delta=[0.1, 0.2, 0.4])
    assert grid.size == 3 * 2 * 3
    keys = np.asarray(grid.keys)
    for i, row in enumerate(grid.rows):
        np.testing.assert_array_equal(keys[i], np.asarray(jax.random.PRNGKey(row["seed"])))
    assert grid.rows[0] == {"seed": 7, "lag": 0, "delta": 0.1} and grid.rows[1]["seed"] == 8
    assert grid.rows[3] == {"seed": 7, "lag": 0, "delta": 0.2}  # seed fastest, first name slowest
    assert {r["seed"] for r in grid.rows} == {7, 8, 9}
    with pytest.raises(ValueError, match="num_seeds"):
        product_grid(0)
    with pytest.raises(ValueError, match="lag"):
        product_grid(1, lag=[])


@given(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=6), st.integers(0, 50), st.integers(1, 5))
def test_key_schedule_is_one_function_of_seed_and_step(seeds, start, count):
    """Batched and single-run keys agree; step keys are fold_in(split(PRNGKey(s))[1], i)."""
    keys = np.asarray(seed_keys(seeds))
    key_init, key_loop = split_run_key(seed_keys(seeds))
    window = np.asarray(step_keys(key_loop, start, start + count))
    assert window.shape == (len(seeds), count, 2)
    for j, s in enumerate(seeds):
        np.testing.assert_array_equal(keys[j], np.asarray(seed_key(s)))
        init, loop = jax.random.split(jax.random.PRNGKey(s))
        np.testing.assert_array_equal(np.asarray(key_init[j]), np.asarray(init))
        np.testing.assert_array_equal(np.asarray(step_key(key_loop, start))[j],
                                      np.asarray(jax.random.fold_in(loop, start)))
        np.testing.assert_array_equal(window[j, -1], np.asarray(jax.random.fold_in(loop, start + count - 1)))


@pytest.mark.parametrize("bad", [-1, 2**31, 1.5, True, "3"])
def test_seed_must_be_a_nonnegative_int32(bad):
    with pytest.raises(ValueError, match="seed"):
        seed_key(bad)
    with pytest.raises(ValueError, match="seeds"):
        seed_keys([0, bad])


def _toy_step(state, key):
    """A cheap step for the loop tests: a random walk and a step counter."""
    noise = jax.random.normal(key, ())
    return {"x": state["x"] + noise, "n": state["n"] + 1}, {"noise": noise, "x": state["x"] + noise}


def _toy_run(key_loop, num_steps, **kwargs):
    seeds = key_loop.shape[:-1]
    state = {"x": jax.numpy.zeros(seeds), "n": jax.numpy.zeros(seeds, jax.numpy.int32)}
    step = _toy_step
    for _ in seeds:
        step = jax.vmap(step)
    return run_loop(step, state, key_loop, num_steps, **kwargs)


def test_run_loop_chunks_seeds_and_per_step_calls_agree():
    """Per-step calls, scanned chunks, and a seed axis all produce the same history."""
    _, key_loop = split_run_key(seed_keys([0, 1, 2, 3]))
    logged = []
    state, history = _toy_run(key_loop, 7, log=lambda i, m: logged.append((i, m["x"].shape)))
    assert history["x"].shape == history["wall_seconds"].shape == (4, 7)
    assert [i for i, _ in logged] == list(range(7)) and logged[0][1] == (4,)
    np.testing.assert_array_equal(np.asarray(state["n"]), [7] * 4)
    chunked_state, chunked = _toy_run(key_loop, 7, steps_per_call=3)
    # x is a float32 running sum of 7 N(0, 1) draws made by different programs (scanned chunks, per-step
    # calls, eager draws): each step may differ by an ulp of the draw and of x (FMA of √2·erfinv + x),
    # ≲ 7·(ulp(4) + ulp(8)) ≈ 1e-5 abs, which rtol alone misses when x crosses 0: atol 1e-5
    np.testing.assert_allclose(chunked["x"], history["x"], rtol=1e-6, atol=1e-5)
    for j in range(4):  # one seed alone = its row of the batch
        _, single = _toy_run(key_loop[j], 7, steps_per_call=2)
        assert single["x"].shape == (7,)
        np.testing.assert_allclose(single["x"], history["x"][j], rtol=1e-6, atol=1e-5)
    expected = np.cumsum([float(jax.random.normal(jax.random.fold_in(key_loop[2], i), ())) for i in range(7)])
    np.testing.assert_allclose(history["x"][2], expected, rtol=1e-5, atol=1e-5)


class _Interrupt(Exception):
    pass


def test_run_loop_resumes_from_its_checkpoint_with_the_same_keys(tmp_path):
    _, key_loop = split_run_key(seed_keys([5, 6]))
    _, reference = _toy_run(key_loop, 9)

    def crash_at_step_4(i, metrics):
        if i == 4:
            raise _Interrupt

    folder = tmp_path / "run"
    with pytest.raises(_Interrupt):
        _toy_run(key_loop, 9, checkpointer=RunCheckpointer(folder, "toy"), checkpoint_every=3,
                 steps_per_call=2, log=crash_at_step_4)
    assert RunCheckpointer(folder, "toy").steps() == [3]
    with pytest.raises(RunIdentityError, match="saved by another run: saved .toy., current .other."):
        _toy_run(key_loop, 9, checkpointer=RunCheckpointer(folder, "other"))
    progress = []
    state, resumed = _toy_run(key_loop, 9, checkpointer=RunCheckpointer(folder, "toy"),
                              checkpoint_every=3, steps_per_call=2,
                              on_progress=lambda done, total, s: progress.append(done))
    assert progress == [5, 6, 8, 9]  # resumed after step 3; chunks never straddle a checkpoint
    assert RunCheckpointer(folder, "toy").steps() == [6, 9]
    np.testing.assert_array_equal(np.asarray(state["n"]), [9, 9])
    np.testing.assert_allclose(resumed["x"], reference["x"], rtol=1e-6, atol=1e-5)  # as in the test above
    _, again = _toy_run(key_loop, 9, checkpointer=RunCheckpointer(folder, "toy"))
    np.testing.assert_array_equal(again["x"], resumed["x"])  # restored, nothing recomputed
    np.testing.assert_array_equal(again["wall_seconds"], resumed["wall_seconds"])
    with pytest.raises(ValueError, match="steps_per_call"):
        _toy_run(key_loop, 3, steps_per_call=0)
    with pytest.raises(ValueError, match="key_loop"):
        run_loop(_toy_step, {"x": 0.0, "n": 0}, np.zeros(3, np.uint32), 2)


def _resumable(directory, every=1, fingerprint=repr(CONFIG)):
    key_init, key_loop = split_run_key(KEY)
    return run_loop(functools.partial(train_iteration, CONFIG), init_state(CONFIG, key_init), key_loop,
                    CONFIG.num_iterations, steps_per_call=every,
                    checkpointer=RunCheckpointer(directory, fingerprint), checkpoint_every=every)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    state, metrics = _resumable(tmp_path_factory.mktemp("plain"))
    return state, metrics


def test_resumable_run_equals_train(uninterrupted):
    state, metrics = uninterrupted
    ref = jax.jit(train, static_argnums=0)(CONFIG, KEY)
    # per-step programs vs train's one scan: equal ops, but XLA may fuse them differently (FMA
    # contraction), so float32 rounding only; Adam's scale-free step keeps relative noise ≲ 1e-6
    # over these 12 updates (|g| ≫ ε): rtol 1e-5, atol 1e-6 (a wrong key schedule moves θ by ≳ lr)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for name, value in ref.metrics.items():
        np.testing.assert_allclose(metrics[name], np.asarray(value, np.float32), rtol=1e-5, atol=1e-6, err_msg=name)


def test_sigkill_mid_training_then_resume_is_bit_identical(tmp_path, uninterrupted):
    code = f"""
        from fresh_rl.sweep import RunCheckpointer, run_loop, split_run_key
        def slow(done, total, seconds):  # wait at step 2 for the parent to kill us mid-run
            print("checkpoint", done, flush=True)
            if done >= 2:
                time.sleep(60)
        key_init, key_loop = split_run_key(jax.random.PRNGKey(3))
        run_loop(functools.partial(train_iteration, CONFIG), init_state(CONFIG, key_init), key_loop,
                 CONFIG.num_iterations, checkpointer=RunCheckpointer({str(tmp_path)!r}, repr(CONFIG)),
                 checkpoint_every=1, on_progress=slow)
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
    # exact: both runs execute the same per-step program (same code, flags and machine) on the same
    # restored state and keys
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(ref_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert set(metrics) == set(ref_metrics)
    for name in set(ref_metrics) - {"wall_seconds"}:  # timings differ, every metric must not
        np.testing.assert_array_equal(metrics[name], ref_metrics[name], err_msg=name)


def _flip_bytes_in_largest_file(step_dir: Path, count: int = 64) -> Path:
    largest = max((f for f in step_dir.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    data = bytearray(largest.read_bytes())
    middle = len(data) // 2
    for i in range(middle, min(middle + count, len(data))):
        data[i] ^= 0xFF
    largest.write_bytes(bytes(data))
    return largest


@pytest.mark.parametrize("damage", ["flip_bytes", "garbage"])
def test_corrupt_checkpoint_is_detected_skipped_and_kept_aside(tmp_path, uninterrupted, damage):
    # a checkpoint after every step: the per-step program the uninterrupted run already compiled
    _resumable(tmp_path)
    checkpointer = RunCheckpointer(tmp_path, repr(CONFIG))
    assert checkpointer.steps() == [5, 6]  # max_to_keep = 2
    state, metrics = uninterrupted
    abstract = jax.eval_shape(lambda: {"state": state, "history": metrics})
    with pytest.raises(RunIdentityError, match="saved by another run: saved .TrainConfig"):
        RunCheckpointer(tmp_path, "a different config").restore_latest(abstract)
    if damage == "flip_bytes":  # the byte-flip case: 64 bytes XORed in the largest file
        _flip_bytes_in_largest_file(tmp_path / "6")
    else:
        for f in (tmp_path / "6" / "run").rglob("*"):
            if f.is_file():
                f.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=str(tmp_path / "6")):
        checkpointer.restore_latest(abstract, fallback=False)
    assert checkpointer.steps() == [5, 6]  # nothing moved or deleted
    with pytest.warns(UserWarning, match=rf"{tmp_path / '6'}.*\n.*moved to .*6\.corrupt"):
        step, tree = checkpointer.restore_latest(abstract)
    assert step == 5 and (tmp_path / "6.corrupt").is_dir()
    # exact: this run and the reference execute the same per-step program on the same states and
    # keys (as in test_sigkill_mid_training_then_resume_is_bit_identical)
    np.testing.assert_array_equal(tree["history"]["episode_return"][:5], metrics["episode_return"][:5])
    # the run resumes from step 5 and ends where an uninterrupted run ends
    resumed_state, resumed = _resumable(tmp_path)
    for name in set(metrics) - {"wall_seconds"}:
        np.testing.assert_array_equal(resumed[name], metrics[name], err_msg=name)  # exact, as above
    assert RunCheckpointer(tmp_path, repr(CONFIG)).steps() == [5, 6]
    wrong = jax.eval_shape(lambda: {"state": state.params, "history": metrics})
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        RunCheckpointer(tmp_path, repr(CONFIG)).restore_latest(wrong)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name[0].isdigit()) == ["5", "6", "6.corrupt"]


def test_saved_arrays_computes_once_and_an_interrupted_write_leaves_no_file(tmp_path):
    path, calls = tmp_path / "runs" / "arm.npz", []

    def compute():
        calls.append(1)
        return {"seed": [0, 1], "score": np.array([0.5, 0.25])}

    first = saved_arrays(path, compute)
    again = saved_arrays(path, compute)  # loaded: compute is not called again
    assert len(calls) == 1 and path.exists()
    assert first.keys() == again.keys() == {"seed", "score"}
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])

    def fails():
        raise RuntimeError("stopped mid-run")

    other = tmp_path / "runs" / "other.npz"
    with pytest.raises(RuntimeError):
        saved_arrays(other, fails)
    assert not other.exists() and [p.name for p in other.parent.iterdir()] == ["arm.npz"]
