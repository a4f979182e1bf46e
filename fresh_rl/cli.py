"""``fresh-rl`` / ``python -m fresh_rl``: one entry point for runs, sweeps, experiments, figures.

    fresh-rl train --help                       # every TrainConfig field with its default
    fresh-rl train --env_name Acrobot-v1 --method vaco --vaco.delta 0.1 --lag 4 \\
        --out runs/acrobot --checkpoint-every 10
    fresh-rl sweep --method vaco --seeds 8 --grid lag=0,4,8 --grid vaco_delta=0.1,0.2 --out runs/grid
    fresh-rl experiment vaco_lag_sweep --scale ci   # experiments/<name>.py (source checkout)
    fresh-rl figures vaco_lag_sweep --scale cpu     # remake figures from saved runs (no recompute)
    fresh-rl presets [vaco_forward_lag]             # the studies' presets, or one's fields

Config fields become ``--name value`` options; nested configs use dotted names
(``--vaco.delta``, ``--ppo_clip.epsilon``); tuples take comma-separated values
(``--hidden_sizes 64,64``); booleans take true/false; ``None`` (capitalised) unsets an
optional field; integers may be written ``1e6``, negative values as ``--adam_eps -1e-5``. A
value of the wrong type or out of range, an option given twice, or one the method or task
ignores (``--vaco.delta`` with ``--method ppo_clip``, ``--init_log_std`` with discrete actions)
exits at once naming the option (``--num_envs expects an integer, got 'abc'``). ``--out`` must
be a writable (or creatable) folder, checked before any work; a run records its identity in
``<out>/run.json`` first and refuses a folder that another run owns, naming what differs
(``--out swo belongs to another run: seed 0 → 5``); without ``--out`` each run gets a fresh
``runs/<train|sweep>-<time>-<hash>`` folder. Every file is written whole or not at all (a
failed write keeps the previous one); Ctrl-C exits 130 printing the command that resumes the
run. ``--lag k`` is a shortcut
for a fixed delay with a ring just large enough. Metrics go to ``metrics.csv`` and ``metrics.jsonl`` (one
row per iteration; sweeps add one column per grid value) and, with ``--tensorboard``, to
TensorBoard event files (needs the ``tensorboardX`` package).

``sweep --grid NAME=v1,v2`` takes any field of :class:`fresh_rl.control.HyperParams` (lag,
vaco_delta, learning_rate, entropy_coef, value_coef, kl_coef, gamma) that the method uses
(``Method.hyperparams``), once: the grid is one compiled program, its values are range-checked
before it is compiled. Seed ``s`` is the run key ``PRNGKey(s)`` in ``train --seed s`` and in every sweep that
includes it (``--seed b --seeds S`` runs seeds b … b + S − 1; docs/sweeps.md). Compiled programs
are kept in JAX's persistent compilation cache (``fresh_rl.compilation_cache``; folder
``$FRESH_RL_COMPILATION_CACHE_DIR`` or ``~/.cache/fresh_rl/xla``, off with
``--no-compilation-cache`` or ``FRESH_RL_COMPILATION_CACHE=0``); XLA:CPU's false "+prefer-no-gather
is not supported on the host machine" lines on loading them are dropped from stderr. ``--checked`` (off by default:
a debug switch) compiles the programs with the traced range checks of :func:`fresh_rl.checked`
and stops at the first value out of range (``fresh-rl: a traced check failed: delta must be in
…``), for a recompile and about 1.5× the run time of a step (results/bench/checkify.md).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import re
import runpy
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from fresh_rl.compilation_cache import add_compilation_cache_flag, enable_from_args, filter_cpu_cache_load_noise
from fresh_rl.fields import field_type, flat_fields, parse_scalar, parse_value
from fresh_rl.sweep.keys import MAX_SEED
from fresh_rl.validation import CHECKED_HELP, checked, require_int, require_output_dir, traced_check_message

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


# ----------------------------------------------------------------------------- typed configs


class _Typed(argparse.Action):
    """Stores ``parse(text)``; a ``ValueError`` exits with ``--name expects …, got '…'``."""

    def __init__(self, option_strings, dest, parse, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.parse = parse

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("given_options", {})
        if self.dest in given:
            parser.error(f"{option_string} is given twice ({given[self.dest]!r} and {values!r}); give it once")
        given[self.dest] = values
        try:
            setattr(namespace, self.dest, self.parse(values))
        except ValueError as err:
            parser.error(f"{option_string} {err}")


def _int_in(low: int, high: float = math.inf):
    """A ``_Typed`` parser of integers in ``[low, high]``."""
    def parse(text: str) -> int:
        try:
            value = parse_scalar(text, int)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            bound = "inf)" if high == math.inf else f"{high}]"
            raise ValueError(f"expects an integer in [{low}, {bound}, got {text!r}")
        return value
    return parse


def add_config_arguments(parser: argparse.ArgumentParser, cls) -> None:
    """One ``--field`` option per (nested) field of ``cls``, help text showing the default."""
    group = parser.add_argument_group(f"{cls.__name__} fields")
    for name, owner, field, default in flat_fields(cls):
        kind = field_type(owner, field)
        group.add_argument(f"--{name}", dest=f"cfg:{name}", default=None, metavar="VALUE", action=_Typed,
                           parse=functools.partial(parse_value, kind=kind, default=default),
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
    """``metrics.csv`` and ``metrics.jsonl`` (and TensorBoard events) from per-step dict rows,
    each file written whole or not at all (:func:`fresh_rl.provenance.write_atomic`)."""
    from fresh_rl.provenance import write_atomic, write_csv

    out.mkdir(parents=True, exist_ok=True)
    if not rows:
        return
    write_csv(out / "metrics.csv", rows)
    write_atomic(out / "metrics.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
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


def _refuse_unused_options(args, config) -> None:
    """``ValueError`` for a given option the run would ignore: another method's loss settings,
    or ``--init_log_std`` (the Gaussian policy's) on a task with discrete actions."""
    from fresh_rl.control.methods import METHODS

    given = [k[4:] for k, v in vars(args).items() if k.startswith("cfg:") and v is not None]
    method_only = {head for m in METHODS.values() for head in m.loss_config}
    uses = config.method_spec.loss_config
    for name in given:
        head = name.partition(".")[0]
        if head in method_only and head not in uses:
            raise ValueError(f"--{name} has no effect: method {config.method!r} reads "
                             f"{', '.join(f'--{u}' for u in uses) or 'no loss settings'}, not --{head}")
    if "init_log_std" in given and config.vec_env.spec.discrete:
        raise ValueError(f"--init_log_std has no effect: {config.env_name} has discrete actions "
                         "(it sets the log-std of a Gaussian policy, for continuous actions)")


def _output_folder(args, kind: str, identity: dict) -> Path:
    """``--out``, or a fresh ``runs/<kind>-<time>-<hash>`` folder when not given (printed)."""
    from fresh_rl.sweep.identity import default_output

    if args.out is None:
        args.out = str(default_output(kind, identity))
        print(f"no --out given: writing to {args.out}")
        require_output_dir("--out", args.out)
    return Path(args.out)


def _claim(args, identity: dict) -> None:
    """Record ``identity`` in ``--out`` before any work (``RunIdentityError`` if another run owns it)."""
    from fresh_rl.provenance import COMMIT_AT_START
    from fresh_rl.sweep.identity import claim_folder

    claim_folder(args.out, identity, {"commit": COMMIT_AT_START, "command": _command(args)})


def _command(args) -> str:
    """The command line that (re)runs this run, ``--out`` included."""
    given = any(a == "--out" or a.startswith("--out=") for a in args.argv)
    argv = [*args.argv, *([] if given else ["--out", str(args.out)])]
    return " ".join(["fresh-rl", *argv])


def cmd_train(args) -> None:
    from fresh_rl.control import HyperParams, init_state, train_iteration
    from fresh_rl.sweep import RunCheckpointer, output_lock, progress_printer, run_loop, seed_key, split_run_key
    from fresh_rl.sweep.identity import config_fields, fingerprint

    if args.out is not None:
        require_output_dir("--out", args.out)
    config = _control_config(args)
    hparams = HyperParams.from_config(config)
    hparams.validate(config)
    _refuse_unused_options(args, config)
    identity = {"command": "train", "seed": args.seed, **config_fields(config)}
    out = _output_folder(args, "train", identity)
    key_init, key_loop = split_run_key(seed_key(args.seed))
    every = args.checkpoint_every or config.num_iterations
    with output_lock(out):  # one writer per folder, owned by one run (the seed included)
        _claim(args, identity)
        checkpointer = RunCheckpointer(out / "checkpoints", fingerprint=fingerprint(identity))
        _, metrics = run_loop(
            lambda state, key: train_iteration(config, state, key, hparams),
            init_state(config, key_init, hparams), key_loop, config.num_iterations,
            steps_per_call=every, checkpointer=checkpointer, checkpoint_every=every,
            on_progress=progress_printer(f"{config.method} on {config.env_name}"),
        )
        write_metrics(out, _metric_rows(metrics), args.tensorboard)
    last = np.asarray(metrics["episode_return"])[-max(1, config.num_iterations // 10):].mean()
    print(f"final episode return (last 10% of iterations): {last:.2f}; metrics in {out}")


def _parse_grid(items: Sequence[str]) -> dict[str, list]:
    """``["lag=0,4", "learning_rate=1e-3,3e-4"]`` → ``{name: values}`` for any HyperParams leaf
    (ints for integer leaves, floats otherwise). A field given twice, a value listed twice or
    one that is not a number exits naming it; ranges are checked by ``HyperParams.validate``."""
    import jax.numpy as jnp

    from fresh_rl.control import HyperParams

    allowed = HyperParams.field_names()
    grid, given = {}, {}
    for item in items:
        name, _, values = item.partition("=")
        if name not in allowed or not values:
            raise SystemExit(f"--grid takes NAME=v1,v2,… with NAME in {allowed}, got {item!r}")
        if name in given:
            raise SystemExit(f"--grid {name} is given twice ({given[name]!r} and {item!r}); "
                             f"list every value once: --grid {name}=v1,v2,…")
        given[name] = item
        kind = int if jnp.issubdtype(HyperParams.dtype(name), jnp.integer) else float
        grid[name] = []
        for text in values.split(","):
            try:
                value = parse_scalar(text, kind)
            except ValueError as err:
                raise SystemExit(f"--grid {name} {err} (in {values!r})") from err
            if value in grid[name]:
                raise SystemExit(f"--grid {name} lists {value!r} twice (in {values!r})")
            grid[name].append(value)
    return grid


def sweep_grid(config, num_seeds: int, seed: int, grid_values: dict):
    """The sweep's grid points and their stacked HyperParams: ``product_grid`` of the seeds
    ``seed … seed + num_seeds − 1`` and ``grid_values`` (the one seed → key schedule).
    ``ValueError`` if the last seed is out of range or ``config.method`` ignores a swept field."""
    from fresh_rl.control import HyperParams
    from fresh_rl.sweep import product_grid

    require_int("--seed + --seeds - 1 (the last seed)", seed + num_seeds - 1, 0, MAX_SEED)
    uses = config.method_spec.hyperparams
    ignored = [name for name in grid_values if name not in uses]
    if ignored:
        raise ValueError(f"--grid {', '.join(ignored)}: method {config.method!r} does not use "
                         f"{'it' if len(ignored) == 1 else 'them'} (it uses {', '.join(uses)})")
    grid = product_grid(num_seeds, seed=seed, **grid_values)
    return grid, HyperParams.from_grid(config, grid.values, size=grid.size)


def cmd_sweep(args) -> None:
    from fresh_rl.control import TrainConfig, train
    from fresh_rl.lag import DelayConfig
    import jax

    from fresh_rl.sweep import RunCheckpointer, is_primary, nonfinite_cells, output_lock, run_sharded, to_host
    from fresh_rl.sweep.identity import config_fields, fingerprint

    if args.out is not None:
        require_output_dir("--out", args.out)
    grid_values = _parse_grid(args.grid)
    extra = {}
    if "lag" in grid_values:  # a ring for the largest lag; a negative lag is named by validate
        extra["delay"] = DelayConfig.fixed(0, max(0, *grid_values["lag"]) + 1)
    config = build_config(TrainConfig, args, **extra)
    _refuse_unused_options(args, config)
    grid, hparams = sweep_grid(config, args.seeds, args.seed, grid_values)
    hparams.validate(config)
    identity = {"command": "sweep", "seed": args.seed, "seeds": args.seeds,
                **{f"grid.{name}": values for name, values in grid_values.items()}, **config_fields(config)}
    fn = lambda key, hp: train(config, key, hp).metrics  # noqa: E731
    primary = is_primary()  # several processes (fresh-rl launch, pods): process 0 writes
    if args.out is None and jax.process_count() > 1:  # each process would name its own folder
        raise ValueError(f"--out is required for a sweep over {jax.process_count()} processes")
    _output_folder(args, "sweep", identity)
    with output_lock(args.out) if primary else contextlib.nullcontext():
        if primary:
            _claim(args, identity)
        checkpointer = None if args.chunk_size is None else RunCheckpointer(
            Path(args.out) / "checkpoints", fingerprint=fingerprint(identity))
        metrics = to_host(run_sharded(fn, grid.keys, hparams, chunk_size=args.chunk_size, pad=not args.no_pad,
                                      checkpointer=checkpointer))
        failed = nonfinite_cells(metrics)  # {cell: (first iteration, metric)}
        rows = []
        for i, point in enumerate(grid.rows):
            status = {"nonfinite_from_iteration": failed.get(i, (-1,))[0]}
            rows += _metric_rows({k: v[i] for k, v in metrics.items()}, point | status)
        if primary:
            write_metrics(Path(args.out), rows, args.tensorboard)
    if not primary:
        return
    print(f"{grid.size} runs ({args.seeds} seeds × {grid.size // args.seeds} values) over "
          f"{jax.process_count()} process(es), {jax.device_count()} device(s); metrics in {args.out}")
    if failed:
        cells = "; ".join(f"{grid.rows[i]} from iteration {step} ({name})" for i, (step, name) in failed.items())
        raise SystemExit(f"error: {len(failed)} of {grid.size} runs went non-finite (their rows are marked "
                         f"in column nonfinite_from_iteration, the others are complete): {cells}")


def cmd_launch(args) -> None:
    from fresh_rl.sweep import LaunchError, launch_local

    if not args.command_args or args.command_args[0] != "sweep":
        raise SystemExit("error: launch needs a command to run, e.g. `fresh-rl launch --processes 2 sweep "
                         f"--grid lag=0,4`, got {' '.join(args.command_args)!r}")
    try:
        outputs = launch_local([sys.executable, "-m", "fresh_rl", *args.command_args], args.processes,
                               args.devices_per_process, timeout_s=args.timeout)
    except LaunchError as err:
        raise SystemExit(f"error: {err}") from err
    print(outputs[0], end="")


def _run_script(name: str, argv: Sequence[str]) -> None:
    path = EXPERIMENTS / f"{name}.py"
    if not path.exists():
        known = sorted(p.stem for p in EXPERIMENTS.glob("*.py")) if EXPERIMENTS.exists() else []
        raise SystemExit(f"unknown experiment {name!r}; known: {known} "
                         "(experiments live in the source checkout, next to the package)")
    sys.argv = [str(path), *argv]
    runpy.run_path(str(path), run_name="__main__")


def study_presets(name: str) -> dict[str, Any]:
    """The presets ``experiments/<name>.py`` chooses ``--scale`` from: its module-level ``SCALES``
    mapping of :class:`fresh_rl.presets.Preset` (the script's top level runs, its ``main`` does
    not); empty for a script without one."""
    from fresh_rl.presets import Preset

    scales = runpy.run_path(str(EXPERIMENTS / f"{name}.py"), run_name="fresh_rl_presets").get("SCALES", {})
    return dict(scales) if all(isinstance(v, Preset) for v in scales.values()) else {}


def cmd_presets(args) -> None:
    """``fresh-rl presets``: each study script's presets; ``fresh-rl presets NAME``: one study's,
    every field with its value (what ``--set field=value`` changes)."""
    studies = sorted(p.stem for p in EXPERIMENTS.glob("*.py")) if EXPERIMENTS.exists() else []
    if args.study and args.study not in studies:
        raise SystemExit(f"unknown experiment {args.study!r}; known: {studies} "
                         "(experiments live in the source checkout, next to the package)")
    for study in [args.study] if args.study else studies:
        presets = study_presets(study)
        if not args.study:
            print(f"{study}: {', '.join(presets) if presets else '(no presets: its options are in --help)'}")
            continue
        for name, preset in presets.items():
            print(f"{study} --scale {name}  ({type(preset).__name__})")
            for field, value in preset.describe():
                print(f"    {field} = {value}")


def build_parser() -> argparse.ArgumentParser:
    from fresh_rl.control import HyperParams, TrainConfig

    parser = argparse.ArgumentParser(prog="fresh-rl", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    train_p = sub.add_parser("train", help="one control run with checkpoints (resumes if interrupted)")
    train_p.add_argument("--out", action=_Typed, parse=str, default=None,
                         help="output folder, owned by this run (default: a fresh runs/train-<time>-<hash>)")
    train_p.add_argument("--seed", action=_Typed, parse=_int_in(0, MAX_SEED), default=0,
                         help=f"run seed in [0, {MAX_SEED}] (default: 0)")
    train_p.add_argument("--lag", action=_Typed, parse=_int_in(0), default=None,
                         help="fixed backward lag k >= 0, < the number of iterations (shortcut for --delay)")
    train_p.add_argument("--checkpoint-every", action=_Typed, parse=_int_in(1), default=None,
                         help="iterations between checkpoints, >= 1 (default: one at the end)")
    train_p.add_argument("--tensorboard", action="store_true")
    add_config_arguments(train_p, TrainConfig)

    sweep_p = sub.add_parser("sweep", help="seeds × grid as one vmapped program sharded over all devices")
    sweep_p.add_argument("--out", action=_Typed, parse=str, default=None,
                         help="output folder, owned by this sweep (default: a fresh runs/sweep-<time>-<hash>)")
    sweep_p.add_argument("--seed", action=_Typed, parse=_int_in(0, MAX_SEED), default=0,
                         help="first seed (default: 0); seeds seed … seed + seeds − 1 are run")
    sweep_p.add_argument("--seeds", action=_Typed, parse=_int_in(1), default=5,
                         help="seeds per grid point (default: 5)")
    sweep_p.add_argument("--grid", action="append", default=[],
                         help="NAME=v1,v2 with NAME a HyperParams field the method uses (once each): "
                         + ", ".join(HyperParams.field_names()))
    sweep_p.add_argument("--chunk-size", action=_Typed, parse=_int_in(1), default=None,
                         help="grid points per program call; the results are checkpointed after each "
                         "chunk and a rerun continues after the last one")
    sweep_p.add_argument("--no-pad", action="store_true",
                         help="refuse a chunk that does not divide over the devices instead of padding it")
    sweep_p.add_argument("--tensorboard", action="store_true")
    add_config_arguments(sweep_p, TrainConfig)

    for p in (train_p, sweep_p):
        add_compilation_cache_flag(p)
        p.add_argument("--checked", action="store_true", help=CHECKED_HELP)

    launch_p = sub.add_parser("launch", help="run a command (e.g. a sweep) as several local JAX processes",
                              description="Start N JAX processes on this machine (coordinator on 127.0.0.1, "
                              "CPU collectives, simulated CPU devices each) running `fresh-rl COMMAND …`; "
                              "one grid spans them all and process 0 writes the results (docs/sweeps.md).")
    launch_p.add_argument("--processes", action=_Typed, parse=_int_in(1), default=2, help="number of processes")
    launch_p.add_argument("--devices-per-process", action=_Typed, parse=_int_in(1), default=1,
                          help="simulated CPU devices in each process")
    launch_p.add_argument("--timeout", action=_Typed, parse=_int_in(1), default=3600,
                          help="seconds before the whole launch is stopped (default: 3600)")
    launch_p.add_argument("command_args", nargs=argparse.REMAINDER, metavar="COMMAND …",
                          help="a fresh-rl command with its options, e.g. sweep --grid lag=0,4")

    presets_p = sub.add_parser("presets", help="the presets of every experiment script, or every field of one's")
    presets_p.add_argument("study", nargs="?", default=None, help="experiment script name, e.g. vaco_forward_lag")

    for name, helptext in (("experiment", "run experiments/<name>.py with the remaining arguments"),
                           ("figures", "remake an experiment's figures from its saved runs")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("name", help="experiment script name, e.g. vaco_lag_sweep")
    return parser


_NEGATIVE_VALUE = re.compile(r"-(\d|\.\d|inf|nan)[^\s]*", re.IGNORECASE)


def _join_negative_values(argv: list) -> list:
    """``--option -4,8`` → ``--option=-4,8``: argparse would read a negative value that is not a
    plain number (a list, ``-1e-5``) as an option; joined, it is parsed and range-checked."""
    joined = []
    for token in argv:
        previous = joined[-1] if joined else ""
        if _NEGATIVE_VALUE.fullmatch(token) and previous.startswith("--") and "=" not in previous:
            joined[-1] = f"{previous}={token}"
        else:
            joined.append(token)
    return joined


def main(argv: Optional[Sequence[str]] = None) -> Any:
    from fresh_rl.sweep.distributed import DistributedSetupError, initialize_distributed

    try:  # before anything touches a device (importing the trainers may): joins a multi-process run
        initialize_distributed()
    except DistributedSetupError as err:
        raise SystemExit(f"error: {err}") from err
    parser = build_parser()
    from_command_line = argv is None
    argv = _join_negative_values(sys.argv[1:] if argv is None else list(argv))
    args, rest = parser.parse_known_args(argv)
    args.argv = argv
    if args.command in ("experiment", "figures"):
        # Every experiment script resumes from its saved runs, so `figures` (the same call)
        # only redraws what `experiment` computed.
        return _run_script(args.name, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "presets":
        return cmd_presets(args)
    if args.command == "launch":
        return cmd_launch(args)
    folder = enable_from_args(args)
    if from_command_line:  # not in-process callers (tests capture fd 2)
        filter_cpu_cache_load_noise(folder)
    from jax.experimental import checkify

    from fresh_rl.provenance import OutputWriteError
    from fresh_rl.sweep import FolderLockedError, NonFiniteError

    try:
        with checked() if args.checked else contextlib.nullcontext():
            return {"train": cmd_train, "sweep": cmd_sweep}[args.command](args)
    except checkify.JaxRuntimeError as err:  # --checked: a value out of range inside a program
        raise SystemExit(f"fresh-rl: {traced_check_message(err)}") from err
    except (ValueError, NonFiniteError, FolderLockedError, DistributedSetupError) as err:
        # config validation, corrupt or foreign checkpoints, non-finite runs, locked folders
        raise SystemExit(f"error: {err}") from err
    except OSError as err:  # a full disk, an unwritable or virtual --out (/proc/…)
        where = "" if isinstance(err, OutputWriteError) else f"--out {args.out}: "
        raise SystemExit(f"fresh-rl: {where}{err}") from err
    except KeyboardInterrupt:
        restart = "" if args.command == "train" or args.chunk_size else " (it restarts: no --chunk-size)"
        print(f"fresh-rl: interrupted; resume with: {_command(args)}{restart}", file=sys.stderr)
        raise SystemExit(130) from None
