"""LLM sharding (fresh_rl.llm.sharding): one RL iteration of the tiny preset sharded over a
(data=2, fsdp=2, tensor=2) mesh of 8 simulated CPU devices equals the unsharded iteration in
params, optimizer state and metrics; every parameter leaf is laid out by its spec with shards
of the split shapes; bad mesh sizes raise naming the field; the spec rules mirror parameter
paths into the optimizer state and the version ring, and fall back to replication.

The 8-device part runs this file as a script in a subprocess (XLA_FLAGS must be set before
jax is imported; the pytest process has 1 device), as tests/test_multihost.py does."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm import sharding, trainer
from fresh_rl.llm.model import init_params, preset
from fresh_rl.llm.presets import WARM_START
from fresh_rl.llm.tasks import ArithmeticTask
from fresh_rl.llm.trainer import RLConfig, init_train_state, make_iteration, stack_rows
from fresh_rl.llm.warm_start import restore_params

ROOT = Path(__file__).resolve().parents[1]
MODEL = preset("tiny")
ENV = ArithmeticTask(digits=1, steps=2)
# REINFORCE++ normalises over the batch, so the advantages are non-zero whenever one return
# differs (GRPO on 2 groups of 4 is often all zero, and the update then moves nothing)
CONFIG = RLConfig(estimator="reinforce_pp", num_groups=2, group_size=4, learning_rate=1e-4,
                  loss="decoupled")
MESH = sharding.MeshConfig(data=2, fsdp=2, tensor=2)


def _flat(tree) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(path): np.asarray(x)
            for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def _split_shape(shape, spec, config: sharding.MeshConfig):
    spec = tuple(spec) + (None,) * (len(shape) - len(spec))
    return tuple(n // config.size(axes) for n, axes in zip(shape, spec))


def float32_sampler():
    """Runs the trainer's sampler in float32 (this child process only). The bf16 sampler's
    row-parallel and fsdp-split contractions add bf16 partial sums in another order than the
    unsharded program, which moves logits by an ulp and flips a sampled token wherever two
    candidates tie to that precision; in float32 the same program agrees to ~1e-6, so the
    comparison tests the sharding rather than bf16 rounding."""
    sampling_config = trainer.sampling_config
    trainer.sampling_config = lambda config, env: dataclasses.replace(
        sampling_config(config, env), dtype="float32")


def child(out: str) -> None:
    """8 devices: the unsharded and the sharded iteration, the layout of every parameter."""
    assert jax.device_count() == 8, jax.devices()
    float32_sampler()
    params = restore_params(WARM_START, MODEL)
    key = jax.random.PRNGKey(7)
    plain_state, plain_metrics = make_iteration(CONFIG, ENV, MODEL)(
        init_train_state(CONFIG, params), key)
    mesh = sharding.make_mesh(MESH)
    state = sharding.shard_state(init_train_state(CONFIG, params), mesh)
    layout = {}
    for name, leaf in jax.tree_util.tree_leaves_with_path(state.params):
        layout[jax.tree_util.keystr(name)] = {
            "spec": repr(leaf.sharding.spec), "shape": leaf.shape,
            "shards": sorted({s.data.shape for s in leaf.addressable_shards}),
            "num_shards": len(leaf.addressable_shards)}
    step = sharding.sharded_iteration(CONFIG, ENV, MODEL, mesh, state)
    state, metrics = step(state, key)
    out_specs = {jax.tree_util.keystr(p): repr(x.sharding.spec)
                 for p, x in jax.tree_util.tree_leaves_with_path(state)}
    ring = sharding.shard_state(
        ap.init_state(CONFIG, ap.AsyncConfig(staleness_window=2), params), mesh).ring
    ring_kernel = ring.params["layers"]["self_attn"]["q_proj"]["kernel"]
    ring_layout = {"spec": repr(ring_kernel.sharding.spec),
                   "shards": sorted({s.data.shape for s in ring_kernel.addressable_shards})}
    one_mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])
    one = sharding.shard_state(init_train_state(CONFIG, params), one_mesh)
    one = sharding.sharded_iteration(CONFIG, ENV, MODEL, one_mesh, one)(one, key)
    bad = []
    for config in (sharding.MeshConfig(data=3, fsdp=1, tensor=2),
                   sharding.MeshConfig(data=2, fsdp=2, tensor=1)):
        try:
            sharding.make_mesh(config)
        except ValueError as error:
            bad.append(str(error))
    np.savez(out, **{"plain" + k: v for k, v in _flat((plain_state, plain_metrics)).items()},
             **{"sharded" + k: v for k, v in _flat((state, metrics)).items()},
             **{"one" + k: v for k, v in _flat(one).items()})
    Path(out).with_suffix(".json").write_text(json.dumps(
        {"layout": layout, "out_specs": out_specs, "bad": bad, "ring": ring_layout}))


@pytest.fixture(scope="module")
def eight_devices(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharding") / "result.npz"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"}
    done = subprocess.run([sys.executable, __file__, str(out)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out), json.loads(out.with_suffix(".json").read_text())


# optax.adamw's defaults (trainer.make_optimizer passes only the learning rate and weight decay)
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8
FLOAT32_UNIT = 2.0 ** -24  # unit roundoff u of float32
# Moments: the gradient entries are float32 sums that the sharded program reduces in another
# order (over data shards, fsdp shards and the tensor-split contractions). Reordering an n-term
# float32 sum moves it by a random walk of ≈ √n · u · (term size); the largest contraction here
# is n ≤ 8 sequences × 64 tokens × 384 features ≈ 2·10^5 terms, √n · u ≈ 3·10^-5, so we allow
# 1e-4 of the leaf's largest entry (terms are no larger than it up to cancellation).
MOMENT_RTOL_OF_MAX = 1e-4


def _adam_direction(mu: np.ndarray, nu: np.ndarray, count: int) -> np.ndarray:
    """AdamW's step direction m̂ / (√v̂ + ε) from the stored moments, in float64 after the bias
    corrections 1 − β^t, which optax computes in float32 (float32(0.999) is 1.3e-5 of 1 − β2
    away from 0.999, a 6e-6 relative shift of d: far above the rounding allowed below)."""
    b1_correction = np.float64(1 - np.float32(ADAM_B1) ** np.int32(count))
    b2_correction = np.float64(1 - np.float32(ADAM_B2) ** np.int32(count))
    mu, nu = mu.astype(np.float64), nu.astype(np.float64)
    return (mu / b1_correction) / (np.sqrt(nu / b2_correction) + ADAM_EPS)


def test_sharded_iteration_equals_the_unsharded_iteration(eight_devices):
    """The only input of the update that sharding can change is the gradient, i.e. AdamW's
    moments; everything downstream is elementwise. So: (1) the moments and metrics agree to the
    reordering error of float32 sums; (2) in each run, every parameter equals θ0 − lr · d(its own
    moments) to the float32 rounding of that elementwise update; (3) hence the parameter gap
    between the runs is bounded by lr · |d_sharded − d_plain| plus that rounding. Bounding the
    gap by a fixed fraction of lr would be wrong: where a gradient entry is ≈ 0, d = g/(|g| + ε)
    flips sign on one rounding and the entry moves by up to 2 lr."""
    arrays, _ = eight_devices
    plain = {k[len("plain"):]: arrays[k] for k in arrays.files if k.startswith("plain")}
    sharded = {k[len("sharded"):]: arrays[k] for k in arrays.files if k.startswith("sharded")}
    assert plain.keys() == sharded.keys() and len(plain) > 40
    start = _flat(restore_params(WARM_START, MODEL))
    lr = CONFIG.learning_rate
    count = int(plain["[0].opt_state[1].inner_state[0].count"])
    assert count == 1 and int(sharded["[0].opt_state[1].inner_state[0].count"]) == 1
    assert CONFIG.weight_decay == 0.0  # (2) has no decay term
    moved = 0
    for name, value in plain.items():
        if name.startswith("[0].params"):
            leaf = name[len("[0].params"):]
            adam = "[0].opt_state[1].inner_state[0]"
            mu, nu = f"{adam}.mu{leaf}", f"{adam}.nu{leaf}"
            theta0 = start[leaf].astype(np.float64)
            # float32 evaluation of d (≤ 4 roundings, |d| ≤ 1), of lr·d and of θ + update: ≤ 6u·lr
            # plus half an ulp of the result; we allow twice that.
            rounding = 2 * (6 * FLOAT32_UNIT * lr + np.spacing(np.abs(value).astype(np.float32)))
            directions = {}
            for run in (plain, sharded):
                directions[id(run)] = _adam_direction(run[mu], run[nu], count)
                expected = theta0 - lr * directions[id(run)]
                assert np.all(np.abs(run[name] - expected) <= rounding), name
            bound = lr * np.abs(directions[id(sharded)] - directions[id(plain)]) + 2 * rounding
            assert np.all(np.abs(sharded[name] - value) <= bound), name
            moved += np.abs(value - start[leaf]).max() > lr / 2
        elif name.startswith("[0]"):
            np.testing.assert_allclose(sharded[name], value, rtol=0,
                                       atol=MOMENT_RTOL_OF_MAX * np.abs(value).max(), err_msg=name)
        else:  # metrics: scalar means and sums over the batch, the same reordering argument
            np.testing.assert_allclose(sharded[name], value, rtol=MOMENT_RTOL_OF_MAX,
                                       atol=MOMENT_RTOL_OF_MAX, err_msg=name)
    assert moved >= 10  # the update moved the weights, so the comparison is not vacuous
    assert plain["[1]['grad_norm']"] > 0.1


def test_every_parameter_is_laid_out_by_its_spec(eight_devices):
    _, result = eight_devices
    params = jax.eval_shape(lambda: init_params(MODEL, jax.random.PRNGKey(0)))
    specs = sharding.param_specs(params, MESH)
    expected = {jax.tree_util.keystr(p): (spec, leaf.shape) for (p, spec), leaf in zip(
        jax.tree_util.tree_leaves_with_path(specs, is_leaf=lambda x: isinstance(x, P)),
        jax.tree_util.tree_leaves(params))}
    assert expected.keys() == result["layout"].keys()
    split = 0
    for name, (spec, shape) in expected.items():
        got = result["layout"][name]
        assert got["spec"] == repr(spec), name
        assert got["num_shards"] == 8
        assert got["shards"] == [list(_split_shape(shape, spec, MESH))], name
        split += any(axes is not None for axes in spec)
    assert split == 11  # embedding, 7 kernels, 3 biases of the 14 leaves; the 3 norms replicated
    # the iteration's output state keeps the input layout (out_shardings)
    for name, (spec, _) in expected.items():
        assert result["out_specs"][f".params{name}"] == repr(spec), name
    # the async version ring [K=3, L, H, heads·D]: ring and layer axes whole on every device
    assert result["ring"] == {"spec": repr(P(None, None, "fsdp", "tensor")),
                              "shards": [[3, 4, 64, 64]]}


def test_bad_mesh_sizes_raise_naming_the_fields(eight_devices):
    _, result = eight_devices
    assert len(result["bad"]) == 2
    assert all("MeshConfig.data × MeshConfig.fsdp × MeshConfig.tensor" in e
               and "device count 8" in e for e in result["bad"])
    with pytest.raises(ValueError, match="must equal the device count 1"):
        sharding.make_mesh(sharding.MeshConfig(data=2))
    for field in ("data", "fsdp", "tensor"):
        with pytest.raises(ValueError, match=f"MeshConfig.{field}"):
            sharding.MeshConfig(**{field: 0})


def test_optimizer_state_and_version_ring_follow_the_parameter_specs():
    # jitted: an eager init dispatches the scanned model's ops one by one (~2.5× the time)
    params = jax.jit(init_params, static_argnums=0)(MODEL, jax.random.PRNGKey(0))
    specs = sharding.param_specs(
        ap.init_state(CONFIG, ap.AsyncConfig(staleness_window=2), params), MESH)
    by_param = _flat(jax.tree_util.tree_map(repr, sharding.param_specs(params, MESH),
                                            is_leaf=lambda x: isinstance(x, P)))
    assert _flat(jax.tree_util.tree_map(repr, specs.train.params,
                                        is_leaf=lambda x: isinstance(x, P))) == by_param
    # chain(clip, inject_hyperparams(adamw)): adamw's scale_by_adam state and its learning rate
    adam = specs.train.opt_state[1].inner_state[0]
    for moment in (adam.mu, adam.nu):
        assert _flat(jax.tree_util.tree_map(repr, moment,
                                            is_leaf=lambda x: isinstance(x, P))) == by_param
    assert adam.count == P() and specs.train.opt_state[1].hyperparams["learning_rate"] == P()
    ring = specs.ring.params["layers"]["self_attn"]["q_proj"]["kernel"]
    assert ring == P(None, None, "fsdp", "tensor")  # [K, L, H, heads·D]: ring and layer unsplit
    assert specs.ring.versions == P(None) and specs.train.step == P()


def test_indivisible_dimensions_fall_back_to_replication():
    config = sharding.MeshConfig(data=2, fsdp=4, tensor=4)
    odd = dataclasses.replace(MODEL, vocab_size=130, num_key_value_heads=1,
                              num_attention_heads=2)  # V % 4 != 0; 1 KV head
    params = jax.eval_shape(lambda: init_params(odd, jax.random.PRNGKey(0)))
    specs = sharding.param_specs(params, config)
    assert specs["embed_tokens"]["embedding"] == P(None, "fsdp")
    assert specs["layers"]["mlp"]["down_proj"]["kernel"] == P(None, "tensor", "fsdp")
    cache = sharding.kv_cache_specs(odd, batch=8, num_slots=16, config=config)
    assert cache.keys == P(None, ("data", "fsdp"), None, None, None)
    assert sharding.batch_spec((6, 5), config) == P(None, None)  # 6 % 8 != 0
    assert sharding.batch_spec((16, 5), config) == P(("data", "fsdp"), None)
    # sweep rows: the row axis over "data", a row's batch over "fsdp"
    assert sharding.batch_spec((4, 8, 5), config, row_axis=True) == P("data", "fsdp", None)
    rows = sharding.param_specs(jax.eval_shape(lambda p: stack_rows(p, 4), params), config,
                                row_axis=True)
    assert rows["layers"]["mlp"]["up_proj"]["kernel"] == P("data", None, "fsdp", "tensor")


def test_one_device_mesh_runs_the_unchanged_iteration(eight_devices):
    arrays, _ = eight_devices
    one = [k for k in arrays.files if k.startswith("one")]
    assert len(one) > 40
    for name in one:
        np.testing.assert_allclose(arrays[name], arrays["plain" + name[len("one"):]], rtol=1e-6,
                                   atol=1e-7, err_msg=name)


if __name__ == "__main__":
    # the child does not load tests/conftest.py: its cyclic-GC threshold for tracing
    import gc
    gc.set_threshold(200_000, 50, 1000)
    child(sys.argv[1])
