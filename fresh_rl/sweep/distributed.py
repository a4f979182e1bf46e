"""Several JAX processes, one grid: joining a multi-process run and launching one locally.

A sweep spans processes the same way on every platform: each process runs the same program,
:func:`initialize_distributed` joins them, the grid axis of :func:`fresh_rl.sweep.run_sharded`
is sharded over every device of every process, results are gathered on all processes
(:func:`fresh_rl.sweep.to_host`) and only the primary process (index 0) writes files.

Where the processes come from:

* **one machine** — :func:`launch_local` (``fresh-rl launch --processes N -- sweep …``) starts
  N processes talking over 127.0.0.1 with CPU collectives (gloo), each with its own simulated
  CPU devices;
* **a TPU pod slice** — run the same command on every host (``gcloud … ssh --worker=all``) with
  ``FRESH_RL_DISTRIBUTED=1``: JAX finds the coordinator from the TPU metadata;
* **a multi-node GPU job** — under SLURM (``srun``, one task per node or per GPU) set
  ``FRESH_RL_DISTRIBUTED=1``; JAX reads ``SLURM_*``. Elsewhere set ``JAX_COORDINATOR_ADDRESS``
  (``host:port`` of process 0), ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` on each process.

A process that cannot reach the coordinator, or a process count that never completes, fails
after ``FRESH_RL_DISTRIBUTED_TIMEOUT`` seconds (default 120) with :class:`DistributedSetupError`
naming the settings, instead of hanging.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Optional, Sequence

import jax

from fresh_rl.validation import require_int

TIMEOUT_VARIABLE = "FRESH_RL_DISTRIBUTED_TIMEOUT"
_SETTINGS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


class DistributedSetupError(RuntimeError):
    """The processes of a multi-process run could not join (names the settings used)."""


class LaunchError(RuntimeError):
    """A process of a local multi-process launch failed (names it, with its exit status)."""


def _timeout() -> int:
    text = os.environ.get(TIMEOUT_VARIABLE, "120")
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise DistributedSetupError(f"{TIMEOUT_VARIABLE} must be a whole number of seconds ≥ 1, got {text!r}")
    return value


def initialize_distributed() -> bool:
    """Join the multi-process run this process belongs to; ``False`` (no-op) for a single process.

    Active when ``JAX_COORDINATOR_ADDRESS`` is set (explicit address, count and index) or
    ``FRESH_RL_DISTRIBUTED=1`` (cluster auto-detection: TPU pods, SLURM). Selects gloo for CPU
    collectives, so simulated CPU devices of several processes form one mesh.
    """
    explicit = bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))
    if not explicit and os.environ.get("FRESH_RL_DISTRIBUTED", "0") != "1":
        return False
    if jax.distributed.is_initialized():
        return True
    timeout = _timeout()
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    settings = {name: os.environ.get(name) for name in _SETTINGS}
    kwargs = {}
    if explicit:
        for name in _SETTINGS[1:]:
            if settings[name] is None or not settings[name].isdigit():
                raise DistributedSetupError(f"{name} must be a non-negative integer when "
                                            f"JAX_COORDINATOR_ADDRESS is set, got {settings[name]!r}")
        num, index = int(settings["JAX_NUM_PROCESSES"]), int(settings["JAX_PROCESS_ID"])
        if num < 1 or index >= num:
            raise DistributedSetupError(f"JAX_PROCESS_ID={index} must be in [0, JAX_NUM_PROCESSES={num})")
        kwargs = {"coordinator_address": settings["JAX_COORDINATOR_ADDRESS"], "num_processes": num,
                  "process_id": index}
    shown = ", ".join(f"{k}={v}" for k, v in settings.items() if v is not None) or "auto-detected cluster"
    problem = (f"could not join the multi-process run within {timeout} s ({shown}): is the coordinator "
               "reachable and did all JAX_NUM_PROCESSES processes start?")
    if explicit and kwargs["process_id"] != 0:
        _wait_for_coordinator(kwargs["coordinator_address"], timeout, problem)
    # JAX aborts the process (no Python exception) when the peers do not all register in time:
    # say first which settings it was waiting with.
    print(f"fresh_rl: joining a multi-process run ({shown}); JAX stops this process if not all processes "
          f"join within {TIMEOUT_VARIABLE}={timeout} s", file=sys.stderr, flush=True)
    try:
        jax.distributed.initialize(initialization_timeout=timeout, **kwargs)
    except Exception as err:  # XLA raises its own runtime error types
        raise DistributedSetupError(f"{problem} ({type(err).__name__}: {err})") from err
    return True


def _wait_for_coordinator(address: str, timeout: int, problem: str) -> None:
    """Poll the coordinator's TCP port until it accepts (a clean error instead of JAX's abort)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise DistributedSetupError(f"JAX_COORDINATOR_ADDRESS must be host:port, got {address!r}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except OSError as err:
            if time.monotonic() > deadline:
                raise DistributedSetupError(f"{problem} (no coordinator listening at {address}: {err})") from None
            time.sleep(0.2)


def is_primary() -> bool:
    """Whether this process writes the run's files (process 0)."""
    return jax.process_index() == 0


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def launch_local(command: Sequence[str], num_processes: int, devices_per_process: int = 1, *,
                 timeout_s: float = 3600.0, env: Optional[Mapping[str, str]] = None,
                 on_start=None) -> list[str]:
    """Run ``command`` (an argv) as ``num_processes`` JAX processes on this machine.

    Each process gets ``JAX_COORDINATOR_ADDRESS=127.0.0.1:<free port>``, its
    ``JAX_PROCESS_ID``, ``JAX_NUM_PROCESSES``, ``JAX_PLATFORMS=cpu`` and
    ``devices_per_process`` simulated CPU devices. When one process fails the others are
    stopped and :class:`LaunchError` names it, its exit status and its last stderr lines; so
    does a launch running past ``timeout_s``. ``on_start(processes)`` is called with the
    ``subprocess.Popen`` objects once all have started. Returns every process's stdout.
    """
    require_int("num_processes", num_processes, 1)
    require_int("devices_per_process", devices_per_process, 1)
    address = f"127.0.0.1:{free_port()}"
    base = {**os.environ, **(env or {})}
    flags = " ".join(f for f in base.get("XLA_FLAGS", "").split()
                     if not f.startswith("--xla_force_host_platform_device_count"))
    processes, logs = [], []
    for index in range(num_processes):
        process_env = {**base, "JAX_COORDINATOR_ADDRESS": address, "JAX_NUM_PROCESSES": str(num_processes),
                       "JAX_PROCESS_ID": str(index), "JAX_PLATFORMS": "cpu",
                       "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={devices_per_process}".strip()}
        logs.append((tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")))  # pipes could fill and block
        processes.append(subprocess.Popen(list(command), env=process_env, stdout=logs[-1][0], stderr=logs[-1][1],
                                          text=True, start_new_session=True))
    if on_start is not None:
        on_start(processes)
    deadline = time.monotonic() + timeout_s
    try:
        while all(p.poll() in (None, 0) for p in processes) and any(p.poll() is None for p in processes):
            if time.monotonic() > deadline:
                raise LaunchError(f"the launch of {num_processes} processes ran past timeout_s={timeout_s} s: "
                                  f"{' '.join(command)}")
            time.sleep(0.2)
    finally:
        stopped = {i for i, p in enumerate(processes) if p.poll() is None}
        for i in stopped:
            os.killpg(processes[i].pid, signal.SIGKILL)
            processes[i].wait()
    outputs = []
    for out, err in logs:
        out.seek(0), err.seek(0)
        outputs.append((out.read(), err.read()))
        out.close(), err.close()
    failed = [i for i in range(num_processes) if processes[i].returncode != 0 and i not in stopped]
    if failed:
        # JAX aborts (SIGABRT) the survivors once a peer dies: name the process that failed first.
        failed.sort(key=lambda i: processes[i].returncode == -signal.SIGABRT)
        first = failed[0]
        others = "".join(f"; process {i} (pid {processes[i].pid}) {_describe_exit(processes[i].returncode)}"
                         for i in failed[1:])
        tail = "\n".join(outputs[first][1].strip().splitlines()[-15:])
        raise LaunchError(f"process {first} of {num_processes} (pid {processes[first].pid}) "
                          f"{_describe_exit(processes[first].returncode)}{others}; the other processes were "
                          f"stopped. Its last stderr lines:\n{tail}")
    return [stdout for stdout, _ in outputs]


__all__ = ["DistributedSetupError", "LaunchError", "free_port", "initialize_distributed", "is_primary",
           "launch_local"]
