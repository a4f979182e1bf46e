"""The ``fresh_rl.checked`` switch: off, traced code is unchanged (no checkify op in the
jaxpr); on, every building block's traced range check fires; the validation helpers accept
any concrete scalar kind with the same ranges."""
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import fresh_rl
from fresh_rl import cli
from fresh_rl.corrections import generalized_advantage_estimation, vaco_policy_loss
from fresh_rl.replay import ReplayConfig, make_trajectory_buffer
from fresh_rl.sweep import run_loop, run_sharded
from fresh_rl.validation import check_in_range, checks_enabled, require_in_range, require_int
from test_bad_inputs import TINY  # the tiny `fresh-rl train` options (5 iterations)


def _step(delta, lambda_, beta, state, key, buffer):
    """VACO loss + GAE + a buffer sample: the benchmark's program."""
    x = jnp.zeros((2, 4))
    loss, _ = vaco_policy_loss(x, x, x, x, delta=delta)
    gae = generalized_advantage_estimation(x, x, x, x + 0.9, lambda_=lambda_)
    sample = buffer.sample(state, key, beta)
    return loss + gae.advantages.sum() + sample.importance_weights.sum()


def _setup():
    buffer = make_trajectory_buffer(ReplayConfig(capacity=8, sample_batch_size=4))
    state = buffer.add(buffer.init(jnp.zeros(())), jnp.zeros(6), 0)
    return buffer, state


CHECK_OP = re.compile(r"\bcheck\[")  # checkify's primitive in a printed jaxpr


def test_switch_off_emits_no_checkify_op_and_on_does():
    """One function object throughout: JAX caches its trace, so this also shows that the
    block re-traces on entry and that its checked trace does not leak out."""
    buffer, state = _setup()
    fn = lambda d, l, b, s: _step(d, l, b, s, jax.random.key(0), buffer)
    off = str(jax.make_jaxpr(fn)(0.5, 0.9, 0.4, state))
    assert not CHECK_OP.search(off)
    with fresh_rl.checked():
        assert checks_enabled()
        on = str(jax.make_jaxpr(fn)(0.5, 0.9, 0.4, state))
    assert not checks_enabled()
    assert len(CHECK_OP.findall(on)) >= 3  # δ, λ, β at least
    assert str(jax.make_jaxpr(fn)(0.5, 0.9, 0.4, state)) == off


def test_checked_function_raises_on_bad_and_returns_on_good_values():
    buffer, state = _setup()
    step = fresh_rl.checked(lambda d, l, b, s: _step(d, l, b, s, jax.random.key(0), buffer))
    assert np.isfinite(step(jnp.float32(0.5), jnp.float32(0.9), jnp.float32(0.4), state))
    for args, field in [((-1.0, 0.9, 0.4), "delta"), ((0.5, math.nan, 0.4), "lambda_"),
                        ((0.5, 0.9, 1.5), "importance_exponent")]:
        with pytest.raises(checkify.JaxRuntimeError, match=field):
            step(*map(jnp.float32, args), state)


@pytest.mark.parametrize("value", [1.5, np.float32(1.5), np.float64(1.5), jnp.float32(1.5),
                                   jnp.asarray(1.5, jnp.bfloat16), math.nan, np.float32(math.nan)])
def test_every_concrete_scalar_kind_is_range_checked(value):
    with pytest.raises(ValueError, match=r"x must be in \[0\.0, 1\.0\], got (1\.5|nan)"):
        require_in_range("x", value, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"x must be in \[0\.0, 1\.0\]"):
        check_in_range("x", value, 0.0, 1.0)


def test_integers_of_any_kind_pass_and_bools_or_fractions_do_not():
    for value in (3, np.int64(3), np.uint8(3), jnp.int32(3)):
        assert require_int("n", value, 1) == 3 and type(require_int("n", value, 1)) is int
    for value in (True, np.bool_(True), 3.0, np.float32(3.0), "3", None, jnp.ones(2, jnp.int32)):
        with pytest.raises(ValueError, match=r"n must be an integer in \[1, inf\]"):
            require_int("n", value, 1)
    with pytest.raises(ValueError, match=r"x must be a number in \[0\.0, 1\.0\], got True"):
        require_in_range("x", True, 0.0, 1.0)


def _vaco_point(key, delta):
    """A sweep point whose δ comes traced from the grid (a bad one is visible only inside)."""
    x = jnp.zeros((2, 4))
    return vaco_policy_loss(x, x, x, x, delta=delta)[0]


def test_sweep_and_loop_programs_are_checkified_only_inside_the_switch(monkeypatch):
    """Off: ``run_sharded`` compiles the plain program (no error outputs, no check op) and a bad δ
    takes the safe fallback; on: the checkified one, and ``run_sharded``/``run_loop`` raise."""
    traced = []
    lower = jax.stages.Traced.lower
    monkeypatch.setattr(jax.stages.Traced, "lower",
                        lambda self, *a, **k: traced.append(self.jaxpr) or lower(self, *a, **k))
    keys, deltas = jnp.zeros((2, 2), jnp.uint32), jnp.asarray([0.1, -1.0])
    assert np.all(np.isfinite(run_sharded(_vaco_point, keys, deltas)))
    (off,) = traced
    assert not CHECK_OP.search(str(off)) and len(off.jaxpr.outvars) == 1
    with fresh_rl.checked():
        with pytest.raises(checkify.JaxRuntimeError, match=r"delta must be in \(0\.0, inf"):
            run_sharded(_vaco_point, keys, deltas)
        assert len(traced[1].jaxpr.outvars) > 1  # the error's outputs
        step = lambda s, k: (s + 1, {"loss": _vaco_point(k, 1.0 - s)})  # δ ≤ 0 from step 1
        for steps_per_call in (1, 3):
            with pytest.raises(checkify.JaxRuntimeError, match="delta must be in"):
                run_loop(step, jnp.float32(0), jax.random.key_data(jax.random.key(0)), 3,
                         steps_per_call=steps_per_call)
    _, history = run_loop(step, jnp.float32(0), jax.random.key_data(jax.random.key(0)), 3, steps_per_call=3)
    assert history["loss"].shape == (3,)


def test_cli_checked_train_runs_and_a_failed_check_is_one_line(tmp_path, monkeypatch):
    cache = ["--compilation-cache-dir", jax.config.jax_compilation_cache_dir]
    cli.main(["train", *TINY, "--method", "vaco", "--checked", "--out", str(tmp_path / "run"), *cache])
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 5
    # the CLI range-checks every value before tracing; a program with a traced bad δ stands in
    monkeypatch.setattr(cli, "cmd_sweep", lambda args: run_sharded(_vaco_point, jnp.zeros((1, 2), jnp.uint32),
                                                                     jnp.asarray([-1.0])))
    with pytest.raises(SystemExit, match=r"^fresh-rl: a traced check failed: delta must be in \(0\.0, inf\]"
                       r"[^\n]*$"):
        cli.main(["sweep", "--checked", *cache])
