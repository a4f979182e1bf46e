"""Hugging Face Qwen2 checkpoints (config.json + *.safetensors) <-> our Flax parameters.

The safetensors format is read directly (8-byte little-endian header size, JSON header of
`name -> {dtype, shape, data_offsets}`, raw little-endian bytes), with `ml_dtypes` for
bfloat16, so real bf16 checkpoints load without torch. Sharded checkpoints are found through
`model.safetensors.index.json`. Every malformed file (truncated, bad header, unknown dtype,
offsets outside the data or inconsistent with shape × dtype, a tensor missing or of the wrong
shape) and every config.json type error raises
:class:`~fresh_rl.sweep.checkpoint.CheckpointError` (a ``ValueError``) naming the file and the
tensor or field.

Name mapping (HF -> ours; HF Linear weights are `[out, in]`, Flax Dense kernels `[in, out]`):
  model.embed_tokens.weight                      -> embed_tokens/embedding
  model.layers.{i}.self_attn.{q,k,v}_proj.{weight,bias} -> layers_{i}/self_attn/{q,k,v}_proj/{kernel,bias}
  model.layers.{i}.self_attn.o_proj.weight        -> layers_{i}/self_attn/o_proj/kernel
  model.layers.{i}.mlp.{gate,up,down}_proj.weight -> layers_{i}/mlp/{...}_proj/kernel
  model.layers.{i}.{input,post_attention}_layernorm.weight -> layers_{i}/{...}/weight
  model.norm.weight -> norm/weight;  lm_head.weight -> lm_head/kernel (ignored when tied)
The per-layer ``layers_{i}`` parameters are then stacked into the scanned ``layers`` layout
(:func:`fresh_rl.llm.model.stack_layers`); export unstacks them.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import struct
import tempfile
import warnings

import jax
import ml_dtypes
import numpy as np

from fresh_rl.llm.model import Qwen2Config, init_params, stack_layers, unstack_layers
from fresh_rl.provenance import write_atomic
from fresh_rl.sweep.checkpoint import CheckpointError

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
           "F64": np.float64, "I64": np.int64, "I32": np.int32}
_DTYPE_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def _read_json(path: str, what: str):
    """The parsed JSON file ``path``; ``CheckpointError`` naming it if unreadable."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: cannot read the {what}: {err}") from err


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor_entry(path: str, name: str, info, data_size: int) -> tuple[type, list[int], int, int]:
    """(dtype, shape, start, end) of one header entry, checked against the data section."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict):
        raise CheckpointError(f"{where}: header entry must be an object, got {info!r}")
    for field in ("dtype", "shape", "data_offsets"):
        if field not in info:
            raise CheckpointError(f"{where}: header entry lacks {field!r}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in _DTYPES:
        raise CheckpointError(f"{where} has unsupported dtype {dtype!r}; supported: {sorted(_DTYPES)}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise CheckpointError(f"{where}: shape must be a list of integers >= 0, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_size):
        raise CheckpointError(f"{where}: data_offsets must be [start, end] with 0 <= start <= end <= "
                              f"{data_size} (the data section's bytes), got {offsets!r}")
    start, end = offsets
    needed = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
    if end - start != needed:
        raise CheckpointError(f"{where}: data_offsets {offsets} hold {end - start} bytes, shape "
                              f"{shape} of {dtype} needs {needed}")
    return _DTYPES[dtype], shape, start, end


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Reads every tensor of one .safetensors file into numpy arrays (``CheckpointError``
    naming the file and tensor if it is malformed)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read the safetensors file: {err}") from err
    if len(raw) < 8:
        raise CheckpointError(f"{path}: truncated: {len(raw)} bytes, shorter than the 8-byte "
                              "header length of a safetensors file")
    (header_size,) = struct.unpack("<Q", raw[:8])
    if header_size > len(raw) - 8:
        raise CheckpointError(f"{path}: header length {header_size} exceeds the file "
                              f"({len(raw)} bytes): truncated or not a safetensors file")
    try:
        header = json.loads(raw[8:8 + header_size])
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: the safetensors header is not valid JSON: {err}") from err
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header must be a JSON object, got "
                              f"{type(header).__name__}")
    data = memoryview(raw)[8 + header_size:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, start, end = _tensor_entry(path, name, info, len(data))
        tensors[name] = np.frombuffer(data[start:end], dtype=dtype).reshape(shape)
    return tensors


def write_safetensors(path: str, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
    """Writes numpy arrays as one .safetensors file (readable by HF `safetensors`), with the
    string map ``metadata`` as its ``__metadata__`` (e.g. ``{"format": "pt"}``) if given;
    whole or not at all (:func:`fresh_rl.provenance.write_atomic`)."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        raw = array.tobytes()
        header[name] = {"dtype": _DTYPE_NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header_bytes = json.dumps(header).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)

    def write(f):
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        f.writelines(chunks)
    write_atomic(path, write, binary=True)


_CONFIG_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings")


def config_from_hf(hf: dict, source: str = "config.json") -> Qwen2Config:
    """Builds a Qwen2Config from a parsed HF config.json; rejects features we do not implement.

    Malformed input raises ``CheckpointError`` naming ``source`` (the file) and the field."""
    def fail(message):
        raise CheckpointError(f"{source}: {message}")

    def field(name, kinds, default, what):  # null = absent, as transformers writes it
        value = default if hf.get(name) is None else hf[name]
        if not isinstance(value, kinds) or (kinds != bool and isinstance(value, bool)):
            fail(f"{name!r} must be {what}, got {value!r}")
        return value

    if not isinstance(hf, dict):
        fail(f"must hold a JSON object, got {type(hf).__name__}")
    if field("model_type", str, "qwen2", "a string") != "qwen2":
        fail(f"model_type must be 'qwen2', got {hf.get('model_type')!r}")
    if field("use_sliding_window", bool, False, "true or false"):
        fail("use_sliding_window=true is not supported (Qwen2.5 checkpoints ship with false)")
    # transformers < 5 writes rope_theta (+ rope_scaling); >= 5 writes rope_parameters.
    rope_key = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    rope = field(rope_key, dict, {}, "an object") if hf.get(rope_key) else {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        fail(f"RoPE scaling {rope!r} is not supported (default only)")
    missing = [f for f in _CONFIG_INTS if f not in hf]
    if missing:
        fail(f"lacks required fields {missing}")
    ints = {f: field(f, int, None, "an integer") for f in _CONFIG_INTS}
    rope_theta = field("rope_theta", (int, float), rope.get("rope_theta", 10000.0), "a number")
    rms_norm_eps = field("rms_norm_eps", (int, float), 1e-6, "a number")
    tie_word_embeddings = field("tie_word_embeddings", bool, False, "true or false")
    try:
        config = Qwen2Config(**ints, rope_theta=float(rope_theta), rms_norm_eps=float(rms_norm_eps),
                             tie_word_embeddings=tie_word_embeddings)
    except ValueError as err:
        fail(str(err))
    head_dim = field("head_dim", int, config.head_dim, "an integer")
    if head_dim != config.head_dim:
        fail(f"head_dim={head_dim} != hidden_size/num_attention_heads = {config.head_dim}")
    return config


def _hf_to_ours(config: Qwen2Config) -> dict[str, tuple[tuple[str, ...], bool]]:
    """HF tensor name -> (our parameter path, transpose?)."""
    table = {"model.embed_tokens.weight": (("embed_tokens", "embedding"), False),
             "model.norm.weight": (("norm", "weight"), False)}
    if not config.tie_word_embeddings:
        table["lm_head.weight"] = (("lm_head", "kernel"), True)
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", f"layers_{i}"
        for proj in ("q_proj", "k_proj", "v_proj"):
            table[hf + f"self_attn.{proj}.weight"] = ((ours, "self_attn", proj, "kernel"), True)
            table[hf + f"self_attn.{proj}.bias"] = ((ours, "self_attn", proj, "bias"), False)
        table[hf + "self_attn.o_proj.weight"] = ((ours, "self_attn", "o_proj", "kernel"), True)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            table[hf + f"mlp.{proj}.weight"] = ((ours, "mlp", proj, "kernel"), True)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            table[hf + f"{norm}.weight"] = ((ours, norm, "weight"), False)
    return table


def _expected_shapes(config: Qwen2Config) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Shape of every parameter in the per-layer (``layers_{i}``) layout."""
    shapes = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        keys = tuple(k.key for k in path)
        if keys[0] == "layers":
            for i in range(config.num_hidden_layers):
                out[(f"layers_{i}", *keys[1:])] = tuple(leaf.shape[1:])
        else:
            out[keys] = tuple(leaf.shape)
    return out


def params_from_hf_tensors(tensors: dict[str, np.ndarray], config: Qwen2Config,
                           dtype=np.float32, source: str = "checkpoint") -> dict:
    """Maps HF-named tensors to our nested parameter dict; checks names, shapes and values
    (``CheckpointError`` naming ``source``, the checkpoint's path, and the tensor; NaN or inf
    anywhere is refused).

    With ``tie_word_embeddings`` the output layer is ``model.embed_tokens.weight``, as in
    ``transformers``, which ties the two and does not load a separate ``lm_head.weight``: one
    in the checkpoint is ignored, with a warning when it differs from the embeddings.
    """
    table = _hf_to_ours(config)
    expected = _expected_shapes(config)
    ignored = {"lm_head.weight"} if config.tie_word_embeddings else set()
    embeddings = tensors.get("model.embed_tokens.weight")
    if ignored & set(tensors) and embeddings is not None and not np.array_equal(
            np.asarray(tensors["lm_head.weight"]), np.asarray(embeddings)):
        warnings.warn(f"{source}: 'lm_head.weight' is ignored: config.json sets "
                      "tie_word_embeddings=true, so the output layer is "
                      "'model.embed_tokens.weight' (as in transformers), and this "
                      "lm_head.weight differs from it", stacklevel=2)
    unknown = sorted(set(tensors) - set(table) - ignored)
    if unknown:
        raise CheckpointError(f"{source} has tensors this Qwen2Config does not use: {unknown[:5]}"
                              f"{' ...' if len(unknown) > 5 else ''}")
    missing = sorted(set(table) - set(tensors))
    if missing:
        raise CheckpointError(f"{source} lacks tensors: {missing[:5]}"
                              f"{' ...' if len(missing) > 5 else ''}")
    params: dict = {}
    for hf_name, (path, transpose) in table.items():
        array = np.asarray(tensors[hf_name])
        if transpose:
            array = array.T
        if array.shape != expected[path]:
            raise CheckpointError(f"{source}: tensor {hf_name!r} has shape "
                             f"{tuple(tensors[hf_name].shape)}, the config expects "
                             f"{expected[path][::-1] if transpose else expected[path]}")
        array = array.astype(dtype)
        if not np.isfinite(array).all():
            raise CheckpointError(f"{source}: tensor {hf_name!r} holds non-finite values "
                                  f"({int(np.isnan(array).sum())} NaN, "
                                  f"{int(np.isinf(array).sum())} inf)")
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = array
    return stack_layers(params)


def params_to_hf_tensors(params: dict, config: Qwen2Config) -> dict[str, np.ndarray]:
    """Inverse of `params_from_hf_tensors` (exports our parameters under HF names)."""
    out, params = {}, unstack_layers(params)
    for hf_name, (path, transpose) in _hf_to_ours(config).items():
        node = params
        for key in path:
            node = node[key]
        array = np.asarray(node)
        out[hf_name] = array.T if transpose else array
    return out


def load_hf_checkpoint(directory: str, dtype=np.float32) -> tuple[Qwen2Config, dict]:
    """Loads `directory/config.json` and its safetensors (single file or sharded index);
    ``CheckpointError`` naming the file and field or tensor if anything is malformed."""
    config_path = os.path.join(directory, "config.json")
    config = config_from_hf(_read_json(config_path, "model config"), config_path)
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index_path):
        weight_map = _read_json(index_path, "shard index")
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index_path}: 'weight_map' must map tensor names to file names")
        files = sorted(set(weight_map.values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(directory, name)))
    source = os.path.join(directory, files[0]) if len(files) == 1 else directory
    return config, params_from_hf_tensors(tensors, config, dtype, source)


# Files a Hugging Face model folder may hold: save_hf_model replaces only such a folder.
_HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json",
             "chat_template.jinja", "model.safetensors.index.json", "README.md")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
EXPORT_METADATA = "fresh_rl_export.json"


def _is_hf_model_folder(directory: str) -> bool:
    """Whether ``directory`` holds a config.json and safetensors weights and only files a
    Hugging Face model folder holds (no subfolders): the folders save_hf_model may replace."""
    names = os.listdir(directory)
    if "config.json" not in names or not any(n.endswith(".safetensors") for n in names):
        return False
    return all(os.path.isfile(os.path.join(directory, n)) and
               (n in _HF_FILES or n == EXPORT_METADATA or n.endswith(".safetensors"))
               for n in names)


def hf_config_dict(config: Qwen2Config, token_ids: dict | None = None,
                   dtype: str = "float32") -> dict:
    """config.json of ``config`` as transformers (>= 5) writes a Qwen2ForCausalLM's, with the
    fields :func:`config_from_hf` reads; ``token_ids``: bos / eos / pad token ids."""
    token_ids = token_ids or {}
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": token_ids.get("bos_token_id"),
        "dtype": dtype,
        "eos_token_id": token_ids.get("eos_token_id"),
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": config.intermediate_size,
        "layer_types": ["full_attention"] * config.num_hidden_layers,
        "max_position_embeddings": config.max_position_embeddings,
        "max_window_layers": config.num_hidden_layers,
        "model_type": "qwen2",
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "num_key_value_heads": config.num_key_value_heads,
        "pad_token_id": token_ids.get("pad_token_id"),
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
        "sliding_window": None,
        "tie_word_embeddings": config.tie_word_embeddings,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": config.vocab_size,
    }


def _token_ids(tokenizer_dir: str) -> tuple[dict, dict]:
    """(config.json token ids, generation_config.json token ids) for a model speaking the
    tokenizer of ``tokenizer_dir``: that folder's own files' where it has them (a model
    folder), else the tokenizer's eos / pad / bos (generation stops at eos and pad)."""
    from fresh_rl.llm.tokenizer import HFTokenizer

    fields = ("bos_token_id", "eos_token_id", "pad_token_id")
    tok = HFTokenizer.from_pretrained(tokenizer_dir)
    model = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id,
             "pad_token_id": tok.pad_id}
    generation = {**model, "eos_token_id": list(dict.fromkeys([tok.eos_id, tok.pad_id]))}
    for name, ids in (("config.json", model), ("generation_config.json", generation)):
        path = os.path.join(tokenizer_dir, name)
        if os.path.exists(path):
            found = _read_json(path, name)
            if isinstance(found, dict):
                ids.update({f: found[f] for f in fields if f in found})
    return model, generation


def save_hf_model(directory: str, config: Qwen2Config, params: dict, tokenizer_dir: str,
                  metadata: dict | None = None) -> str:
    """Writes ``params`` of ``config`` as a Hugging Face Qwen2ForCausalLM folder that
    :func:`load_hf_model` (every experiment's ``--model PATH``) and transformers'
    ``from_pretrained`` read: config.json (:func:`hf_config_dict`), model.safetensors
    (float32, HF names), generation_config.json, and tokenizer.json / tokenizer_config.json
    copied from ``tokenizer_dir`` (token ids: :func:`_token_ids`). ``metadata`` (JSON) goes
    to ``EXPORT_METADATA`` beside them (transformers ignores it).

    Atomic: written to a temporary folder beside ``directory`` and renamed into place, so a
    reader sees the old folder or the new one, never a partial one. An existing
    ``directory`` is replaced only if it is empty or a model folder (:func:`_is_hf_model_folder`);
    anything else raises ``FileExistsError``. Returns ``directory``."""
    directory = os.path.abspath(directory)
    if os.path.exists(directory) and not (os.path.isdir(directory) and (
            not os.listdir(directory) or _is_hf_model_folder(directory))):
        raise FileExistsError(f"{directory} exists and is not a Hugging Face model folder: "
                              "refusing to overwrite it")
    for name in TOKENIZER_FILES:
        if not os.path.isfile(os.path.join(tokenizer_dir, name)):
            raise FileNotFoundError(f"{tokenizer_dir} lacks {name} (save_hf_model copies the "
                                    "tokenizer from it)")
    tensors = {k: np.asarray(v, np.float32) for k, v in params_to_hf_tensors(params, config).items()}
    if not all(np.isfinite(t).all() for t in tensors.values()):
        raise ValueError(f"refusing to save non-finite parameters to {directory}")
    model_ids, generation_ids = _token_ids(tokenizer_dir)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
    try:
        write_safetensors(os.path.join(staging, "model.safetensors"), tensors,
                          metadata={"format": "pt"})
        files = {"config.json": hf_config_dict(config, model_ids),
                 "generation_config.json": {"_from_model_config": True, **generation_ids,
                                            "use_cache": True}}
        if metadata is not None:
            files[EXPORT_METADATA] = metadata
        for name, content in files.items():
            write_atomic(os.path.join(staging, name), json.dumps(content, indent=2) + "\n")
        for name in TOKENIZER_FILES:
            with open(os.path.join(tokenizer_dir, name), "rb") as source:
                write_atomic(os.path.join(staging, name), source.read())
        os.chmod(staging, 0o755)
        if os.path.exists(directory):  # two renames: the old folder moves aside, then goes
            retired = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.old-", dir=parent)
            os.rename(directory, os.path.join(retired, "old"))
            os.rename(staging, directory)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.rename(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def add_model_flag(parser) -> None:
    """``--model PATH`` of the LLM experiments (read with :func:`load_hf_model`)."""
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="a Hugging Face model folder with its tokenizer (config.json, "
                             "*.safetensors, tokenizer.json, tokenizer_config.json; e.g. "
                             "Qwen2.5-0.5B-Instruct): its weights replace the preset model's "
                             "and the tasks speak its tokenizer and chat template")


def load_hf_model(directory: str, dtype=np.float32):
    """``(config, params, vocab)`` of a Hugging Face model folder with its tokenizer
    (tokenizer.json, tokenizer_config.json; e.g. Qwen2.5-0.5B-Instruct): the model as
    :func:`load_hf_checkpoint` and the task vocabulary
    (:meth:`fresh_rl.llm.tasks.vocab.TaskVocab.from_pretrained`) its tasks must speak."""
    from fresh_rl.llm.tasks.vocab import TaskVocab

    config, params = load_hf_checkpoint(directory, dtype)
    return config, params, TaskVocab.from_pretrained(directory)
