"""Sharding of the Qwen2 RL state and programs over a ``("data", "fsdp", "tensor")`` mesh.

The mesh (:func:`make_mesh`) has three named axes, sizes from :class:`MeshConfig`:

* ``"data"``: data parallelism; the batch is split, the weights are not.
* ``"fsdp"``: fully sharded data parallelism; the batch *and* the weights (and so the AdamW
  moments) are split, XLA gathers a weight where a matmul needs it.
* ``"tensor"``: Megatron-style tensor parallelism inside a layer: q/k/v and the MLP's
  gate/up are split by output column, o_proj and down_proj by input row, the (tied)
  embedding by vocabulary row, so attention heads and MLP channels stay local.

**Parameter specs** (:data:`PARAM_RULES`, trailing dimensions of each parameter by its
``(module, parameter)`` names; everything else, i.e. the RMSNorm weights and scalars, is
replicated)::

    embed_tokens/embedding  [V, H]        ("tensor", "fsdp")
    lm_head/kernel          [H, V]        ("fsdp", "tensor")   (untied heads only)
    q,k,v_proj/kernel       [H, heads·D]  ("fsdp", "tensor")   q,k,v_proj/bias ("tensor",)
    o_proj/kernel           [heads·D, H]  ("tensor", "fsdp")
    gate,up_proj/kernel     [H, I]        ("fsdp", "tensor")
    down_proj/kernel        [I, H]        ("tensor", "fsdp")

Any leading dimensions beyond the rule are left unsplit: the stacked layer axis L of
``params["layers"]``, the ring axis K of :class:`fresh_rl.lag.version_ring.VersionRing`,
and a sweep's row axis (below). Because the rule is keyed by the leaf's trailing path names,
one function (:func:`param_specs`) gives the specs of the parameters, of the optax state
(AdamW's ``mu``/``nu`` mirror the parameter paths, its counters are scalars), of the version
ring and of the EWMA reference, i.e. of a whole ``TrainState`` or ``AsyncState``.

**Fallback.** A mesh axis that does not divide the dimension it would split is dropped for
that dimension of that leaf (the leaf is replicated over that axis; its other dimensions keep
their split), e.g. on ``tensor=4`` the 0.5B k_proj kernel ``[896, 128]`` splits its 128
columns, but a KV cache's 2 KV heads do not split, so the cache is replicated over
``"tensor"``. A vocabulary not divisible by ``tensor`` leaves the embedding unsplit by rows.

**KV cache** ``[L, B, S, H_kv, D]``: ``(None, ("data", "fsdp"), None, "tensor", None)``
(:func:`kv_cache_specs`, for a caller that holds a cache; the sampler builds its own inside
the program, where XLA propagates the layout from the weights and the prompts).
**Batch arrays** ``[B, ...]``: the batch axis over ``("data", "fsdp")`` (:func:`batch_spec`).

**Numerics.** A split contraction (fsdp-split rows, row-parallel o_proj / down_proj) adds
partial sums in another order than one device. In float32 the sharded iteration agrees with
the unsharded one to ~1e-6 (tests/test_llm_sharding.py); the bf16 sampler's logits can move
by one bf16 ulp, which changes a sampled token wherever two candidates tie to that precision,
so a sharded run samples the same distribution but not always the same tokens.

**Seed / sweep rows.** A vmapped sweep stacks R runs on a leading row axis
(:func:`fresh_rl.llm.trainer.stack_rows`). For a small model whose whole run fits on one
device, use ``MeshConfig(data=D)`` and ``row_axis=True``: the row axis is split over
``"data"`` (each device runs R / D whole runs, as :func:`fresh_rl.sweep.run_sharded`'s
``"grid"`` axis does), the weights of a row follow the rules above on ``"fsdp"`` /
``"tensor"`` (size 1: unsplit), and a row's batch is split over ``"fsdp"`` only. R not
divisible by D falls back to replication like any other dimension.

Every function works unchanged on one device (``MeshConfig()``, all sizes 1), and nothing is
pinned to device 0: placement comes only from the mesh.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from fresh_rl.llm.model import KVCache, Qwen2Config
from fresh_rl.llm.trainer import RLConfig, iteration
from fresh_rl.validation import require_int

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

PARAM_RULES: dict[tuple[str, str], tuple[str, ...]] = {
    ("embed_tokens", "embedding"): ("tensor", "fsdp"),
    ("lm_head", "kernel"): ("fsdp", "tensor"),
    **{(name, "kernel"): ("fsdp", "tensor")
       for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
    **{(name, "bias"): ("tensor",) for name in ("q_proj", "k_proj", "v_proj")},
    ("o_proj", "kernel"): ("tensor", "fsdp"),
    ("down_proj", "kernel"): ("tensor", "fsdp"),
}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the mesh axes; each an integer ≥ 1, their product the device count."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self):
        for name in AXES:
            require_int(f"MeshConfig.{name}", getattr(self, name), 1)

    @classmethod
    def of(cls, mesh: Mesh) -> "MeshConfig":
        """The config of an existing mesh with the axes :data:`AXES`."""
        return cls(**{name: mesh.shape[name] for name in AXES})

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data, self.fsdp, self.tensor)

    @property
    def num_devices(self) -> int:
        return self.data * self.fsdp * self.tensor

    def size(self, axes) -> int:
        """Devices along ``axes`` (a name, a tuple of names, or None = 1)."""
        if axes is None:
            return 1
        names = (axes,) if isinstance(axes, str) else axes
        return int(np.prod([getattr(self, name) for name in names]))


def make_mesh(config: MeshConfig, devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    """``Mesh`` of shape ``(data, fsdp, tensor)`` over ``devices`` (default ``jax.devices()``),
    axes compiler-propagated (``AxisType.Auto``); ``ValueError`` unless the product of the
    sizes equals the device count."""
    devices = list(jax.devices() if devices is None else devices)
    if config.num_devices != len(devices):
        raise ValueError(
            f"MeshConfig.data × MeshConfig.fsdp × MeshConfig.tensor = {config.data} × "
            f"{config.fsdp} × {config.tensor} = {config.num_devices} must equal the device "
            f"count {len(devices)}")
    return Mesh(np.asarray(devices).reshape(config.shape), AXES,
                axis_types=(AxisType.Auto,) * len(AXES))


def _fit(shape, dims, config: MeshConfig) -> PartitionSpec:
    """``PartitionSpec(*dims)`` with every entry that does not divide its dimension dropped."""
    return PartitionSpec(*(axes if axes is not None and size % config.size(axes) == 0 else None
                           for size, axes in zip(shape, dims)))


def _path_names(path) -> tuple[str, ...]:
    names = []
    for entry in path:
        if isinstance(entry, jax.tree_util.DictKey):
            names.append(str(entry.key))
        elif isinstance(entry, jax.tree_util.GetAttrKey):
            names.append(entry.name)
    return tuple(names)


def leaf_spec(names: tuple[str, ...], shape: tuple[int, ...], config: MeshConfig,
              row_axis: bool = False) -> PartitionSpec:
    """Spec of one leaf from its path ``names`` (see the module docstring): the rule of its
    trailing ``(module, parameter)`` names on its trailing dimensions, leading dimensions
    unsplit except, with ``row_axis``, the first over ``"data"``."""
    rule = PARAM_RULES.get(names[-2:], ())
    if len(shape) < len(rule) + row_axis:
        rule = ()
    lead = [None] * (len(shape) - len(rule))
    if row_axis and shape:
        lead[0] = "data"
    return _fit(shape, (*lead, *rule), config)


def param_specs(tree: Any, config: MeshConfig, row_axis: bool = False) -> Any:
    """``PartitionSpec`` of every leaf of ``tree``: parameters, a ``TrainState`` (optimizer
    state included), an ``AsyncState`` (version ring, EWMA reference) or their abstract
    shapes; ``row_axis``: every leaf has a leading sweep row axis split over ``"data"``."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: leaf_spec(_path_names(path), np.shape(x), config, row_axis), tree)


def batch_spec(shape: tuple[int, ...], config: MeshConfig, row_axis: bool = False
               ) -> PartitionSpec:
    """Batch array ``[B, ...]``: B over ``("data", "fsdp")``; with ``row_axis``
    (``[R, B, ...]``) R over ``"data"`` and B over ``"fsdp"``."""
    lead = ("data", "fsdp") if row_axis else (BATCH_AXES,)
    return _fit(shape, (*lead, *([None] * (len(shape) - len(lead)))), config)


def kv_cache_specs(model_config: Qwen2Config, batch: int, num_slots: int,
                   config: MeshConfig) -> KVCache:
    """``KVCache`` of specs for ``[L, B, S, H_kv, D]``: batch over ``("data", "fsdp")``, KV
    heads over ``"tensor"`` (each dimension replicated where its axis does not divide it)."""
    shape = (model_config.num_hidden_layers, batch, num_slots,
             model_config.num_key_value_heads, model_config.head_dim)
    spec = _fit(shape, (None, BATCH_AXES, None, "tensor", None), config)
    return KVCache(keys=spec, values=spec)


def named(specs: Any, mesh: Mesh) -> Any:
    """``NamedSharding`` on ``mesh`` of every ``PartitionSpec`` of ``specs``."""
    return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), specs,
                                  is_leaf=lambda x: isinstance(x, PartitionSpec))


def state_shardings(state: Any, mesh: Mesh, row_axis: bool = False) -> Any:
    """``NamedSharding`` of every leaf of ``state`` (concrete or abstract) by
    :func:`param_specs` on ``mesh``."""
    return named(param_specs(state, MeshConfig.of(mesh), row_axis), mesh)


def shard_state(state: Any, mesh: Mesh, row_axis: bool = False) -> Any:
    """``state`` placed by :func:`state_shardings` (from wherever it was, e.g. the device 0
    placement of ``init_train_state``)."""
    return jax.device_put(state, state_shardings(state, mesh, row_axis))


def sharded_iteration(config: RLConfig, env, model_config: Qwen2Config, mesh: Mesh,
                      state: Any, donate: bool = True):
    """``jax.jit`` of :func:`fresh_rl.llm.trainer.iteration` with the state in and out
    sharded by :func:`state_shardings` (of ``state``, concrete or abstract), the key and the
    metrics replicated; XLA propagates the rest. ``donate`` (default, as
    :func:`~fresh_rl.llm.trainer.make_iteration`): the input state's buffers are reused for
    the output, so neither it nor the arrays it was placed from may be read afterwards
    (``device_put`` may share a buffer with them, e.g. a leaf already in place; a state from
    ``init_train_state`` owns its buffers)."""
    shardings = state_shardings(state, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(lambda state, key: iteration(state, key, config=config, env=env,
                                                model_config=model_config),
                   in_shardings=(shardings, replicated), out_shardings=(shardings, replicated),
                   donate_argnums=(0,) if donate else ())


__all__ = ["AXES", "BATCH_AXES", "MeshConfig", "PARAM_RULES", "batch_spec", "kv_cache_specs",
           "leaf_spec", "make_mesh", "named", "param_specs", "shard_state", "sharded_iteration",
           "state_shardings"]
