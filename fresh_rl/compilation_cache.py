"""JAX's persistent compilation cache for experiments, the CLI and notebooks, and a compile meter.

A compiled XLA program is written to a cache folder and loaded, not recompiled, by the next
process that builds the same program (same code, shapes, static configuration and JAX
version). Traced hyperparameters (``fresh_rl.control.HyperParams`` and the LLM trainers'
pytrees) are program *inputs*, so a grid that differs only in them compiles once, and a rerun
of an experiment compiles nothing.

Folder, in order of precedence: the ``directory`` argument; ``$FRESH_RL_COMPILATION_CACHE_DIR``;
``$JAX_COMPILATION_CACHE_DIR`` (JAX's own variable, used by the test suite for a per-session
folder); ``$XDG_CACHE_HOME/fresh_rl/xla`` (default ``~/.cache/fresh_rl/xla``). Off with
``FRESH_RL_COMPILATION_CACHE=0`` or a script's ``--no-compilation-cache`` flag. Programs that
compile in under ``min_compile_seconds`` (default 1 s, JAX's default) are not stored.

Programs are kept in a subfolder per host CPU, ``<folder>/host-<fingerprint>``
(:func:`host_fingerprint`: a hash of the architecture, CPU model and instruction-set flags).
JAX's cache key holds the code, shapes, JAX version and device kind but not the host CPU's
features, and a CPU program is compiled for the features of the machine that built it; a cache
folder shared by machines with different CPUs (a home directory mounted on several hosts, a
copied cache) would otherwise load programs built for instructions this CPU may lack or tuned
for another CPU. (XLA:CPU's load-time warning "Target machine feature +prefer-no-gather is not
supported on the host machine" also appears for programs compiled on this very host: tuning
flags are missing from the host's detected feature list. It is not evidence of a foreign
program; the command-line entry points drop it from stderr, :func:`filter_cpu_cache_load_noise`.)

:class:`CompileMeter` sums the seconds JAX spends tracing, lowering and compiling (or loading
from the cache) in this process, from ``jax.monitoring`` events, so a script can report its
compile time apart from its run time. When ``$FRESH_RL_COMPILE_REPORT`` names a file,
:func:`enable_compilation_cache` starts a meter and writes its seconds there as JSON when the
process exits (how ``experiments/quickstart.py`` reports each part's compile time).
"""
from __future__ import annotations

import argparse
import atexit
import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

import jax

DIR_VARIABLE = "FRESH_RL_COMPILATION_CACHE_DIR"
SWITCH_VARIABLE = "FRESH_RL_COMPILATION_CACHE"
REPORT_VARIABLE = "FRESH_RL_COMPILE_REPORT"
_OFF = ("0", "false", "off", "no")


FAST_COMPILE_XLA_FLAGS = (("xla_backend_optimization_level", "0"), ("xla_cpu_use_fusion_emitters", "false"))
"""XLA:CPU's fastest-compiling settings, for runs that check results rather than speed (the test
suite, the device check's dry run): LLVM optimisation level 0 and the loop emitters instead of the
fusion emitters (``results/bench/README.md``: 21–32 % less CPU time than level 0 alone on the
suite's compile-bound files). They change the machine code, not the float32 semantics; fused
sums may round in another order, so a run differs from XLA's defaults in the last bits (and a
chaotic RL run drifts further, within its seed interval)."""


SHORT_RUN_XLA_FLAGS = (("xla_backend_optimization_level", "1"), ("xla_cpu_use_fusion_emitters", "false"))
"""XLA:CPU settings for short runs whose wall time is mostly compiling (the quickstart's parts):
LLVM optimisation level 1 and the loop emitters. On the quickstart's parts (2-core VM, cache off,
``results/bench/README.md``) they cut compiling by 20-45 % and the wall time by 20-35 %; level 0
compiles faster still but runs the parts 2-3× slower, a net loss. Long studies keep XLA's defaults."""


def with_fast_compile_flags(xla_flags: str, settings=FAST_COMPILE_XLA_FLAGS) -> str:
    """``xla_flags`` (an ``XLA_FLAGS`` value) with each of ``settings`` (:data:`FAST_COMPILE_XLA_FLAGS`
    or :data:`SHORT_RUN_XLA_FLAGS`) appended unless it already names that flag (a caller's choice
    is kept). Set it in ``os.environ["XLA_FLAGS"]`` before the process first uses a JAX backend."""
    for flag, value in settings:
        if flag not in xla_flags:
            xla_flags = f"{xla_flags} --{flag}={value}".strip()
    return xla_flags


def default_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fresh_rl" / "xla"


def cache_directory(directory=None) -> Optional[Path]:
    """The folder :func:`enable_compilation_cache` would use, or ``None`` when switched off."""
    if directory is None and os.environ.get(SWITCH_VARIABLE, "1").strip().lower() in _OFF:
        return None
    for candidate in (directory, os.environ.get(DIR_VARIABLE), os.environ.get("JAX_COMPILATION_CACHE_DIR")):
        if candidate:
            return Path(candidate).expanduser()
    return default_directory()


def _cpu_description() -> str:
    """The CPU model and flag lines of ``/proc/cpuinfo`` (Linux), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as info:
            lines = info.read().splitlines()
    except OSError:
        return platform.processor()
    fields = {}
    for line in lines:
        name, _, value = line.partition(":")
        name = name.strip()
        if name in ("model name", "flags", "Features", "CPU part") and name not in fields:
            fields[name] = " ".join(sorted(value.split())) if name in ("flags", "Features") \
                else value.strip()
    return "|".join(f"{k}={fields[k]}" for k in sorted(fields)) or platform.processor()


@functools.lru_cache(maxsize=None)
def host_fingerprint() -> str:
    """12 hex digits identifying this host's CPU for compiled programs: the SHA-256 of the
    machine architecture, the CPU model and its sorted instruction-set flags."""
    description = f"{platform.machine()}|{_cpu_description()}"
    return hashlib.sha256(description.encode()).hexdigest()[:12]


def host_cache_directory(directory=None) -> Optional[Path]:
    """This host's subfolder ``<cache_directory>/host-<host_fingerprint>``, where
    :func:`enable_compilation_cache` stores programs, or ``None`` when switched off."""
    folder = cache_directory(directory)
    return None if folder is None else folder / f"host-{host_fingerprint()}"


def enable_compilation_cache(directory=None, enabled: bool = True,
                             min_compile_seconds: float = 1.0) -> Optional[Path]:
    """Point JAX's persistent compilation cache at :func:`host_cache_directory`; returns that
    folder (``None`` when disabled by ``enabled=False`` or the environment)."""
    if os.environ.get(REPORT_VARIABLE):
        _report_at_exit(Path(os.environ[REPORT_VARIABLE]))
    folder = host_cache_directory(directory) if enabled else None
    if folder is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
    return folder


def add_compilation_cache_flag(parser: argparse.ArgumentParser) -> None:
    """``--no-compilation-cache`` (and ``--compilation-cache-dir DIR``) for a script's parser;
    pass the parsed namespace to :func:`enable_from_args`."""
    parser.add_argument("--no-compilation-cache", action="store_true",
                        help="compile everything afresh (default: JAX's persistent cache in "
                             f"${DIR_VARIABLE} or {default_directory()})")
    parser.add_argument("--compilation-cache-dir", default=None, metavar="DIR",
                        help="persistent compilation cache folder (overrides the environment)")


def enable_from_args(args: argparse.Namespace) -> Optional[Path]:
    return enable_compilation_cache(getattr(args, "compilation_cache_dir", None),
                                    enabled=not getattr(args, "no_compilation_cache", False))


# XLA:CPU logs two E-level lines from C++ (to file descriptor 2, out of reach of Python's
# logging) for every program loaded from the persistent cache: "cpu_aot_loader.cc:220] Loading
# XLA:CPU AOT result. Target machine feature +prefer-no-gather (+prefer-no-scatter) is not
# supported on the host machine ... SIGILL". A false alarm: those are LLVM tuning preferences,
# not instruction-set features, missing from the host's detected feature list, and the program
# loads and runs (https://github.com/jax-ml/jax/issues/38445,
# https://github.com/openxla/xla/issues/44565). The filter below drops exactly those lines.
# It runs as a separate process in its own session: output written just before a crash (a C++
# fatal error, faulthandler) still reaches the terminal, and Ctrl-C does not stop it.
_FILTER_SCRIPT = r"""
import os, re
HEADER = re.compile(rb"E\d{0,4}( [^\]]*)?")  # an unfinished glog E-line header: hold it
def noise(line):
    return b"cpu_aot_loader.cc" in line and (b"prefer-no-gather" in line or b"prefer-no-scatter" in line)
def write(data):
    while data:
        data = data[os.write(1, data):]
held, passing = b"", False
while True:
    data = os.read(0, 65536)
    if not data:
        break
    for part in data.splitlines(keepends=True):  # lines end at \n or \r (progress lines)
        ended = part.endswith((b"\n", b"\r"))
        if passing:
            write(part)
        else:
            held += part
            if ended:
                if not noise(held):
                    write(held)
                held = b""
            elif not HEADER.fullmatch(held) and b"cpu_aot_loader.cc" not in held:
                write(held)  # not a candidate: stream the rest of the line as it comes
                held, passing = b"", True
        passing = passing and not ended
write(held)
"""
_noise_filter: list = []  # the running filter process, once installed


def filter_cpu_cache_load_noise(folder: Optional[Path]) -> bool:
    """Drop XLA:CPU's false "+prefer-no-gather/+prefer-no-scatter is not supported on the host
    machine" lines (both words in one line) from this process's file descriptor 2; every other
    byte is forwarded unchanged. Installed only when the persistent cache ``folder`` is on and
    the default backend is the CPU; a no-op without a file descriptor 2. Subprocesses inherit
    the filtered descriptor; at exit it is restored and the filter drained. Call it explicitly
    (the command-line entry points do), never at import time: test runners capture fd 2."""
    if _noise_filter or folder is None or jax.default_backend() != "cpu":
        return bool(_noise_filter)
    try:
        original = os.dup(2)
    except OSError:
        return False
    read_end, write_end = os.pipe()
    process = subprocess.Popen([sys.executable, "-I", "-c", _FILTER_SCRIPT], stdin=read_end,
                               stdout=original, stderr=original, start_new_session=True)
    os.close(read_end)
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    _noise_filter.append(process)

    def restore() -> None:
        sys.stderr.flush()
        os.dup2(original, 2)  # the pipe's last write end here: the filter drains and ends
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # a subprocess still holds the pipe
            pass

    atexit.register(restore)
    return True


_COMPILE_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
    "/jax/compilation_cache/cache_retrieval_time_sec": "cache_load",
}


class CompileMeter:
    """Seconds spent tracing, lowering, compiling and loading cached programs since creation.

    ``meter.seconds`` → ``{"trace", "lower", "compile", "cache_load"}``; ``meter.total``.
    One process-wide listener feeds every meter (``jax.monitoring`` cannot unregister one).
    """

    _meters: list["CompileMeter"] = []
    _lock = threading.Lock()
    _installed = False

    def __init__(self):
        self.seconds = dict.fromkeys(_COMPILE_EVENTS.values(), 0.0)
        with CompileMeter._lock:
            if not CompileMeter._installed:
                jax.monitoring.register_event_duration_secs_listener(CompileMeter._record)
                CompileMeter._installed = True
            CompileMeter._meters.append(self)

    @staticmethod
    def _record(event: str, duration: float, **_) -> None:
        name = _COMPILE_EVENTS.get(event)
        if name is not None:
            for meter in CompileMeter._meters:
                meter.seconds[name] += duration

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def close(self) -> None:
        with CompileMeter._lock:
            if self in CompileMeter._meters:
                CompileMeter._meters.remove(self)


_reporting: list[Path] = []


def _report_at_exit(path: Path) -> None:
    if path in _reporting:
        return
    _reporting.append(path)
    meter = CompileMeter()

    def write() -> None:
        from fresh_rl.provenance import write_atomic

        write_atomic(path, json.dumps({"total": meter.total, **meter.seconds}) + "\n")

    atexit.register(write)


__all__ = ["CompileMeter", "DIR_VARIABLE", "FAST_COMPILE_XLA_FLAGS", "REPORT_VARIABLE", "SHORT_RUN_XLA_FLAGS",
           "SWITCH_VARIABLE", "add_compilation_cache_flag",
           "cache_directory", "default_directory", "enable_compilation_cache", "enable_from_args",
           "filter_cpu_cache_load_noise",
           "host_cache_directory", "host_fingerprint", "with_fast_compile_flags"]
