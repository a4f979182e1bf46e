"""Bad input gets a clear error naming the option, field, file or tensor, before any work.

One table of cases: (id, run, exception type, regex the message must match). CLI cases call
``fresh_rl.cli.main`` in-process (argparse errors go to stderr, validation errors into the
``SystemExit``) with ``--out`` under ``tmp_path``, and check that the folder was not created:
the input is rejected before anything is computed or compiled. Python API cases build their
files (malformed safetensors, config.json) under ``tmp_path``.
"""
import json
import math
import os
from pathlib import Path
import re
import shutil
import struct
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from fresh_rl import checked, cli
from fresh_rl.control import HyperParams, Method, TrainConfig, train
from fresh_rl.corrections import (effective_sample_size, ewma_update, generalized_advantage_estimation,
                                  init_ewma_reference, ppo_kl_loss, vaco_policy_loss)
from fresh_rl.lag import DelayConfig
from fresh_rl.llm.async_pipeline import AsyncConfig
from fresh_rl.llm.checkpoint import config_from_hf, load_hf_checkpoint, read_safetensors, write_safetensors
from fresh_rl.llm.hparams import LLMHyperParams
from fresh_rl.llm.model import preset
from fresh_rl.llm.tokenizer import HFTokenizer
from fresh_rl.llm.trainer import RLConfig
from fresh_rl.replay import ReplayConfig, make_trajectory_buffer
from fresh_rl.sweep.checkpoint import CheckpointError
from fresh_rl.validation import require_output_dir

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "qwen2_tiny")
TINY = ["--num_envs", "4", "--rollout_length", "8", "--num_minibatches", "2", "--hidden_sizes", "8",
        "--total_env_steps", "160"]  # 5 iterations


class Case(NamedTuple):
    id: str
    run: Callable[[Any], Any]  # run(tmp_path) raises
    error: type
    pattern: str


def cli_case(id, argv, pattern, error=SystemExit):
    """``fresh-rl *argv`` (``{tmp}`` → tmp_path, which holds a plain file ``file``;
    ``--out {tmp}/out`` unless given)."""
    def run(tmp):
        _file(tmp)
        args = [a.replace("{tmp}", str(tmp)) for a in argv]
        if "--out" not in args:
            args += ["--out", str(tmp / "out")]
        # keep the session's compilation cache (main points JAX's cache at this folder)
        cli.main(args + ["--compilation-cache-dir", jax.config.jax_compilation_cache_dir])
    return Case(id, run, error, pattern)


def api_case(id, fn, pattern, error=ValueError):
    return Case(id, fn, error, pattern)


# ----------------------------------------------------------------------------- file builders


def _safetensors(tmp, header=None, data=b"\0" * 8, raw_header=None, size=None):
    """A .safetensors file with ``header`` (JSON) or ``raw_header`` bytes; ``size`` overrides
    the header-length field. Returns its path."""
    body = raw_header if raw_header is not None else json.dumps(header).encode()
    path = tmp / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(body) if size is None else size) + body + data)
    return str(path)


def _raw_file(tmp, content: bytes) -> str:
    (tmp / "model.safetensors").write_bytes(content)
    return str(tmp / "model.safetensors")


def _entry(**overrides):
    return {"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], **overrides}}


def _checkpoint(tmp, config=None, tensors=None, truncate=None):
    """A copy of the tiny Qwen2 fixture with config.json fields replaced (``config``: dict
    update, or any JSON value replacing the whole file), tensors edited by ``tensors(dict)``
    or the safetensors file cut to ``truncate`` bytes. Returns the folder."""
    folder = tmp / "ckpt"
    shutil.copytree(FIXTURE, folder)
    if config is not None:
        hf = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**hf, **config} if isinstance(config, dict) else config))
    weights = folder / "model.safetensors"
    if tensors is not None:
        edited = dict(read_safetensors(str(weights)))
        tensors(edited)
        write_safetensors(str(weights), edited)
    if truncate is not None:
        weights.write_bytes(weights.read_bytes()[:truncate])
    return str(folder)


def _load(**kwargs):
    return lambda tmp: load_hf_checkpoint(_checkpoint(tmp, **kwargs))


def _hf_config(**fields):
    hf = json.loads(open(os.path.join(FIXTURE, "config.json")).read())
    return {k: v for k, v in {**hf, **fields}.items() if v is not None}


def _validate(config=TrainConfig(), **grid):
    """``HyperParams.validate`` of a grid over ``grid`` (lists) on ``config``."""
    HyperParams.from_grid(config, grid, size=1).validate(config)


def _vaco(delta, **kwargs):
    x = jnp.zeros(4)
    return vaco_policy_loss(x, x, x, x, delta=delta, **kwargs)


def _checkified_vaco(delta):
    err, _ = checkify.checkify(jax.jit(lambda d: _vaco(d, jit_checks=True)[0]))(jnp.float32(delta))
    err.throw()


def _kl(kl_coef):
    x = jnp.zeros(4)
    return ppo_kl_loss(x, x, x, kl_coef=kl_coef)


def _file(tmp):
    (tmp / "file").write_text("not a folder")
    return str(tmp / "file")


def _llm_hparams(**overrides):
    return lambda tmp: LLMHyperParams.from_config(AsyncConfig(staleness_window=4), **overrides)


def _restore_garbage(tmp):
    from fresh_rl.llm.warm_start import restore_params

    (tmp / "params").mkdir()
    (tmp / "params" / "_METADATA").write_text("{not json")
    restore_params(str(tmp / "params"), preset("tiny"))


def _restore_missing(tmp):
    from fresh_rl.llm.warm_start import restore_params

    restore_params(str(tmp / "nothing_here"), preset("tiny"))


# API: NumPy/JAX scalars, traced ranges, buffer edges, loader values (helpers)


def _gae(lambda_=0.9, discount=0.9):
    x = jnp.zeros((2, 3))
    return generalized_advantage_estimation(x, x, x, x + discount, lambda_=lambda_).advantages


def _buffer(priority=None):
    """A PER buffer (4 slots, batches of 2) holding 2 scalar items of base ``priority``
    (``None``: the running-max rule)."""
    buffer = make_trajectory_buffer(ReplayConfig(
        capacity=4, sample_batch_size=2, sampling="freshper",
        new_item_priority="max" if priority is None else "given"))
    state = buffer.init(jnp.zeros(()))
    return buffer, buffer.add(state, jnp.zeros(2), 0, None if priority is None else jnp.full(2, priority))


def _ewma(beta):
    params = {"w": jnp.zeros(3)}
    return ewma_update(init_ewma_reference(params), params, beta=beta).params


def _tied_lm_head(tmp):
    with pytest.warns() as record:  # the warning becomes the case's error
        _load(config={"tie_word_embeddings": True})(tmp)
    raise UserWarning(str(record[0].message))


def _nan_in_k_proj(tensors):
    name = "model.layers.0.self_attn.k_proj.weight"
    weight = np.array(tensors[name])
    weight.flat[3] = np.nan
    tensors[name] = weight


def _tokenizer_json(tmp):
    (tmp / "tokenizer.json").write_text("{not json")
    HFTokenizer(str(tmp / "tokenizer.json"))


def _tokenizer_config(tmp, text):
    folder = Path(_checkpoint(tmp))
    (folder / "tokenizer_config.json").write_text(text)
    HFTokenizer.from_pretrained(str(folder))


def owned_case(id, argv, pattern):
    """``cli_case`` on ``--out {tmp}/owned``, a folder whose run.json names another run (seed 0)."""
    def run(tmp):
        (tmp / "owned").mkdir()
        (tmp / "owned" / "run.json").write_text(json.dumps({"identity": {"command": "sweep", "seed": 0}}))
        cli_case(id, [*argv, "--out", "{tmp}/owned"], pattern).run(tmp)
    return Case(id, run, SystemExit, pattern)


ST = r"model\.safetensors"  # every safetensors error names the file
CASES = [
    # --- CLI: option types and ranges (argparse, stderr) -----------------------------------
    cli_case("num_envs-not-int", ["train", "--num_envs", "abc"], r"--num_envs expects an integer, got 'abc'"),
    cli_case("num_envs-fraction", ["train", "--num_envs", "1.5"], r"--num_envs expects an integer, got '1.5'"),
    cli_case("learning_rate-not-number", ["train", "--learning_rate", "fast"],
             r"--learning_rate expects a number, got 'fast'"),
    cli_case("init_log_std-nan", ["train", "--env_name", "Pendulum-v1", "--init_log_std", "nan"],
             r"--init_log_std expects a number, got 'nan'"),
    cli_case("hidden_sizes-item", ["train", "--hidden_sizes", "64,a"], r"--hidden_sizes expects comma-separated"),
    cli_case("bool-option", ["train", "--normalize_obs", "maybe"], r"--normalize_obs expects true or false"),
    cli_case("kl_adaptive-negative", ["train", "--kl_adaptive", "-1"], r"--kl_adaptive target must be in"),
    cli_case("method-unknown", ["train", "--method", "trpo"], r"method must be one of"),
    cli_case("seed-huge", ["train", "--seed", "99999999999999999999"],
             r"--seed expects an integer in \[0, 2147483647\], got '99999999999999999999'"),
    cli_case("seed-negative", ["train", "--seed", "-1"], r"--seed expects an integer in \[0, 2147483647\]"),
    cli_case("sweep-seed-huge", ["sweep", "--seed", "99999999999999999999"], r"--seed expects an integer in"),
    cli_case("sweep-last-seed-out-of-range", ["sweep", *TINY, "--seed", "2147483647", "--seeds", "2"],
             r"--seed \+ --seeds - 1 \(the last seed\) must be in \[0, 2147483647\], got 2147483648"),
    cli_case("sweep-seeds-zero", ["sweep", "--seeds", "0"], r"--seeds expects an integer in \[1, inf\)"),
    cli_case("checkpoint-every-zero", ["train", "--checkpoint-every", "0"],
             r"--checkpoint-every expects an integer in \[1, inf\), got '0'"),
    cli_case("checkpoint-every-negative", ["train", "--checkpoint-every", "-3"], r"--checkpoint-every expects"),
    cli_case("chunk-size-zero", ["sweep", "--chunk-size", "0"], r"--chunk-size expects an integer in \[1, inf\)"),
    cli_case("lag-negative", ["train", "--lag", "-1"], r"--lag expects an integer in \[0, inf\)"),
    cli_case("num_envs-zero", ["train", "--num_envs", "0"], r"num_envs must be"),
    cli_case("gamma-above-one", ["train", "--gamma", "1.5"], r"gamma must be in \[0.0, 1.0\], got 1.5"),
    # --- CLI: nonsense that used to run (values reach HyperParams.validate) ------------------
    cli_case("lag-beyond-run", ["train", *TINY, "--lag", "1000000000"],
             r"lag must be < num_iterations = 5 .*got 1000000000"),
    cli_case("lag-equal-run-length", ["train", *TINY, "--lag", "5"], r"lag must be < num_iterations = 5"),
    cli_case("total_env_steps-huge", ["train", "--total_env_steps", "1e12"],
             r"total_env_steps = 1000000000000 needs about [\d,]+ bytes"),
    cli_case("num_envs-huge", ["train", "--num_envs", "268435456", "--total_env_steps", "17179869184"],
             r"num_envs\*rollout_length = 17179869184 needs about [\d,]+ bytes"),
    cli_case("learning_rate-inf", ["train", "--learning_rate", "inf"], r"learning_rate must be in \(0.0, inf\), got inf"),
    cli_case("value_coef-inf", ["train", "--value_coef", "inf"], r"value_coef must be in \[0.0, inf\), got inf"),
    cli_case("learning_rate-zero", ["train", "--learning_rate", "0"], r"learning_rate must be in \(0.0, inf"),
    # --- CLI: --out ---------------------------------------------------------------------------
    cli_case("out-empty", ["train", "--out", ""], r"--out must name an output folder, got ''"),
    cli_case("out-blank", ["sweep", "--out", "  "], r"--out must name an output folder"),
    cli_case("out-is-file", ["train", "--out", "{tmp}/file"], r"--out '.*/file' is an existing file"),
    cli_case("sweep-out-is-file", ["sweep", *TINY, "--grid", "lag=0,1", "--out", "{tmp}/file"],
             r"--out '.*/file' is an existing file"),
    cli_case("out-under-file", ["train", "--out", "{tmp}/file/run"], r"--out '.*/file/run' lies under the file '.*/file'"),
    # --- CLI: --grid --------------------------------------------------------------------------
    cli_case("grid-repeated-field", ["sweep", "--grid", "lag=0", "--grid", "lag=1"],
             r"--grid lag is given twice \('lag=0' and 'lag=1'\)"),
    cli_case("grid-repeated-value", ["sweep", "--grid", "lag=0,0"], r"--grid lag lists 0 twice"),
    cli_case("grid-unknown-field", ["sweep", "--grid", "clip=0.1"], r"--grid takes NAME=v1,v2,… with NAME in"),
    cli_case("grid-no-values", ["sweep", "--grid", "lag="], r"--grid takes NAME=v1,v2"),
    cli_case("grid-lag-fraction", ["sweep", "--grid", "lag=0.5"], r"--grid lag expects an integer, got '0.5'"),
    cli_case("grid-delta-not-number", ["sweep", "--method", "vaco", "--grid", "vaco_delta=0.1,big"],
             r"--grid vaco_delta expects a number, got 'big'"),
    cli_case("grid-field-method-ignores", ["sweep", "--grid", "vaco_delta=0.1,0.2"],
             r"--grid vaco_delta: method 'ppo_clip' does not use it"),
    cli_case("grid-kl_coef-without-kl", ["sweep", "--method", "vaco", "--grid", "kl_coef=0.1"],
             r"--grid kl_coef: method 'vaco' does not use it"),
    cli_case("grid-delta-align-only", ["sweep", "--method", "vaco_align_only", "--grid", "vaco_delta=0.1"],
             r"--grid vaco_delta: method 'vaco_align_only' does not use it"),
    cli_case("grid-delta-negative", ["sweep", *TINY, "--method", "vaco", "--grid", "vaco_delta=-1"],
             r"HyperParams\.vaco_delta must be in \(0\.0, inf\], got -1\.0"),
    cli_case("grid-delta-zero", ["sweep", *TINY, "--method", "vaco", "--grid", "vaco_delta=0.1,0"],
             r"HyperParams\.vaco_delta must be in \(0\.0, inf\], got 0\.0"),
    cli_case("grid-delta-nan", ["sweep", "--method", "vaco", "--grid", "vaco_delta=nan"],
             r"--grid vaco_delta expects a number, got 'nan'"),
    cli_case("grid-lag-beyond-run", ["sweep", *TINY, "--grid", "lag=0,1000000000"],
             r"lag must be < num_iterations = 5 .*got 1000000000"),
    cli_case("grid-lag-negative", ["sweep", *TINY, "--grid", "lag=-1,0"], r"HyperParams\.lag must be in \[0, "),
    cli_case("grid-gamma", ["sweep", *TINY, "--grid", "gamma=0.9,1.5"], r"HyperParams\.gamma must be in \[0\.0, 1\.0\], got 1\.5"),
    cli_case("grid-learning_rate", ["sweep", *TINY, "--grid", "learning_rate=-1e-3"],
             r"HyperParams\.learning_rate must be in \(0\.0, inf\), got -0\.001"),
    cli_case("grid-entropy-inf", ["sweep", *TINY, "--grid", "entropy_coef=inf"],
             r"HyperParams\.entropy_coef must be in \[0\.0, inf\), got inf"),
    # CLI: output folders, repeated options, negative values
    owned_case("out-owned-by-another-sweep", ["sweep", *TINY, "--seed", "5"],
               r"^error: --out .*/owned belongs to another run: seed 0 → 5, seeds \(none\) → 5, "),
    owned_case("train-out-owned-by-a-sweep", ["train", *TINY], r"belongs to another run: command sweep → train"),
    cli_case("out-in-proc", ["train", *TINY, "--out", "/proc/fresh_rl_out"],
             r"^fresh-rl: --out /proc/fresh_rl_out: \[Errno \d+\] "),
    cli_case("out-repeated", ["train", "--out", "{tmp}/out", "--out", "{tmp}/out2"],
             r"--out is given twice \('.*/out' and '.*/out2'\); give it once"),
    cli_case("option-repeated", ["train", "--num_envs", "8", "--num_envs", "16"],
             r"--num_envs is given twice \('8' and '16'\); give it once"),
    cli_case("grid-too-big", ["sweep", "--seeds", "100000000", "--grid", "lag=0,1"],
             r"the grid has 200,000,000 points \(100000000 seeds × 2 lag\), more than MAX_GRID_POINTS = 1,000,000"),
    cli_case("grid-lag-only-negative", ["sweep", *TINY, "--grid", "lag=-1"], r"HyperParams\.lag must be in \[0, 0\], got -1"),
    cli_case("hidden_sizes-negative", ["train", "--hidden_sizes", "-4,8"],
             r"hidden_sizes must be a non-empty tuple of integers ≥ 1, got \(-4, 8\)"),
    cli_case("adam_eps-negative", ["train", "--adam_eps", "-1e-5"], r"adam_eps must be in \(0\.0, inf\), got -1e-05"),
    cli_case("option-of-another-method", ["train", "--method", "ppo_clip", "--vaco.delta", "0.3"],
             r"--vaco\.delta has no effect: method 'ppo_clip' reads --ppo_clip, not --vaco"),
    cli_case("sweep-option-of-another-method", ["sweep", "--method", "spo", "--ppo_clip.epsilon_low", "0.1"],
             r"--ppo_clip\.epsilon_low has no effect: method 'spo' reads --spo, not --ppo_clip"),
    cli_case("init_log_std-discrete", ["train", "--env_name", "CartPole-v1", "--init_log_std", "0.5"],
             r"--init_log_std has no effect: CartPole-v1 has discrete actions"),
    # --- Python API: traced hyperparameters checked on the host ------------------------------
    api_case("hparams-delta-nan", lambda tmp: _validate(vaco_delta=[math.nan]),
             r"HyperParams\.vaco_delta must be in \(0\.0, inf\], got nan"),
    api_case("hparams-kl_coef-negative", lambda tmp: _validate(kl_coef=[-0.5]), r"HyperParams\.kl_coef must be in"),
    api_case("hparams-value_coef-nan", lambda tmp: _validate(value_coef=[math.nan]), r"HyperParams\.value_coef"),
    api_case("hparams-lag-run-length", lambda tmp: _validate(TrainConfig(total_env_steps=8 * 64 * 3,
                                                                         delay=DelayConfig.fixed(0, 9)), lag=[8]),
             r"HyperParams\.lag must be < num_iterations = 3"),
    api_case("ring-too-big", lambda tmp: _validate(TrainConfig(delay=DelayConfig.geometric(3.0, 10**9))),
             r"delay\.ring_size = 1000000000 needs about [\d,]+ bytes .*MAX_ALLOCATION_BYTES"),
    api_case("train-refuses-before-allocating", lambda tmp: train(TrainConfig(total_env_steps=10**12),
                                                                  jax.random.PRNGKey(0)),
             r"total_env_steps = 1000000000000 needs about"),
    api_case("method-unknown-hyperparameter", lambda tmp: Method("x", lambda *a: None, loss_hyperparams=("delta",)),
             r"every entry of Method\.loss_hyperparams must be one of .*got 'delta'"),
    # --- Python API: losses with traced scalars ------------------------------------------------
    api_case("vaco-delta-negative", lambda tmp: _vaco(-1.0), r"delta must be in \(0\.0, inf\], got -1\.0"),
    api_case("vaco-delta-nan", lambda tmp: _vaco(math.nan), r"delta must be in \(0\.0, inf\], got nan"),
    api_case("vaco-delta-zero-array", lambda tmp: _vaco(jnp.zeros(())), r"delta must be in \(0\.0, inf\], got 0\.0"),
    api_case("vaco-delta-traced-checkify", lambda tmp: _checkified_vaco(-1.0), r"delta must be in \(0\.0, inf\]",
             error=checkify.JaxRuntimeError),
    api_case("kl-coef-negative", lambda tmp: _kl(-1.0), r"kl_coef must be in \[0\.0, inf\), got -1\.0"),
    api_case("kl-coef-nan-array", lambda tmp: _kl(jnp.asarray(math.nan)), r"kl_coef must be in .*got nan"),
    api_case("llm-window-negative", _llm_hparams(window=-1), r"window must be in \[0, 4\]"),
    api_case("llm-ewma_beta-nan", _llm_hparams(ewma_beta=math.nan), r"ewma_beta must be in \[0, 1\]"),
    api_case("llm-reset-threshold", _llm_hparams(ewma_reset_threshold=0.0), r"ewma_reset_threshold must be in \(0, 1\)"),
    # --- output folder helper -------------------------------------------------------------------
    api_case("output-dir-file", lambda tmp: require_output_dir("out", _file(tmp)), r"out '.*/file' is an existing file"),
    api_case("output-dir-under-file", lambda tmp: require_output_dir("out", _file(tmp) + "/a/b"),
             r"out '.*/file/a/b' lies under the file"),
    # --- safetensors: every malformed header, offset, dtype, shape names the file and tensor -----
    api_case("st-empty-file", lambda tmp: read_safetensors(_raw_file(tmp, b"")), ST + r": truncated: 0 bytes",
             error=CheckpointError),
    api_case("st-shorter-than-8-bytes", lambda tmp: read_safetensors(_raw_file(tmp, b"\1\2\3")),
             ST + r": truncated: 3 bytes", error=CheckpointError),
    api_case("st-empty-header", lambda tmp: read_safetensors(_safetensors(tmp, raw_header=b"", data=b"")),
             ST + r": the safetensors header is not valid JSON", error=CheckpointError),
    api_case("st-header-length-beyond-file", lambda tmp: read_safetensors(_safetensors(tmp, _entry(), size=10**15)),
             ST + r": header length 1000000000000000 exceeds the file", error=CheckpointError),
    api_case("st-header-not-json", lambda tmp: read_safetensors(_safetensors(tmp, raw_header=b"{not json")),
             ST + r": the safetensors header is not valid JSON", error=CheckpointError),
    api_case("st-header-not-utf8", lambda tmp: read_safetensors(_safetensors(tmp, raw_header=b"\xff\xfe{}")),
             ST + r": the safetensors header is not valid JSON", error=CheckpointError),
    api_case("st-header-list", lambda tmp: read_safetensors(_safetensors(tmp, [1, 2])),
             ST + r": the safetensors header must be a JSON object, got list", error=CheckpointError),
    api_case("st-entry-not-object", lambda tmp: read_safetensors(_safetensors(tmp, {"t": [0, 8]})),
             ST + r": tensor 't': header entry must be an object", error=CheckpointError),
    api_case("st-entry-lacks-dtype", lambda tmp: read_safetensors(_safetensors(tmp, {"t": {"shape": [2], "data_offsets": [0, 8]}})),
             ST + r": tensor 't': header entry lacks 'dtype'", error=CheckpointError),
    api_case("st-unknown-dtype", lambda tmp: read_safetensors(_safetensors(tmp, _entry(dtype="Q4"))),
             ST + r": tensor 't' has unsupported dtype 'Q4'", error=CheckpointError),
    api_case("st-bad-shape", lambda tmp: read_safetensors(_safetensors(tmp, _entry(shape=[-2]))),
             ST + r": tensor 't': shape must be a list of integers >= 0, got \[-2\]", error=CheckpointError),
    api_case("st-offsets-beyond-data", lambda tmp: read_safetensors(_safetensors(tmp, _entry(shape=[4], data_offsets=[0, 16]))),
             ST + r": tensor 't': data_offsets must be .* <= 8 .*got \[0, 16\]", error=CheckpointError),
    api_case("st-offsets-reversed", lambda tmp: read_safetensors(_safetensors(tmp, _entry(data_offsets=[8, 0]))),
             ST + r": tensor 't': data_offsets must be", error=CheckpointError),
    api_case("st-offsets-not-pair", lambda tmp: read_safetensors(_safetensors(tmp, _entry(data_offsets=[0]))),
             ST + r": tensor 't': data_offsets must be", error=CheckpointError),
    api_case("st-offsets-vs-shape", lambda tmp: read_safetensors(_safetensors(tmp, _entry(shape=[3]))),
             ST + r": tensor 't': data_offsets \[0, 8\] hold 8 bytes, shape \[3\] of F32 needs 12", error=CheckpointError),
    api_case("ckpt-truncated", _load(truncate=150_000),
             ST + r": tensor '.*': data_offsets must be", error=CheckpointError),
    api_case("ckpt-truncated-header", _load(truncate=100),
             ST + r": header length \d+ exceeds the file \(100 bytes\)", error=CheckpointError),
    api_case("ckpt-wrong-shape", _load(tensors=lambda t: t.update({"model.norm.weight": np.zeros(7, np.float32)})),
             ST + r": tensor 'model\.norm\.weight' has shape \(7,\), the config expects \(64,\)", error=CheckpointError),
    api_case("ckpt-missing-tensor", _load(tensors=lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
             ST + r" lacks tensors: \['model\.layers\.1\.mlp\.up_proj\.weight'\]", error=CheckpointError),
    api_case("ckpt-extra-tensor", _load(tensors=lambda t: t.update({"model.layers.9.x": np.zeros(1, np.float32)})),
             ST + r" has tensors this Qwen2Config does not use: \['model\.layers\.9\.x'\]", error=CheckpointError),
    api_case("ckpt-no-weights", lambda tmp: (os.remove(os.path.join(_checkpoint(tmp), "model.safetensors")),
                                             load_hf_checkpoint(str(tmp / "ckpt"))),
             ST + r": cannot read the safetensors file", error=CheckpointError),
    api_case("ckpt-bad-index", lambda tmp: (open(os.path.join(_checkpoint(tmp), "model.safetensors.index.json"), "w").write(
        json.dumps({"weight_map": ["model.safetensors"]})), load_hf_checkpoint(str(tmp / "ckpt"))),
             r"model\.safetensors\.index\.json: 'weight_map' must map", error=CheckpointError),
    # --- config.json type errors name the file and the field ------------------------------------
    api_case("config-list", _load(config=[1, 2]), r"config\.json: must hold a JSON object, got list", error=CheckpointError),
    api_case("config-not-json", lambda tmp: (open(os.path.join(_checkpoint(tmp), "config.json"), "w").write("{"),
                                             load_hf_checkpoint(str(tmp / "ckpt"))),
             r"config\.json: cannot read the model config", error=CheckpointError),
    api_case("config-missing-file", lambda tmp: load_hf_checkpoint(str(tmp)),
             r"config\.json: cannot read the model config", error=CheckpointError),
    api_case("config-hidden_size-string", _load(config={"hidden_size": "64"}),
             r"config\.json: 'hidden_size' must be an integer, got '64'", error=CheckpointError),
    api_case("config-heads-float", _load(config={"num_attention_heads": 4.0}),
             r"config\.json: 'num_attention_heads' must be an integer, got 4\.0", error=CheckpointError),
    api_case("config-missing-field", lambda tmp: config_from_hf(_hf_config(vocab_size=None), "my/config.json"),
             r"my/config\.json: lacks required fields \['vocab_size'\]", error=CheckpointError),
    api_case("config-zero-heads", _load(config={"num_attention_heads": 0}),
             r"config\.json: Qwen2Config\.num_attention_heads must be in \[1, inf\], got 0", error=CheckpointError),
    api_case("config-eps-string", _load(config={"rms_norm_eps": "1e-5"}),
             r"config\.json: 'rms_norm_eps' must be a number", error=CheckpointError),
    api_case("config-tie-string", _load(config={"tie_word_embeddings": "yes"}),
             r"config\.json: 'tie_word_embeddings' must be true or false", error=CheckpointError),
    api_case("config-rope_theta-string", _load(config={"rope_theta": "1e4"}),
             r"config\.json: 'rope_theta' must be a number, got '1e4'", error=CheckpointError),
    api_case("config-rope-list", _load(config={"rope_parameters": [1]}),
             r"config\.json: 'rope_parameters' must be an object", error=CheckpointError),
    api_case("config-head_dim", _load(config={"head_dim": 8}),
             r"config\.json: head_dim=8 != hidden_size/num_attention_heads = 16", error=CheckpointError),
    # --- orbax parameter checkpoints ----------------------------------------------------------------
    api_case("restore-params-missing", _restore_missing, r"parameter checkpoint .*nothing_here is unreadable",
             error=CheckpointError),
    api_case("restore-params-garbage", _restore_garbage, r"parameter checkpoint .*params is unreadable",
             error=CheckpointError),
    # --- API: NumPy/JAX scalars, traced ranges, buffer edges, loader values ---------------------
    api_case("gae-lambda-numpy", lambda tmp: _gae(lambda_=np.float32(1.5)), r"lambda_ must be in \[0\.0, 1\.0\], got 1\.5"),
    api_case("gae-lambda-jax", lambda tmp: _gae(lambda_=jnp.float32(1.5)), r"lambda_ must be in \[0\.0, 1\.0\], got 1\.5"),
    api_case("gae-discount-above-one", lambda tmp: _gae(discount=1.5), r"discounts must be in \[0\.0, 1\.0\], got 1\.5"),
    api_case("gae-lambda-traced-nan", lambda tmp: checked(_gae)(jnp.float32(math.nan)),
             r"lambda_ must be in \[0\.0, 1\.0\]", error=checkify.JaxRuntimeError),
    api_case("gae-lambda-traced-above-one", lambda tmp: checked(_gae)(jnp.float32(1.5)),
             r"lambda_ must be in \[0\.0, 1\.0\]", error=checkify.JaxRuntimeError),
    api_case("gae-discount-traced", lambda tmp: checked(lambda d: _gae(discount=d))(jnp.float32(-0.5)),
             r"discounts must be in \[0\.0, 1\.0\]", error=checkify.JaxRuntimeError),
    api_case("vaco-delta-traced-zero-switch", lambda tmp: checked(lambda d: _vaco(d)[0])(jnp.float32(0.0)),
             r"delta must be in \(0\.0, inf\]", error=checkify.JaxRuntimeError),
    api_case("vaco-delta-traced-nan-switch", lambda tmp: checked(lambda d: _vaco(d)[0])(jnp.float32(math.nan)),
             r"delta must be in \(0\.0, inf\]", error=checkify.JaxRuntimeError),
    api_case("vaco-delta-numpy", lambda tmp: _vaco(np.float64(-1.0)), r"delta must be in \(0\.0, inf\], got -1\.0"),
    api_case("kl-coef-traced-switch", lambda tmp: checked(lambda b: _kl(b)[0])(jnp.float32(-1.0)),
             r"kl_coef must be in \[0\.0, inf\)", error=checkify.JaxRuntimeError),
    api_case("ess-weights-negative", lambda tmp: effective_sample_size(jnp.array([1.0, -1.0])),
             r"weights must be in \[0\.0, inf\], got -1\.0"),
    api_case("ess-weights-traced", lambda tmp: checked(effective_sample_size)(jnp.array([1.0, -1.0])),
             r"weights must be in \[0\.0, inf\]", error=checkify.JaxRuntimeError),
    api_case("rlconfig-learning_rate-inf", lambda tmp: RLConfig(learning_rate=math.inf),
             r"RLConfig\.learning_rate must be in \(0\.0, inf\), got inf"),
    api_case("rlconfig-learning_rate-numpy-inf", lambda tmp: RLConfig(learning_rate=np.float32(math.inf)),
             r"RLConfig\.learning_rate must be in \(0\.0, inf\), got inf"),
    api_case("rlconfig-epochs-bool", lambda tmp: RLConfig(epochs=True), r"RLConfig\.epochs must be an integer in \[1, inf\], got True"),
    api_case("replay-capacity-bool", lambda tmp: ReplayConfig(capacity=True, sample_batch_size=1),
             r"capacity must be an integer in \[1, inf\], got True"),
    api_case("replay-capacity-float", lambda tmp: ReplayConfig(capacity=8.0, sample_batch_size=1),
             r"capacity must be an integer in \[1, inf\], got 8\.0"),
    api_case("replay-capacity-numpy-zero", lambda tmp: ReplayConfig(capacity=np.int64(0), sample_batch_size=1),
             r"capacity must be in \[1, inf\], got 0"),
    api_case("buffer-version-fraction", lambda tmp: _buffer()[0].add(_buffer()[1], jnp.zeros(2), 1.7),
             r"add: versions must be integers, got dtype float32"),
    api_case("buffer-version-negative", lambda tmp: _buffer()[0].add(_buffer()[1], jnp.zeros(2), -5),
             r"add: versions must be integers >= 0"),
    api_case("buffer-version-negative-traced", lambda tmp: checked(
        lambda s, v: _buffer()[0].add(s, jnp.zeros(2), v))(_buffer()[1], jnp.int32(-5)),
             r"add: versions must be integers >= 0", error=checkify.JaxRuntimeError),
    api_case("buffer-index-float", lambda tmp: _buffer()[0].set_priorities(_buffer()[1], jnp.array([0.5]), jnp.ones(1)),
             r"set_priorities: indices must be integers, got dtype float32"),
    api_case("buffer-index-traced-out-of-range", lambda tmp: checked(_buffer()[0].set_priorities)(
        _buffer()[1], jnp.array([7]), jnp.ones(1)), r"set_priorities: indices must be in \[0, capacity=4\)",
             error=checkify.JaxRuntimeError),
    api_case("buffer-zero-priorities", lambda tmp: _buffer(0.0)[0].sample(_buffer(0.0)[1], jax.random.PRNGKey(0)),
             r"sample: no stored item has a positive priority"),
    api_case("buffer-zero-priorities-traced", lambda tmp: checked(_buffer(0.0)[0].sample)(
        _buffer(0.0)[1], jax.random.PRNGKey(0)), r"sample: no stored item has a positive priority",
             error=checkify.JaxRuntimeError),
    api_case("buffer-beta-numpy", lambda tmp: _buffer()[0].sample(_buffer()[1], jax.random.PRNGKey(0), np.float32(1.5)),
             r"importance_exponent must be in \[0\.0, 1\.0\], got 1\.5"),
    api_case("buffer-beta-traced", lambda tmp: checked(_buffer()[0].sample)(
        _buffer()[1], jax.random.PRNGKey(0), jnp.float32(1.5)), r"importance_exponent must be in \[0\.0, 1\.0\]",
             error=checkify.JaxRuntimeError),
    api_case("buffer-tau-traced", lambda tmp: checked(_buffer()[0].set_age_decay_tau)(_buffer()[1], jnp.float32(-1.0)),
             r"age_decay_tau must be in \(0, inf\]", error=checkify.JaxRuntimeError),
    api_case("ckpt-nan-tensor", _load(tensors=_nan_in_k_proj),
             ST + r": tensor 'model\.layers\.0\.self_attn\.k_proj\.weight' holds non-finite values \(1 NaN, 0 inf\)",
             error=CheckpointError),
    api_case("ckpt-tied-lm_head-differs", _tied_lm_head,
             ST + r": 'lm_head\.weight' is ignored: config\.json sets tie_word_embeddings=true", error=UserWarning),
    api_case("tokenizer-json-malformed", _tokenizer_json, r"tokenizer\.json: cannot read the tokenizer: .*line 1 column"),
    api_case("tokenizer-config-malformed", lambda tmp: _tokenizer_config(tmp, "{\"eos_token\": "),
             r"tokenizer_config\.json: cannot read the tokenizer config: Expecting value"),
    api_case("tokenizer-config-list", lambda tmp: _tokenizer_config(tmp, "[1]"),
             r"tokenizer_config\.json: must hold a JSON object, got list"),
    api_case("ewma-beta-numpy", lambda tmp: _ewma(np.float32(1.5)), r"beta must be in \[0\.0, 1\.0\], got 1\.5"),
    api_case("ewma-beta-traced", lambda tmp: checked(_ewma)(jnp.float32(-0.5)), r"beta must be in \[0\.0, 1\.0\]",
             error=checkify.JaxRuntimeError),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_a_clear_error(case, tmp_path, capsys):
    with pytest.raises(case.error) as info:
        case.run(tmp_path)
    message = f"{info.value}\n{capsys.readouterr().err}"
    assert re.search(case.pattern, message), message
    assert "Traceback" not in message
    assert not (tmp_path / "out").exists()  # rejected before anything was written


def test_case_ids_are_unique():
    assert len({c.id for c in CASES}) == len(CASES)


def test_out_not_writable_is_refused_before_work(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root passes any permission check: answer as the kernel does for a user
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode: (
            False if Path(path) == locked and mode & os.W_OK else real_access(path, mode)))
    with pytest.raises(SystemExit, match=r"--out '.*locked/run' is not writable"):
        cli.main(["train", "--out", str(locked / "run")])
    assert not (locked / "run").exists()


def test_valid_edge_values_still_parse():
    args = cli.build_parser().parse_args(["train", "--total_env_steps", "1e6", "--seed", "2147483647",
                                          "--vaco.delta", "inf", "--checkpoint-every", "1", "--lag", "0"])
    config = cli.build_config(TrainConfig, args)
    assert config.total_env_steps == 1_000_000 and config.vaco.delta == math.inf
    assert (args.seed, args.checkpoint_every, args.lag) == (2**31 - 1, 1, 0)
    assert cli._parse_grid(["vaco_delta=0.1,inf", "lag=0,1e1"]) == {"vaco_delta": [0.1, math.inf], "lag": [0, 10]}
    require_output_dir("--out", "relative/new/folder")  # nothing exists yet: fine, nothing created
    assert not os.path.exists("relative")


@pytest.mark.parametrize("module, register, table, kind", [
    ("fresh_rl.control.methods", "register_method", "METHODS", "method"),
    ("fresh_rl.control.data_sources", "register_data_source", "DATA_SOURCES", "data source"),
    ("fresh_rl.corrections.routes", "register_route", "ROUTES", "old-log-prob route"),
    ("fresh_rl.llm.policy_losses", "register_loss", "LOSSES", "LLM policy loss"),
])
def test_registries_refuse_a_wrong_type_and_a_taken_name(module, register, table, kind):
    """Every registry goes through validation.register_entry: a wrong type names the expected
    type, a taken name names the entry; nothing is added or replaced."""
    import importlib
    mod = importlib.import_module(module)
    registry = getattr(mod, table)
    before = dict(registry)
    existing = next(iter(registry.values()))
    with pytest.raises(ValueError, match=f"{kind} registry takes a {type(existing).__name__}, got str"):
        getattr(mod, register)("not an entry")
    with pytest.raises(ValueError, match=re.escape(f"{kind} {existing.name!r} is already registered")):
        getattr(mod, register)(existing)
    assert registry == before


def test_register_entry_replaces_only_when_asked():
    from fresh_rl.validation import register_entry

    class Entry(NamedTuple):
        name: str
        value: int

    registry = {}
    assert register_entry(registry, Entry("a", 1), Entry, "toy") == Entry("a", 1)
    with pytest.raises(ValueError, match="toy 'a' is already registered"):
        register_entry(registry, Entry("a", 2), Entry, "toy")
    register_entry(registry, Entry("a", 2), Entry, "toy", replace=True)
    assert registry == {"a": Entry("a", 2)}
