"""Several JAX processes, one grid (fresh_rl.sweep.distributed): 2 processes × 2 simulated CPU
devices over loopback give exactly the numbers of 1 process × 1 device for a control grid
(seeds × lag × δ through `fresh-rl launch … sweep`), and for a FreshPER replay grid (τ × seeds)
the same samples with importance weights equal to float32 rounding (XLA:CPU fuses a multiply-add
differently in the two programs); a
killed process fails the launch naming it and a rerun resumes from the last common checkpoint;
bad setups fail within a timeout naming the setting."""
import csv
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fresh_rl.sweep import LaunchError, launch_local
from fresh_rl.sweep.distributed import free_port

ROOT = Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": str(ROOT), "FRESH_RL_DISTRIBUTED_TIMEOUT": "60"}
GRID = ["sweep", "--env_name", "CartPole-v1", "--num_envs", "4", "--rollout_length", "8", "--total_env_steps", "128",
        "--num_epochs", "1", "--num_minibatches", "2", "--hidden_sizes", "8", "--method", "vaco", "--seeds", "4",
        "--grid", "lag=0,2", "--grid", "vaco_delta=0.1,0.2", "--chunk-size", "8"]  # 16 points, 2 chunks
CLI = [sys.executable, "-m", "fresh_rl"]


def _rows(folder: Path) -> list[dict]:
    with open(folder / "metrics.csv") as f:
        return list(csv.DictReader(f))


def _run(argv, env_extra=None, timeout=600):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **ENV, **(env_extra or {})})


@pytest.fixture(scope="module")
def single_process_grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("one_process")
    done = _run([*CLI, *GRID, "--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "over 1 process(es), 1 device(s)" in done.stdout
    return _rows(out)


# the 2-process FreshPER grid equality and the launcher's failure modes stay in the default run
@pytest.mark.slow
def test_control_grid_on_2_processes_x_2_devices_equals_1_process(tmp_path, single_process_grid):
    done = _run([*CLI, "launch", "--processes", "2", "--devices-per-process", "2", "--timeout", "500",
                 *GRID, "--out", str(tmp_path)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "16 runs (4 seeds × 4 values) over 2 process(es), 4 device(s)" in done.stdout
    assert _rows(tmp_path) == single_process_grid  # every metric of every point, as text: exact
    assert len(single_process_grid) == 16 * 4


# SIGKILL-and-resume is tested single-host in the default run (test_sweep); the 2-process grid
# equality stays there too
@pytest.mark.slow
def test_killed_process_fails_the_launch_by_name_and_a_rerun_resumes_exactly(tmp_path, single_process_grid):
    checkpoint = tmp_path / "checkpoints" / "1"

    def kill_process_1_after_the_first_chunk(processes):
        def watch():
            deadline = time.monotonic() + 500
            while not checkpoint.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            os.kill(processes[1].pid, signal.SIGKILL)
        threading.Thread(target=watch, daemon=True).start()

    argv = [*CLI, *GRID, "--out", str(tmp_path)]
    with pytest.raises(LaunchError, match=r"process 1 of 2 \(pid \d+\) was killed by SIGKILL(; process 0 .*)?; the other processes were stopped"):
        launch_local(argv, 2, 2, timeout_s=500, env=ENV, on_start=kill_process_1_after_the_first_chunk)
    assert checkpoint.exists() and not (tmp_path / "metrics.csv").exists()
    first_chunk_written = checkpoint.stat().st_mtime_ns
    outputs = launch_local(argv, 2, 2, timeout_s=500, env=ENV)
    assert "over 2 process(es), 4 device(s)" in outputs[0] and "runs (" not in outputs[1]  # process 0 reports
    assert checkpoint.stat().st_mtime_ns == first_chunk_written  # resumed after chunk 1, not recomputed
    assert (tmp_path / "checkpoints" / "2").exists()
    assert _rows(tmp_path) == single_process_grid


def test_freshper_replay_grid_on_2_processes_equals_1_process(tmp_path):
    script = str(ROOT / "tests" / "scripts" / "replay_tau_grid.py")
    single = _run([sys.executable, script, str(tmp_path / "one.npz")])
    assert single.returncode == 0, single.stderr[-3000:]
    launch_local([sys.executable, script, str(tmp_path / "two.npz")], 2, 2, timeout_s=300, env=ENV)
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert (int(one["devices"]), int(two["devices"]), int(two["processes"])) == (1, 4, 2)
    # The same items are drawn (ages exactly equal). The weights agree to float32 rounding only:
    # XLA:CPU contracts the log-key's α·log p + (α/τ)·Δt into a fused multiply-add in the
    # program compiled for 4 devices and not in the 1-device one (measured: stored min-tree
    # leaves differ by 1 ulp), so bit-identity of float metrics is not a property of the sweep.
    np.testing.assert_array_equal(two["mean_age"], one["mean_age"])
    np.testing.assert_allclose(two["weight_mean"], one["weight_mean"], rtol=1e-6, atol=0)
    ages = one["mean_age"][:, -1].reshape(2, 4)  # [seed, τ ∈ 5, 20, 80, ∞]
    assert (ages[:, 0] < ages[:, -1]).all()  # short τ samples younger data: the grid is not degenerate


def test_unreachable_coordinator_fails_within_the_timeout_naming_it():
    address = f"127.0.0.1:{free_port()}"  # nobody listens: process 1 of 2 cannot join
    started = time.monotonic()
    done = _run([*CLI, *GRID, "--out", "unused"], {"JAX_COORDINATOR_ADDRESS": address, "JAX_NUM_PROCESSES": "2",
                                                   "JAX_PROCESS_ID": "1", "FRESH_RL_DISTRIBUTED_TIMEOUT": "5"})
    assert done.returncode != 0
    assert f"could not join the multi-process run within 5 s (JAX_COORDINATOR_ADDRESS={address}" in done.stderr
    assert time.monotonic() - started < 60


def test_process_count_mismatch_fails_within_the_timeout():
    address = f"127.0.0.1:{free_port()}"  # process 0 is the coordinator and waits for 2 more
    started = time.monotonic()
    done = _run([*CLI, *GRID, "--out", "unused"], {"JAX_COORDINATOR_ADDRESS": address, "JAX_NUM_PROCESSES": "3",
                                                   "JAX_PROCESS_ID": "0", "FRESH_RL_DISTRIBUTED_TIMEOUT": "5"})
    assert done.returncode != 0
    assert "joining a multi-process run (JAX_COORDINATOR_ADDRESS=" in done.stderr  # named before JAX aborts
    assert "JAX_NUM_PROCESSES=3, JAX_PROCESS_ID=0); JAX stops this process if not all" in done.stderr
    assert "DEADLINE_EXCEEDED" in done.stderr
    assert time.monotonic() - started < 60


def test_launcher_passes_its_own_process_count_and_rejects_bad_setups(tmp_path):
    with pytest.raises(ValueError, match="num_processes"):
        launch_local(["true"], 0)
    bad = _run([*CLI, "sweep", "--seeds", "3", "--no-pad", "--out", str(tmp_path), *GRID[1:13]],
               {"XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2",
                "JAX_PLATFORMS": "cpu"}, timeout=120)
    assert bad.returncode != 0
    assert "with pad=False every chunk must divide over the 2 devices: the grid has 3 points" in bad.stderr
    done = _run([*CLI, "launch", "--processes", "2"])
    assert done.returncode != 0 and "launch needs a command to run" in done.stderr
