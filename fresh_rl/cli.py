"""``fresh-rl`` / ``python -m fresh_rl``: one entry point for runs, sweeps, experiments, figures.

    fresh-rl train --help                       # every TrainConfig field with its default
    fresh-rl train --env_name Acrobot-v1 --method vaco --vaco.delta 0.1 --lag 4 \\
        --out runs/acrobot --checkpoint-every 10
    fresh-rl sweep --method vaco --seeds 8 --grid lag=0,4,8 --grid vaco_delta=0.1,0.2 --out runs/grid
    fresh-rl experiment vaco_lag_sweep --scale ci   # experiments/<name>.py (source checkout)
    fresh-rl figures vaco_lag_sweep --scale cpu     # remake figures from saved runs (no recompute)

Config fields become ``--name value`` options; nested configs use dotted names
(``--vaco.delta``, ``--ppo_clip.epsilon``); tuples take comma-separated values
(``--hidden_sizes 64,64``); booleans take true/false; ``None`` (capitalised) unsets an
optional field. ``--lag k`` is a shortcut for a fixed
delay with a ring just large enough. Metrics go to ``metrics.csv`` and ``metrics.jsonl`` (one
row per iteration; sweeps add one column per grid value) and, with ``--tensorboard``, to
TensorBoard event files (needs the ``tensorboardX`` package).

``sweep --grid NAME=v1,v2`` takes any field of :class:`fresh_rl.control.HyperParams` (lag,
vaco_delta, learning_rate, entropy_coef, value_coef, kl_coef, gamma): the grid is one compiled
program. Seed ``s`` is the run key ``PRNGKey(s)`` in ``train --seed s`` and in every sweep that
includes it (``--seed b --seeds S`` runs seeds b … b + S − 1; docs/sweeps.md). Compiled programs
are kept in JAX's persistent compilation cache (``fresh_rl.compilation_cache``; folder
``$FRESH_RL_COMPILATION_CACHE_DIR`` or ``~/.cache/fresh_rl/xla``, off with
``--no-compilation-cache`` or ``FRESH_RL_COMPILATION_CACHE=0``).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import runpy
import sys
import typing
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from fresh_rl.compilation_cache import add_compilation_cache_flag, enable_from_args

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


# ----------------------------------------------------------------------------- typed configs


def _field_type(cls, field: dataclasses.Field):
    hints = typing.get_type_hints(cls)
    return hints.get(field.name, type(field.default))


def _parse_value(text: str, kind, default):
    origin = typing.get_origin(kind)
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if text == "None" and (origin is typing.Union or default is None):
        return None
    if origin is typing.Union and args:
        kind = args[0]
        origin = typing.get_origin(kind)
    if dataclasses.is_dataclass(kind):  # Optional[Config] given by its first field
        first = dataclasses.fields(kind)[0]
        return kind(**{first.name: _parse_value(text, _field_type(kind, first), None)})
    if kind is bool or isinstance(default, bool):
        if text.lower() not in ("true", "false", "1", "0"):
            raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
        return text.lower() in ("true", "1")
    if origin is tuple or isinstance(default, tuple):
        item = (typing.get_args(kind) or (int,))[0]
        item = int if item is Ellipsis else item
        return tuple(item(x) for x in text.split(",") if x)
    if kind in (int, float, str):
        return kind(text)
    if isinstance(default, (int, float, str)):
        return type(default)(text)
    raise argparse.ArgumentTypeError(f"cannot parse {text!r} as {kind}")


def _flat_fields(cls, prefix: str = ""):
    """(dotted name, owning class, field, default) for every leaf field of a config dataclass."""
    instance = cls() if prefix == "" else None
    for field in dataclasses.fields(cls):
        default = field.default if field.default is not dataclasses.MISSING else (
            field.default_factory() if field.default_factory is not dataclasses.MISSING else None)
        if instance is not None:
            default = getattr(instance, field.name)
        if dataclasses.is_dataclass(default):
            yield from _flat_fields(type(default), f"{prefix}{field.name}.")
        else:
            yield f"{prefix}{field.name}", cls, field, default


def add_config_arguments(parser: argparse.ArgumentParser, cls) -> None:
    """One ``--field`` option per (nested) field of ``cls``, help text showing the default."""
    group = parser.add_argument_group(f"{cls.__name__} fields")
    for name, owner, field, default in _flat_fields(cls):
        kind = _field_type(owner, field)
        group.add_argument(f"--{name}", dest=f"cfg:{name}", default=None, metavar="VALUE",
                           type=functools.partial(_parse_value, kind=kind, default=default),
                           help=f"(default: {default!r})")


def build_config(cls, args: argparse.Namespace, **extra):
    """An instance of ``cls`` with the ``--field`` overrides in ``args`` (validated by ``cls``)."""
    overrides = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg:") and v is not None}
    overrides.update(extra)
    nested: dict[str, dict] = {}
    top = {}
    for name, value in overrides.items():
        head, _, rest = name.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            top[name] = value
    base = cls()
    for head, fields in nested.items():
        top[head] = dataclasses.replace(getattr(base, head), **fields)
    return dataclasses.replace(base, **top)


# ----------------------------------------------------------------------------- metrics output


def write_metrics(out: Path, rows: Sequence[dict], tensorboard: bool = False) -> None:
    """``metrics.csv`` and ``metrics.jsonl`` (and TensorBoard events) from per-step dict rows."""
    out.mkdir(parents=True, exist_ok=True)
    if not rows:
        return
    names = list(rows[0])
    with open(out / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)
    with open(out / "metrics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    if tensorboard:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as err:
            raise SystemExit("--tensorboard needs the tensorboardX package: pip install tensorboardX") from err
        writer = SummaryWriter(str(out / "tensorboard"))
        for row in rows:
            for name, value in row.items():
                if name != "iteration" and isinstance(value, (int, float)):
                    writer.add_scalar(name, value, row.get("iteration", 0))
        writer.close()


def _metric_rows(metrics: dict, extra: Optional[dict] = None) -> list[dict]:
    arrays = {k: np.asarray(v) for k, v in metrics.items()}
    n = len(next(iter(arrays.values())))
    return [{**(extra or {}), "iteration": i, **{k: float(np.mean(v[i])) for k, v in arrays.items()}}
            for i in range(n)]


# ----------------------------------------------------------------------------- subcommands


def _control_config(args):
    from fresh_rl.control import TrainConfig
    from fresh_rl.lag import DelayConfig

    extra = {}
    if args.lag is not None:
        extra["delay"] = DelayConfig.fixed(args.lag, args.lag + 1)
    return build_config(TrainConfig, args, **extra)


def cmd_train(args) -> None:
    from fresh_rl.control import HyperParams, init_state, train_iteration
    from fresh_rl.sweep import RunCheckpointer, progress_printer, run_loop, seed_key, split_run_key

    config = _control_config(args)
    hparams = HyperParams.from_config(config)
    hparams.validate(config)
    out = Path(args.out)
    checkpointer = RunCheckpointer(out / "checkpoints", fingerprint=repr(config))
    key_init, key_loop = split_run_key(seed_key(args.seed))
    every = args.checkpoint_every or config.num_iterations
    _, metrics = run_loop(
        lambda state, key: train_iteration(config, state, key, hparams),
        init_state(config, key_init, hparams), key_loop, config.num_iterations,
        steps_per_call=every, checkpointer=checkpointer, checkpoint_every=every,
        on_progress=progress_printer(f"{config.method} on {config.env_name}"),
    )
    write_metrics(out, _metric_rows(metrics), args.tensorboard)
    (out / "config.txt").write_text(repr(config) + "\n")
    last = np.asarray(metrics["episode_return"])[-max(1, config.num_iterations // 10):].mean()
    print(f"final episode return (last 10% of iterations): {last:.2f}; metrics in {out}")


def _parse_grid(items: Sequence[str]) -> dict[str, list]:
    """``["lag=0,4", "learning_rate=1e-3,3e-4"]`` → ``{name: values}`` for any HyperParams leaf
    (ints for integer leaves, floats otherwise)."""
    import jax.numpy as jnp

    from fresh_rl.control import HyperParams

    allowed = HyperParams.field_names()
    grid = {}
    for item in items:
        name, _, values = item.partition("=")
        if name not in allowed or not values:
            raise SystemExit(f"--grid takes NAME=v1,v2,… with NAME in {allowed}, got {item!r}")
        kind = int if jnp.issubdtype(HyperParams.dtype(name), jnp.integer) else float
        try:
            grid[name] = [kind(v) for v in values.split(",")]
        except ValueError as err:
            raise SystemExit(f"--grid {name}: expected {kind.__name__} values, got {values!r}") from err
    return grid


def sweep_grid(config, num_seeds: int, seed: int, grid_values: dict):
    """The sweep's grid points and their stacked HyperParams: ``product_grid`` of the seeds
    ``seed … seed + num_seeds − 1`` and ``grid_values`` (the one seed → key schedule)."""
    from fresh_rl.control import HyperParams
    from fresh_rl.sweep import product_grid

    grid = product_grid(num_seeds, seed=seed, **grid_values)
    return grid, HyperParams.from_grid(config, grid.values, size=grid.size)


def cmd_sweep(args) -> None:
    from fresh_rl.control.train import TrainConfig, train
    from fresh_rl.lag import DelayConfig
    from fresh_rl.sweep import run_sharded, to_host

    grid_values = _parse_grid(args.grid)
    extra = {}
    if "lag" in grid_values:
        extra["delay"] = DelayConfig.fixed(0, max(grid_values["lag"]) + 1)
    config = build_config(TrainConfig, args, **extra)
    grid, hparams = sweep_grid(config, args.seeds, args.seed, grid_values)
    hparams.validate(config)
    fn = lambda key, hp: train(config, key, hp).metrics  # noqa: E731
    metrics = to_host(run_sharded(fn, grid.keys, hparams, chunk_size=args.chunk_size))
    rows = []
    for i, point in enumerate(grid.rows):
        rows += _metric_rows({k: v[i] for k, v in metrics.items()}, point)
    write_metrics(Path(args.out), rows, args.tensorboard)
    print(f"{grid.size} runs ({args.seeds} seeds × {grid.size // args.seeds} values); metrics in {args.out}")


def _run_script(name: str, argv: Sequence[str]) -> None:
    path = EXPERIMENTS / f"{name}.py"
    if not path.exists():
        known = sorted(p.stem for p in EXPERIMENTS.glob("*.py")) if EXPERIMENTS.exists() else []
        raise SystemExit(f"unknown experiment {name!r}; known: {known} "
                         "(experiments live in the source checkout, next to the package)")
    sys.argv = [str(path), *argv]
    runpy.run_path(str(path), run_name="__main__")


def build_parser() -> argparse.ArgumentParser:
    from fresh_rl.control import HyperParams, TrainConfig

    parser = argparse.ArgumentParser(prog="fresh-rl", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    train_p = sub.add_parser("train", help="one control run with checkpoints (resumes if interrupted)")
    train_p.add_argument("--out", default="runs/train", help="output directory (default: runs/train)")
    train_p.add_argument("--seed", type=int, default=0)
    train_p.add_argument("--lag", type=int, default=None, help="fixed backward lag k (shortcut for --delay)")
    train_p.add_argument("--checkpoint-every", type=int, default=None,
                         help="iterations between checkpoints (default: one at the end)")
    train_p.add_argument("--tensorboard", action="store_true")
    add_config_arguments(train_p, TrainConfig)

    sweep_p = sub.add_parser("sweep", help="seeds × grid as one vmapped program sharded over all devices")
    sweep_p.add_argument("--out", default="runs/sweep")
    sweep_p.add_argument("--seed", type=int, default=0)
    sweep_p.add_argument("--seeds", type=int, default=5, help="seeds per grid point (default: 5)")
    sweep_p.add_argument("--grid", action="append", default=[],
                         help="NAME=v1,v2 with NAME a HyperParams field: " + ", ".join(HyperParams.field_names()))
    sweep_p.add_argument("--chunk-size", type=int, default=None, help="grid points per program call")
    sweep_p.add_argument("--tensorboard", action="store_true")
    add_config_arguments(sweep_p, TrainConfig)

    for p in (train_p, sweep_p):
        add_compilation_cache_flag(p)

    for name, helptext in (("experiment", "run experiments/<name>.py with the remaining arguments"),
                           ("figures", "remake an experiment's figures from its saved runs")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("name", help="experiment script name, e.g. vaco_lag_sweep")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> Any:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command in ("experiment", "figures"):
        # Every experiment script resumes from its saved runs, so `figures` (the same call)
        # only redraws what `experiment` computed.
        return _run_script(args.name, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    enable_from_args(args)
    try:
        return {"train": cmd_train, "sweep": cmd_sweep}[args.command](args)
    except ValueError as err:  # config validation: name the field, no traceback
        raise SystemExit(f"error: {err}") from err
