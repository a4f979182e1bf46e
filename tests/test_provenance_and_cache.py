"""fresh_rl.provenance (commit stamp, the one CSV writer) and fresh_rl.compilation_cache (a second
process loads what the first compiled; the switch and the folder precedence; the compile meter)."""
import csv
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fresh_rl import compilation_cache, provenance

ROOT = Path(__file__).resolve().parents[1]


def test_write_csv_takes_the_union_of_columns_in_first_seen_order(tmp_path):
    path = tmp_path / "sub" / "table.csv"
    provenance.write_csv(path, [{"a": 1, "b": 2}, {"b": 3, "c": 4}])
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows == [["a", "b", "c"], ["1", "2", ""], ["", "3", "4"]]
    assert not list(tmp_path.rglob("*.tmp"))  # written through a renamed temporary file
    with pytest.raises(ValueError, match="no rows"):
        provenance.write_csv(path, [])


def test_read_csv_reads_back_what_write_csv_wrote_and_a_missing_file_only_when_allowed(tmp_path):
    path = tmp_path / "table.csv"
    provenance.write_csv(path, [{"a": 1, "b": "x, y"}, {"b": 3, "c": 4.5}])
    assert provenance.read_csv(path) == [{"a": "1", "b": "x, y", "c": ""}, {"a": "", "b": "3", "c": "4.5"}]
    assert provenance.read_csv(tmp_path / "none.csv", missing_ok=True) == []
    with pytest.raises(FileNotFoundError):
        provenance.read_csv(tmp_path / "none.csv")


def test_replace_label_rows_reruns_one_label_and_keeps_the_others(tmp_path):
    path = tmp_path / "bench.csv"
    provenance.replace_label_rows(path, "before", [{"label": "before", "x": 1}])
    provenance.replace_label_rows(path, "after", [{"label": "after", "x": 2}])
    rows = provenance.replace_label_rows(path, "before", [{"label": "before", "x": 3},
                                                          {"label": "before", "x": 4}])
    with open(path, newline="") as f:
        on_disk = list(csv.DictReader(f))
    assert on_disk == [{"label": "after", "x": "2"}, {"label": "before", "x": "3"},
                       {"label": "before", "x": "4"}]
    assert [{k: str(v) for k, v in r.items()} for r in rows] == on_disk  # what was written


def test_measure_at_revision_imports_the_package_of_that_revision(tmp_path):
    """The child imports fresh_rl from the archived revision, not from this checkout."""
    script = tmp_path / "probe.py"
    script.write_text("import json, fresh_rl\nprint(json.dumps({'file': fresh_rl.__file__}))\n")
    rows, commit = provenance.measure_at_revision(script, "HEAD")
    assert commit == provenance.git_commit().removesuffix("+dirty")
    assert len(rows) == 1 and not rows[0]["file"].startswith(str(ROOT))


def test_a_commit_is_named_by_the_same_digits_whatever_git_would_abbreviate_to(monkeypatch):
    """git's own short form grows with the checkout's object count (7 digits in one clone of a
    history, 8 in another) and follows core.abbrev; a committed table that names a commit must
    read the same wherever it is rebuilt."""
    full = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    data = subprocess.run(["git", "log", "-1", "--format=%H", "--", "README.md"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()
    for abbrev in ("7", "16"):
        monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
        monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.abbrev")
        monkeypatch.setenv("GIT_CONFIG_VALUE_0", abbrev)
        assert provenance.short_commit() == full[:provenance.COMMIT_DIGITS]
        assert provenance.git_commit().removesuffix("+dirty") == full[:provenance.COMMIT_DIGITS]
        assert provenance.last_commit(["README.md"]).removesuffix("+modified") == \
            data[:provenance.COMMIT_DIGITS]
    assert provenance.short_commit("no-such-revision") is None


def test_provenance_names_command_commit_machine_and_wall_time():
    info = provenance.provenance(command="python experiments/x.py --scale ci", started=0.0)
    assert info["command"] == "python experiments/x.py --scale ci"
    assert re.fullmatch(r"[0-9a-f]{10}(\+dirty)?|unknown", info["commit"]), info["commit"]
    assert "CPUs" in info["machine"] and info["wall_seconds"] > 0
    line = provenance.provenance_line(info)
    assert info["commit"] in line and "wall time" in line
    assert provenance.command_line([str(ROOT / "experiments" / "x.py"), "--out", "a b"]) == \
        "python experiments/x.py --out 'a b'"


def test_only_code_changes_mark_the_commit_dirty(tmp_path, monkeypatch):
    """Rewritten result tables (results/) are outputs: they leave the stamp clean; an edited
    source file marks it ``+dirty``."""
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table.csv").write_text("a\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.setattr(provenance, "REPOSITORY_ROOT", tmp_path)
    (tmp_path / "results" / "table.csv").write_text("b\n")
    assert not provenance.git_commit().endswith("+dirty")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance.git_commit().endswith("+dirty")


def test_provenance_stamps_the_commit_the_run_started_from(monkeypatch):
    """A run that outlives a commit keeps the commit of the code it loaded and says where HEAD
    moved."""
    monkeypatch.setattr(provenance, "git_commit", lambda: provenance.COMMIT_AT_START)
    assert "commit_at_end" not in provenance.provenance()  # HEAD did not move
    monkeypatch.setattr(provenance, "git_commit", lambda: "0123abc")
    info = provenance.provenance(started=0.0)
    assert info["commit"] == provenance.COMMIT_AT_START and info["commit_at_end"] == "0123abc"
    assert "HEAD was 0123abc when it ended" in provenance.provenance_line(info)


_CHILD = textwrap.dedent("""
    import json, os, sys
    from fresh_rl import compilation_cache
    from fresh_rl.compilation_cache import CompileMeter, enable_compilation_cache
    if os.environ.get("TEST_CPU_DESCRIPTION"):  # stands in for another host's CPU
        compilation_cache._cpu_description = lambda: os.environ["TEST_CPU_DESCRIPTION"]
    folder = enable_compilation_cache(min_compile_seconds=0)
    import jax, jax.numpy as jnp
    meter = CompileMeter()
    jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((48, 48))).block_until_ready()
    print(json.dumps({"folder": str(folder), **meter.seconds}))
""")


def _child(env_extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_COMPILATION", "FRESH_RL_", "TEST_CPU_DESCRIPTION"))}
    env.update(env_extra, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_the_program_the_first_compiled(tmp_path):
    folder = tmp_path / "xla"
    first = _child({compilation_cache.DIR_VARIABLE: str(folder)})
    host_folder = folder / f"host-{compilation_cache.host_fingerprint()}"
    assert first["folder"] == str(host_folder) and first["cache_load"] == 0.0 and first["compile"] > 0
    assert any(host_folder.iterdir())
    second = _child({compilation_cache.DIR_VARIABLE: str(folder)})
    assert second["cache_load"] > 0
    # Another CPU sharing the folder compiles its own programs in its own subfolder.
    other = _child({compilation_cache.DIR_VARIABLE: str(folder),
                    "TEST_CPU_DESCRIPTION": "model name=Other CPU|flags=sse2"})
    assert other["cache_load"] == 0.0 and other["compile"] > 0
    assert Path(other["folder"]).parent == folder and Path(other["folder"]) != host_folder
    assert sorted(p.name for p in folder.iterdir()) == sorted([host_folder.name, Path(other["folder"]).name])
    off = _child({compilation_cache.DIR_VARIABLE: str(folder), compilation_cache.SWITCH_VARIABLE: "0"})
    assert off["folder"] == "None" and off["cache_load"] == 0.0


def test_host_fingerprint_tracks_the_cpu_description(monkeypatch):
    assert re.fullmatch(r"[0-9a-f]{12}", compilation_cache.host_fingerprint())
    fingerprints = []
    for description in ("model name=A|flags=avx2 sse2", "model name=A|flags=avx512f sse2",
                        "model name=A|flags=avx2 sse2"):
        monkeypatch.setattr(compilation_cache, "_cpu_description", lambda d=description: d)
        compilation_cache.host_fingerprint.cache_clear()
        fingerprints.append(compilation_cache.host_fingerprint())
    compilation_cache.host_fingerprint.cache_clear()
    assert fingerprints[0] != fingerprints[1] and fingerprints[0] == fingerprints[2]


def test_cpu_description_sorts_flags_and_names_the_model():
    description = compilation_cache._cpu_description()
    assert description
    if Path("/proc/cpuinfo").exists() and "flags=" in description:
        flags = description.split("flags=")[1].split("|")[0].split()
        assert flags == sorted(flags) and "model name=" in description


def test_cache_folder_precedence(monkeypatch, tmp_path):
    for name in (compilation_cache.DIR_VARIABLE, compilation_cache.SWITCH_VARIABLE, "JAX_COMPILATION_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compilation_cache.cache_directory() == tmp_path / "xdg" / "fresh_rl" / "xla"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert compilation_cache.cache_directory() == tmp_path / "jax"
    monkeypatch.setenv(compilation_cache.DIR_VARIABLE, str(tmp_path / "ours"))
    assert compilation_cache.cache_directory() == tmp_path / "ours"
    assert compilation_cache.cache_directory(tmp_path / "arg") == tmp_path / "arg"
    assert compilation_cache.host_cache_directory() == \
        tmp_path / "ours" / f"host-{compilation_cache.host_fingerprint()}"
    monkeypatch.setenv(compilation_cache.SWITCH_VARIABLE, "off")
    assert compilation_cache.cache_directory() is None
    assert compilation_cache.host_cache_directory() is None


_NOISY_CHILD = textwrap.dedent("""
    import os, sys
    import jax, jax.numpy as jnp
    from fresh_rl.compilation_cache import enable_compilation_cache, filter_cpu_cache_load_noise
    folder = enable_compilation_cache(sys.argv[1], min_compile_seconds=0)
    jax.jit(lambda x: jnp.sin(x) * 2)(jnp.ones(3)).block_until_ready()  # unfiltered: may log the noise
    assert filter_cpu_cache_load_noise(folder)
    os.write(2, b"filter installed\\n")
    jax.jit(lambda x: jnp.cos(x) * 3)(jnp.ones(3)).block_until_ready()  # loaded from the cache on run 2
    os.write(2, b"E1205 00:00:00.000000 1 cpu_aot_loader.cc:220] Target machine feature +prefer-no-scatter "
                b"is not supported on the host machine\\n")
    os.write(2, b"E1205 00:00:00.000000 1 other.cc:1] kept: an unrelated C++ error\\n")
    os.write(2, b"E1205 00:00:00.000000 1 cpu_aot_loader.cc:9] kept: another loader line\\n")
    os.write(2, b"\\rkept: a progress line without newline")
    if sys.argv[2] == "abort":
        os.abort()  # no atexit: the filter process still forwards what was written
""")


@pytest.mark.parametrize("ending", ["exit", "abort"])
def test_cache_load_noise_is_dropped_from_fd_2_and_nothing_else(tmp_path, ending):
    """Run 1 compiles into the cache, run 2 loads from it (XLA:CPU's false "+prefer-no-gather
    is not supported" lines); after the filter is installed only those lines are dropped, also
    when the process dies without running its exit handlers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION", "FRESH_RL_"))}
    env.update(PYTHONPATH=str(ROOT))
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _NOISY_CHILD, str(tmp_path / "xla"), ending], env=env,
                             capture_output=True, timeout=300)  # bytes: "\r" kept
    stderr = out.stderr.decode()
    assert out.returncode == (0 if ending == "exit" else -6), stderr[-2000:]
    after = stderr.split("filter installed\n", 1)[1]
    assert "prefer-no-" not in after
    for kept in ("other.cc:1] kept: an unrelated C++ error\n", "cpu_aot_loader.cc:9] kept: another loader line\n"):
        assert kept in after
    assert after.endswith("\rkept: a progress line without newline")


def test_fast_compile_flags_are_appended_once_and_keep_the_callers_choice():
    flags = compilation_cache.with_fast_compile_flags("--xla_force_host_platform_device_count=8")
    assert flags.split() == ["--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0",
                             "--xla_cpu_use_fusion_emitters=false"]
    assert compilation_cache.with_fast_compile_flags(flags) == flags  # idempotent
    chosen = compilation_cache.with_fast_compile_flags("--xla_backend_optimization_level=2")
    assert "--xla_backend_optimization_level=2" in chosen and "level=0" not in chosen
    assert os.environ["XLA_FLAGS"] == compilation_cache.with_fast_compile_flags(os.environ["XLA_FLAGS"])  # conftest set them
    short = compilation_cache.with_fast_compile_flags("", compilation_cache.SHORT_RUN_XLA_FLAGS)
    assert short.split() == ["--xla_backend_optimization_level=1", "--xla_cpu_use_fusion_emitters=false"]
