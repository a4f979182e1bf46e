"""No silent failure in a run: the non-finite guard, verified checkpoints, run identity and the
one-writer lock (fresh_rl.sweep.integrity / .checkpoint / .lock), through the Python API and
the CLI."""
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fresh_rl.cli import main
from fresh_rl.control import HyperParams, TrainConfig, init_state, train_iteration
from fresh_rl.sweep import (CheckpointError, FolderLockedError, NonFiniteError, RunCheckpointer, nonfinite_cells,
                            output_lock, run_loop, run_stage, seed_keys, split_run_key, tree_checksum)
from fresh_rl.sweep.integrity import first_nonfinite_leaf, first_nonfinite_metric, tree_is_finite
from fresh_rl.sweep.lock import LOCK_NAME

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--env_name", "CartPole-v1", "--num_envs", "4", "--rollout_length", "8", "--total_env_steps", "192",
        "--num_epochs", "1", "--num_minibatches", "2", "--hidden_sizes", "8", "--method", "ppo_clip"]


def _toy_step(state, key):
    """x accumulates noise; from step ``nan_at`` on (state["n"] counts steps) it turns NaN."""
    n = state["n"] + 1
    x = state["x"] + jax.random.normal(key, state["x"].shape)
    x = jnp.where(n > state["nan_at"], jnp.nan, x)
    return {"x": x, "n": n, "nan_at": state["nan_at"]}, {"x": x, "n": n.astype(jnp.float32)}


def _toy_state(nan_at, seeds=()):
    shape = tuple(seeds)
    return {"x": jnp.zeros(shape), "n": jnp.zeros(shape, jnp.int32), "nan_at": jnp.full(shape, nan_at, jnp.int32)}


# ----------------------------------------------------------------------------- the guard


@pytest.mark.parametrize("steps_per_call", [1, 2])
def test_guard_stops_at_the_first_nonfinite_step_and_keeps_the_last_checkpoint(tmp_path, steps_per_call):
    _, key_loop = split_run_key(jax.random.PRNGKey(0))
    checkpointer = RunCheckpointer(tmp_path, "toy")
    with pytest.raises(NonFiniteError, match=r"step 5: metric 'x' is nan.*newest checkpoint, step 4 .* kept"):
        run_loop(_toy_step, _toy_state(5), key_loop, 9, steps_per_call=steps_per_call,
                 checkpointer=checkpointer, checkpoint_every=2)
    assert checkpointer.steps() == [2, 4]
    abstract = {"state": jax.eval_shape(lambda: _toy_state(5)),
                "history": {name: jax.ShapeDtypeStruct((9,), np.float32) for name in ("x", "n", "wall_seconds")}}
    step, tree = checkpointer.restore_latest(abstract)
    assert step == 4 and first_nonfinite_leaf(tree) is None
    np.testing.assert_array_equal(tree["history"]["n"][:4], [1, 2, 3, 4])


def test_guard_names_the_seed_that_diverged():
    _, key_loop = split_run_key(seed_keys([0, 1, 2]))
    state = _toy_state(99, seeds=(3,))
    state["nan_at"] = jnp.asarray([99, 2, 99], jnp.int32)
    with pytest.raises(NonFiniteError, match=r"step 2, seed index \(1,\): metric 'x'"):
        run_loop(jax.vmap(_toy_step), state, key_loop, 6, steps_per_call=3)


def test_guard_catches_a_nonfinite_state_with_finite_metrics():
    def step(state, key):  # metrics stay finite, the parameters overflow at step 2
        params = jnp.where(state["n"] >= 2, jnp.inf, state["params"] + 1.0)
        return {"params": params, "n": state["n"] + 1}, {"loss": jnp.float32(0.0)}

    with pytest.raises(NonFiniteError, match=r"step 2: the state has \['params'\]: 1 of 1 values inf"):
        run_loop(step, {"params": jnp.zeros(()), "n": jnp.zeros((), jnp.int32)}, jax.random.PRNGKey(0), 5)
    # ±inf elsewhere is legitimate (a replay min-tree's empty nodes, τ = ∞ as a metric)
    assert bool(tree_is_finite({"replay": {"min_tree": jnp.full(4, jnp.inf)}, "params": jnp.ones(2)}))
    assert not bool(tree_is_finite({"replay": jnp.asarray([0.0, jnp.nan])}))
    assert first_nonfinite_leaf({"a": np.ones(2), "b": {"opt_state": np.asarray([1.0, -np.inf])}}) == \
        "['b']['opt_state']: 1 of 2 values inf"


def test_first_nonfinite_metric_and_cells_pick_the_earliest():
    metrics = {"a": np.asarray([[0.0, 1.0, np.nan], [0.0, 0.0, 0.0]]),
               "loss/b": np.asarray([[0.0, np.inf, 0.0], [0.0, 0.0, np.nan]])}
    assert first_nonfinite_metric(metrics, 10, num_seed_axes=1) == (11, "loss/b", (0,), np.inf)
    assert nonfinite_cells(metrics) == {0: (1, "loss/b"), 1: (2, "loss/b")}
    assert first_nonfinite_metric({"a": np.zeros((2, 3))}, 0, 1) is None


def test_control_run_diverging_mid_run_keeps_its_finite_checkpoints(tmp_path):
    """A real trainer: the learning rate jumps to 1e30 at iteration 3 (a traced HyperParams
    value computed from the state's version counter), the guard stops it there."""
    config = TrainConfig(env_name="CartPole-v1", num_envs=4, rollout_length=8, total_env_steps=4 * 8 * 6,
                         num_epochs=1, num_minibatches=2, hidden_sizes=(8,), method="ppo_clip")
    hparams = HyperParams.from_config(config)
    key_init, key_loop = split_run_key(jax.random.PRNGKey(1))

    def step(state, key):
        version = state.ring.latest_version
        lr = jnp.where(version >= 3, jnp.float32(1e30), hparams.learning_rate)
        return train_iteration(config, state, key, hparams.replace(learning_rate=lr))

    checkpointer = RunCheckpointer(tmp_path, "diverging")
    with pytest.raises(NonFiniteError, match=r"step 3: metric '[^']+' is (nan|inf|-inf)"):
        run_loop(step, init_state(config, key_init, hparams), key_loop, config.num_iterations,
                 checkpointer=checkpointer, checkpoint_every=1)
    assert checkpointer.steps() == [2, 3]  # written after steps 2 and 3 (finite), none after


def test_checkpoint_refuses_nan_and_detects_a_checksum_mismatch(tmp_path):
    checkpointer = RunCheckpointer(tmp_path, "x")
    with pytest.raises(NonFiniteError, match=r"refusing to checkpoint step 1 .*\['w'\]: 1 of 2 values NaN"):
        checkpointer.save(1, {"w": np.asarray([1.0, np.nan], np.float32)})
    assert checkpointer.steps() == []
    tree = {"w": np.arange(4, dtype=np.float32)}
    checkpointer.save(1, tree)
    checkpointer.save(2, {"w": tree["w"] + 1})
    assert tree_checksum(tree) != tree_checksum({"w": tree["w"] + 1})
    assert tree_checksum(tree) == tree_checksum({"w": np.arange(4, dtype=np.float32)})
    assert tree_checksum(tree) != tree_checksum({"w": np.arange(4, dtype=np.float64)})
    meta = tmp_path / "2" / "meta" / "metadata"
    record = json.loads(meta.read_text())
    record["checksum"] = "0" * 64  # the bytes decode fine but are not what was written
    meta.write_text(json.dumps(record))
    abstract = jax.eval_shape(lambda: tree)
    with pytest.raises(CheckpointError, match=r"/2 is corrupt: its contents do not match the checksum"):
        RunCheckpointer(tmp_path, "x").restore_latest(abstract, fallback=False)
    with pytest.warns(UserWarning, match="is corrupt"):
        step, restored = RunCheckpointer(tmp_path, "x").restore_latest(abstract)
    assert step == 1
    np.testing.assert_array_equal(restored["w"], tree["w"])


def test_a_stage_keeps_a_diverged_run_as_a_result_and_restores_it(tmp_path):
    """``run_stage`` saves finished runs' outputs with NaN in them (the study scores a diverged run by
    its rule); a rerun restores every chunk without calling the function."""
    calls = []

    def fn(x):
        calls.append(1)  # counted at trace time: one trace per invocation that computes
        return {"y": jnp.where(x > 2, jnp.nan, x * jnp.ones(3))}

    grid = jnp.arange(5.0)
    out, _ = run_stage(fn, grid, directory=tmp_path / "stage", fingerprint="nan stage", chunk_size=2)
    assert np.isnan(out["y"][3:]).all() and np.isfinite(out["y"][:3]).all()
    assert nonfinite_cells(out) == {3: (0, "y"), 4: (0, "y")}
    traced = len(calls)
    again, _ = run_stage(fn, grid, directory=tmp_path / "stage", fingerprint="nan stage", chunk_size=2)
    np.testing.assert_array_equal(again["y"], out["y"])
    assert len(calls) == traced + 1  # traced for the output shapes, never run: every chunk was restored


# ----------------------------------------------------------------------------- the lock


def test_lock_is_exclusive_names_its_owner_and_is_released(tmp_path):
    with output_lock(tmp_path) as path:
        owner = json.loads(path.read_text())
        assert owner["pid"] == os.getpid()
        with pytest.raises(FolderLockedError, match=rf"in use by another run: pid {os.getpid()} on host"):
            with output_lock(tmp_path):
                pass
    assert (tmp_path / LOCK_NAME).read_text() == ""  # released cleanly: no owner recorded
    with output_lock(tmp_path):
        pass


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    record = {"pid": int(dead.stdout), "host": "somewhere", "started": "earlier", "command": "killed run"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(record))
    with pytest.warns(UserWarning, match=rf"stale lock .* pid {record['pid']} on host somewhere"):
        with output_lock(tmp_path):
            assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


# ----------------------------------------------------------------------------- the CLI


def test_cli_nonfinite_run_exits_nonzero_naming_the_step(tmp_path):
    with pytest.raises(SystemExit, match=r"non-finite values at step 0: metric '[^']+' is"):
        main(["train", "--out", str(tmp_path), "--learning_rate", "1e30", *TINY])
    assert not (tmp_path / "metrics.csv").exists()


def test_cli_seed_is_part_of_the_run_identity_and_a_cut_write_keeps_the_old_file(tmp_path, monkeypatch):
    main(["train", "--out", str(tmp_path), "--seed", "3", *TINY])
    first = (tmp_path / "metrics.csv").read_text()
    with pytest.raises(SystemExit, match=rf"^error: --out {tmp_path} belongs to another run: seed 3 → 4 \("):
        main(["train", "--out", str(tmp_path), "--seed", "4", *TINY])
    assert (tmp_path / "metrics.csv").read_text() == first  # the finished run is untouched
    main(["train", "--out", str(tmp_path), "--seed", "3", *TINY])  # same identity: restored
    assert (tmp_path / "metrics.csv").read_text() == first

    def disk_full(self, rows):  # half the rows reach the file, then the disk is full
        self.writer.writerow(list(rows[0].values()))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(csv.DictWriter, "writerows", disk_full)
    with pytest.raises(SystemExit) as info:
        main(["train", "--out", str(tmp_path), "--seed", "3", *TINY])
    assert str(info.value) == f"fresh-rl: could not write {tmp_path / 'metrics.csv'}: [Errno 28] No space left on device"
    assert (tmp_path / "metrics.csv").read_text() == first  # the old file, whole
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no partial file left


def test_a_cut_first_write_leaves_no_file(tmp_path, monkeypatch):
    from fresh_rl.provenance import OutputWriteError, write_atomic

    def cut(f):
        f.write("half a tab")
        raise OSError(5, "Input/output error")

    with pytest.raises(OutputWriteError, match=r"could not write .*table\.csv: \[Errno 5\] Input/output error"):
        write_atomic(tmp_path / "table.csv", cut)
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_of_another_run_names_only_the_differing_fields(tmp_path):
    from fresh_rl.sweep import RunIdentityError
    from fresh_rl.sweep.identity import fingerprint

    run = {"command": "sweep", "seed": 0, "learning_rate": 3e-4, "hidden_sizes": [64, 64]}
    RunCheckpointer(tmp_path, fingerprint(run)).save(1, {"x": jnp.ones(2)})
    other = RunCheckpointer(tmp_path, fingerprint({**run, "seed": 5, "learning_rate": 1e-3}))
    with pytest.raises(RunIdentityError) as info:
        other.restore_latest({"x": jax.ShapeDtypeStruct((2,), jnp.float32)})
    assert "learning_rate 0.0003 → 0.001, seed 0 → 5 (" in str(info.value)
    assert len(str(info.value)) < 300 and "hidden_sizes" not in str(info.value)


def test_cli_second_run_on_a_busy_folder_fails_at_once_and_the_first_finishes(tmp_path):
    # the first run stops after its first checkpoint until this test has tried the second run (the
    # file `go` appears), so the folder is held while the second run starts, without timed sleeps
    go = tmp_path.parent / f"{tmp_path.name}.go"
    code = ("import os, time; from fresh_rl.cli import main; import fresh_rl.sweep.checkpoint as c; "
            "save = c.RunCheckpointer.save\n"
            "def held(self, step, tree):\n    save(self, step, tree); print('saved', step, flush=True)\n"
            f"    deadline = time.monotonic() + 120\n"
            f"    while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:\n"
            "        time.sleep(0.02)\n"
            f"c.RunCheckpointer.save = held\nmain(['train', '--out', {str(tmp_path)!r}, '--checkpoint-every', '1', "
            f"*{TINY!r}])")
    first = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        for line in first.stdout:  # wait until the first run holds the folder and has saved
            if line.startswith("saved"):
                break
        else:
            pytest.fail(first.stderr.read())
        started = time.perf_counter()
        with pytest.raises(SystemExit, match=rf"output folder {tmp_path} is in use by another run: pid {first.pid}"):
            main(["train", "--out", str(tmp_path), "--seed", "1", *TINY])
        assert time.perf_counter() - started < 5  # refused before any computation
        assert first.poll() is None  # the first run was still holding the folder
        go.touch()
        first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 0
    with open(tmp_path / "metrics.csv") as f:
        assert len(list(csv.DictReader(f))) == 6  # the first run's results are complete


def test_cli_sweep_marks_nonfinite_cells_and_keeps_the_rest(tmp_path):
    with pytest.raises(SystemExit, match=r"2 of 4 runs went non-finite.*'learning_rate': 1e\+30.*from iteration 0"):
        main(["sweep", "--out", str(tmp_path), "--seeds", "2", "--grid", "learning_rate=0.0003,1e30", *TINY])
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 * 6
    marked = {(r["seed"], r["learning_rate"]): r["nonfinite_from_iteration"] for r in rows}
    assert marked == {(seed, lr): "0" if lr == "1e+30" else "-1" for seed in ("0", "1") for lr in ("0.0003", "1e+30")}
    good = [r for r in rows if float(r["learning_rate"]) < 1]
    assert all(np.isfinite(float(r["loss/loss"])) for r in good)
    # the finished sweep owns its folder (no --chunk-size, so no checkpoint): another sweep or a
    # train run is refused before it computes, naming what differs, and the metrics stay
    before = (tmp_path / "metrics.csv").read_text()
    with pytest.raises(SystemExit, match=r"belongs to another run: seed 0 → 5, seeds 2 → 1, "
                                         r"grid\.learning_rate \[0\.0003, 1e\+30\] → \[0\.001\] \("):
        main(["sweep", "--out", str(tmp_path), "--seed", "5", "--seeds", "1", "--grid", "learning_rate=0.001",
              *TINY])
    with pytest.raises(SystemExit, match=r"belongs to another run: command sweep → train, seeds 2 → \(none\)"):
        main(["train", "--out", str(tmp_path), *TINY])
    assert (tmp_path / "metrics.csv").read_text() == before


def test_one_rule_for_metrics_and_state_inf_is_a_value_except_in_losses_gradients_parameters():
    ok = {"age_decay_tau": np.asarray([[np.inf, np.inf]]), "replay_min": np.asarray([[-np.inf, 0.0]])}
    assert first_nonfinite_metric(ok, 0, 1) is None and nonfinite_cells(ok) == {}
    for name in ("loss/loss", "loss/grad_norm", "params_norm"):
        assert first_nonfinite_metric({name: np.asarray([[0.0, np.inf]])}, 0, 1) == (1, name, (0,), np.inf)
    assert first_nonfinite_metric({"age_decay_tau": np.asarray([[np.nan]])}, 0, 1)[1] == "age_decay_tau"
    state = {"hparams": {"age_decay_tau": np.asarray([np.inf])}, "train": {"params": {"w": np.asarray([np.inf])}}}
    assert first_nonfinite_leaf(state) == "['train']['params']['w']: 1 of 1 values inf"  # hparams is not params
    assert bool(tree_is_finite({"hparams": {"age_decay_tau": jnp.full(2, jnp.inf)}}))


def test_llm_parameter_checkpoint_byte_flip_is_detected(tmp_path):
    from fresh_rl.llm.model import init_params, preset
    from fresh_rl.llm.warm_start import CHECKSUM_FILE, restore_params, save_params

    config = preset("tiny")
    params = init_params(config, jax.random.PRNGKey(0))
    save_params(str(tmp_path / "p"), params)
    assert (tmp_path / "p" / CHECKSUM_FILE).exists()
    restored = restore_params(str(tmp_path / "p"), config)
    assert tree_checksum(restored) == tree_checksum(params)
    largest = max((f for f in (tmp_path / "p").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    data = bytearray(largest.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xFF
    largest.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"parameter checkpoint {tmp_path / 'p'} is (corrupt|unreadable)"):
        restore_params(str(tmp_path / "p"), config)
    nan_params = jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(jnp.nan) if x.ndim else x, params)
    with pytest.raises(NonFiniteError, match="refusing to save non-finite parameters"):
        save_params(str(tmp_path / "q"), nan_params)


def test_late_callbacks_into_a_closed_event_loop_are_dropped_and_nothing_else(tmp_path):
    """A corrupt checkpoint's failed restore leaves tensorstore reads that call back into
    orbax's closed event loop: one unraisable traceback each, dropped; other errors are kept."""
    import asyncio
    import types

    from fresh_rl.sweep.checkpoint import _drop_closed_loop_callbacks

    RunCheckpointer(tmp_path, "x")
    assert sys.unraisablehook.drops_closed_loop_callbacks  # installed by the checkpointer
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed") as info:
        loop.call_soon_threadsafe(print)
    late = info.value
    seen = []
    hook = _drop_closed_loop_callbacks(seen.append)

    def report(err, tb, obj=None):
        hook(types.SimpleNamespace(exc_type=type(err), exc_value=err, exc_traceback=tb, err_msg=None, object=obj))

    report(late, late.__traceback__.tb_next)  # called from C: asyncio frames only → dropped
    report(late, late.__traceback__)  # a Python caller → kept
    report(late, late.__traceback__.tb_next, obj=loop)  # raised for an object → kept
    report(RuntimeError("Event loop is closed"), None)  # no frames → kept
    assert len(seen) == 3
