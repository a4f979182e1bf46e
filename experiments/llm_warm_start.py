"""Supervised warm start of the tiny Qwen2-architecture LM on the four text tasks.

  .venv/bin/python experiments/llm_warm_start.py --scale cpu      # ~15 min on 2 CPU cores

Writes results/llm_warm_start/: success.csv (per task: success rate, return, format-ok
fraction and |log r_d| of the bf16 sampler vs the fp32 trainer, at temperature 1),
history.csv (training loss), config.json, checkpoint/ (orbax, float32 params) and README.md.
`--scale ci` is a minutes-long smoke run (written to --out, default results/llm_warm_start_ci
so it never overwrites the committed cpu results).

  .venv/bin/python experiments/llm_warm_start.py --specialize arithmetic   # ~15 min, 1 core

continues from the multi-task checkpoint on the arithmetic task alone (SPECIALIZE: rounds of
behaviour cloning, each a fresh warmup + cosine cycle) and writes
results/llm_warm_start_arithmetic/ (checkpoint, success.csv with the success at temperature 1
and greedy after every round, history.csv, README.md). The multi-task model answers 2–5% of
the arithmetic prompts; the specialised one answers about a fifth, the starting point of the
RL learning-rate probe (experiments/llm_rl_probe.py).

  .venv/bin/python experiments/llm_warm_start.py --scale bpe      # ~45 min on 2 CPU cores

trains the ~5M-parameter ``bpe-5m`` preset from scratch on the tasks speaking the BPE
stand-in's tokenizer (tests/fixtures/qwen2_bpe_tiny; presets.BPE_TASKS, BPE_CYCLE), evaluates
every task on held-out keys at every 1/8 of training and writes results/llm_warm_start_bpe/:
model/ (a Hugging Face Qwen2 folder with its tokenizer: ``--model`` of every experiment; the
checkpoint chosen by fresh_rl.llm.warm_start.select_checkpoint), evals.csv (every periodic evaluation),
success.csv (the chosen one's), history.csv, config.json, README.md. It is resumable: the
periodic checkpoints and the training state (params, optimizer state, step and histories:
a verified, fingerprinted fresh_rl.sweep.checkpoint.RunCheckpointer) live in checkpoints/
(git-ignored), and a rerun of the same command continues from the last one
(``--fresh`` starts over). ``--scale bpe-ci`` is the seconds-long smoke version (a 2-layer,
32-wide model, 4 steps; default --out results/llm_warm_start_bpe_ci).

``--model PATH`` (any Hugging Face folder with its tokenizer, e.g. Qwen2.5-0.5B-Instruct)
fine-tunes that model instead of a fresh tiny one (with --specialize: instead of the
multi-task checkpoint), the tasks speaking its tokenizer and chat template, e.g.:

  .venv/bin/python experiments/llm_warm_start.py --scale ci --model tests/fixtures/qwen2_bpe_tiny \
      --out /tmp/llm_warm_start_standin
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time

import jax

import numpy as np

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.llm.checkpoint import add_model_flag, load_hf_model, save_hf_model
from fresh_rl.llm.model import Qwen2Config, init_params, preset
from fresh_rl.llm.presets import (BPE_CYCLE, BPE_TASKS, CYCLE, RESULTS, SPECIALIZE, TASKS,
                                  WARM_START)
from fresh_rl.llm.tasks.vocab import TaskVocab, check_model_vocab, with_vocab
from fresh_rl.llm.warm_start import (WarmStartConfig, evaluate, make_task_metrics,
                                     make_optimizer, restore_params, save_params,
                                     select_checkpoint, warm_start)
from fresh_rl.presets import Preset, named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_csv
from fresh_rl.sweep.checkpoint import RunCheckpointer, RunIdentityError
from fresh_rl.sweep.keys import seed_key, split_run_key
from fresh_rl.sweep.study_cli import NO_CHECKED, start_study


@dataclasses.dataclass(frozen=True)
class WarmStartScale(Preset):
    """A scale of the character-level warm start: its training settings."""

    warm_start: WarmStartConfig


# Task settings, cycle and specialisation: fresh_rl.llm.presets (shared with the RL experiments).
CHAR_SCALES = named({
    "ci": WarmStartScale(WarmStartConfig(steps=24, batch_size=8, warmup_steps=4, eval_episodes=16)),
    "cpu": WarmStartScale(WarmStartConfig(steps=600, batch_size=16, warmup_steps=20, eval_episodes=128)),
    "paper": WarmStartScale(WarmStartConfig(steps=4000, batch_size=64, warmup_steps=100, eval_episodes=512)),
})


BPE_TOKENIZER = str(REPOSITORY_ROOT / "tests" / "fixtures" / "qwen2_bpe_tiny")


@dataclasses.dataclass(frozen=True)
class BpeScale(Preset):
    """A scale of the BPE warm start: the model (a preset name or a config) trained from
    scratch on presets.BPE_TASKS in the tokenizer of ``tokenizer``, evaluated (and
    checkpointed) ``evals`` times, every ``warm_start.steps // evals`` steps."""

    model: str | Qwen2Config
    warm_start: WarmStartConfig
    evals: int = 8
    tokenizer: str = BPE_TOKENIZER
    tasks: tuple[str, ...] | None = None  # a subset of BPE_TASKS (None: all)

    def __post_init__(self):
        if self.evals < 1 or self.warm_start.steps % self.evals:
            raise ValueError(f"BpeScale: evals={self.evals} must be >= 1 and divide "
                             f"steps={self.warm_start.steps}")

    @property
    def model_config(self) -> Qwen2Config:
        return preset(self.model) if isinstance(self.model, str) else self.model

    @property
    def task_names(self) -> tuple[str, ...]:
        return tuple(BPE_TASKS) if self.tasks is None else self.tasks

    @property
    def cycle(self) -> tuple[str, ...]:
        return tuple(name for name in BPE_CYCLE if name in self.task_names)


BPE_SCALES = named({
    # Sized by measurement (results/llm_warm_start_bpe/sizing.md): ~1.0 s per step of the
    # BPE_CYCLE mix at batch 16 on the 2 shared cores, ~40-80 s per evaluation of the 5 tasks
    # (lr 2e-3 learned every task more slowly per step than 1e-3 in a partial run).
    "bpe": BpeScale("bpe-5m", WarmStartConfig(steps=1600, batch_size=16, learning_rate=1e-3,
                                              warmup_steps=50, eval_episodes=128)),
    "bpe-ci": BpeScale(Qwen2Config(vocab_size=704, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=1024),
                       WarmStartConfig(steps=4, batch_size=2, warmup_steps=1, eval_episodes=2),
                       evals=2, tasks=("arithmetic",)),  # one task: compiles in seconds
})
# The success band the chosen checkpoint should lie in at temperature 1 (the target
# "roughly 0.2-0.5 on each task, not saturated"); the rule: warm_start.select_checkpoint.
BAND = (0.2, 0.5)
SCALES = {**CHAR_SCALES, **BPE_SCALES}  # what --scale chooses from (fresh-rl presets lists them)


def default_out(scale_name: str | None, specialize_task: str | None) -> str:
    """The output folder of a scale, or of ``--specialize`` on a task."""
    if specialize_task:
        return str(RESULTS / f"llm_warm_start_{specialize_task}")
    if scale_name in BPE_SCALES:
        return str(RESULTS / ("llm_warm_start_bpe" if scale_name == "bpe"
                              else f"llm_warm_start_{scale_name.replace('-', '_')}"))
    return str(RESULTS / ("llm_warm_start" if scale_name != "ci" else "llm_warm_start_ci"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=NO_CHECKED)
    parser.add_argument("--scale", choices=sorted(CHAR_SCALES) + sorted(BPE_SCALES), default="ci")
    parser.add_argument("--fresh", action="store_true",
                        help="take over an --out made by another run; bpe scales: also ignore (delete) the "
                             "saved training state and start over")
    parser.add_argument("--stop-after", type=int, default=None, metavar="STEPS",
                        help="bpe scales: stop at the first periodic evaluation at or after "
                             "STEPS steps (as an interruption would; rerun to continue)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None,
                        help="output folder (default results/llm_warm_start[_ci])")
    parser.add_argument("--specialize", choices=sorted(SPECIALIZE), default=None,
                        help="continue from results/llm_warm_start/checkpoint on one task")
    add_model_flag(parser)
    add_compilation_cache_flag(parser)
    args = parser.parse_args(argv)
    if args.scale in BPE_SCALES and args.model and not args.specialize:
        parser.error("--model does not apply to the bpe scales (they train from scratch)")
    out = args.out or default_out(args.scale, args.specialize)
    # --stop-after interrupts the same run; --specialize ignores --scale and --seed (its own)
    identity = ({"study": "llm_warm_start", "specialize": args.specialize, "model": args.model} if args.specialize
                else {"study": "llm_warm_start", "scale": args.scale, "seed": args.seed, "model": args.model})
    start_study(parser, args, identity, out, argv, fresh=args.fresh)
    if args.specialize:
        return specialize(args.specialize, out, argv, args.model)
    if args.scale in BPE_SCALES:
        return bpe_warm_start(args.scale, out, args.seed, args.fresh, argv,
                              stop_after=args.stop_after)
    model_config, params, tasks = load_model(args.model)
    os.makedirs(out, exist_ok=True)
    config = CHAR_SCALES[args.scale].warm_start
    start, started = time.time(), time.perf_counter()
    key_train, key_eval = split_run_key(seed_key(args.seed))
    params, history = warm_start(model_config, tasks, config, key_train, params=params,
                                 cycle=CYCLE)
    train_seconds = time.time() - start
    rows = []
    for name, env in tasks.items():
        metrics = evaluate(params, model_config, env, jax.random.fold_in(key_eval, len(rows)),
                           config.eval_episodes, config.eval_temperature)
        rows.append({"task": name, **metrics})
        print(name, metrics, flush=True)
    info = provenance(command=command(argv), started=started)
    wall = info["wall_seconds"]
    save_params(os.path.join(out, "checkpoint"), params)
    write_csv(os.path.join(out, "success.csv"), rows)
    write_csv(os.path.join(out, "history.csv"), history)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"scale": args.scale, "seed": args.seed, "model": args.model or "tiny", **info,
                   "warm_start": dataclasses.asdict(config), "cycle": CYCLE,
                   "tasks": {k: {"class": type(v).__name__, **dataclasses.asdict(v)}
                             for k, v in tasks.items()}}, f, indent=1)
    table = "\n".join(f"| {r['task']} | {r['success']:.3f} | {r['return']:.3f} | "
                      f"{r['format_ok']:.3f} | {r['abs_log_rd_mean']:.2e} | "
                      f"{r['abs_log_rd_max']:.2e} |" for r in rows)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(f"""# Supervised warm start of the tiny LM ({args.scale} scale)

{provenance_line(info)}
Wall time: {wall:.0f} s total, of which training {train_seconds:.0f} s
({config.steps} steps, batch {config.batch_size}, task cycle {list(CYCLE)}; includes compile).

Evaluation: {config.eval_episodes} episodes per task, bf16 KV-cache sampler at temperature
{config.eval_temperature}; success is the task's verifiable success. |log r_d| compares the
sampler's log-probs of its own action tokens with the float32 training forward.

| task | success | mean return | format ok | mean abs log r_d | max abs log r_d |
|---|---|---|---|---|---|
{table}

Task settings and the warm-start config: config.json. Training loss: history.csv.
Parameters: checkpoint/ (orbax StandardCheckpointer; restore with
`fresh_rl.llm.warm_start.restore_params(path, preset("tiny"))`).
""")
    print(f"wrote {out} in {wall:.0f} s")


def load_model(model: str | None):
    """(model_config, initial params, tasks): the tiny preset (fresh parameters, None) on
    the char vocabulary, or the Hugging Face folder ``model`` with the tasks speaking its
    tokenizer."""
    if model is None:
        return preset("tiny"), None, TASKS
    model_config, params, vocab = load_hf_model(model)
    return model_config, params, {name: with_vocab(env, vocab) for name, env in TASKS.items()}


def command(argv) -> str:
    """The command line of this run, as a user would retype it."""
    return " ".join(["python experiments/llm_warm_start.py"]
                    + list(argv if argv is not None else sys.argv[1:]))


def specialize(task: str, out: str | None, argv=None, model: str | None = None):
    """Rounds of behaviour cloning on ``task`` alone from the multi-task checkpoint (or the
    Hugging Face folder ``model``)."""
    out = out or default_out(None, task)
    os.makedirs(out, exist_ok=True)
    rounds, config, seed = SPECIALIZE[task]
    model_config, params, tasks = load_model(model)
    env = tasks[task]
    params = restore_params(WARM_START, model_config) if params is None else params
    key = seed_key(seed)
    started, rows, history = time.perf_counter(), [], []

    def evaluate_both(params, after):
        row = {"after_steps": after}
        for name, temperature in (("t1", 1.0), ("greedy", 0.0)):
            metrics = evaluate(params, model_config, env, key, config.eval_episodes, temperature)
            row.update({f"{k}_{name}": v for k, v in metrics.items()})
        rows.append(row)
        print(row, flush=True)

    evaluate_both(params, 0)
    for r in range(rounds):
        params, part = warm_start(model_config, {task: env}, config, jax.random.fold_in(key, r),
                                  params=params)
        history += [{**row, "round": r} for row in part]
        evaluate_both(params, (r + 1) * config.steps)
    info = provenance(command=command(argv), started=started)
    wall = info["wall_seconds"]
    save_params(os.path.join(out, "checkpoint"), params)
    write_csv(os.path.join(out, "success.csv"), rows)
    write_csv(os.path.join(out, "history.csv"), history)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"specialize": task, "rounds": rounds, "seed": seed, **info,
                   "init": model or "results/llm_warm_start/checkpoint",
                   "warm_start": dataclasses.asdict(config),
                   "task": {"class": type(env).__name__, **dataclasses.asdict(env)}}, f, indent=1)
    table = "\n".join(f"| {r['after_steps']} | {r['success_t1']:.3f} | {r['success_greedy']:.3f} "
                      f"| {r['format_ok_t1']:.3f} |" for r in rows)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(f"""# Arithmetic-specialised warm start of the tiny LM

{provenance_line(info)}

From results/llm_warm_start/checkpoint (the multi-task warm start), {rounds} rounds of
{config.steps} behaviour-cloning steps at batch {config.batch_size} on {type(env).__name__}
({dataclasses.asdict(env)}) alone, lr {config.learning_rate} with a {config.warmup_steps}-step
warmup and cosine decay per round. Evaluation: the same {config.eval_episodes} prompts each
time, bf16 sampler.

| after steps | success (temperature 1) | success (greedy) | format ok (temperature 1) |
|---|---|---|---|
{table}

The starting point of the RL learning-rate probe (experiments/llm_rl_probe.py;
results/old_logits/README.md): does RL improve arithmetic from a model that already answers a
fifth of the prompts? Parameters: checkpoint/ (restore with
`fresh_rl.llm.warm_start.restore_params(path, preset("tiny"))`).
""")
    print(f"wrote {out} in {wall:.0f} s")
    return out


# --------------------------------------------------------------------------- BPE warm start

STATE_DIR = "state"  # RunCheckpointer steps: params, optimizer state, meta


def _fingerprint(scale: BpeScale, seed: int, tasks: dict) -> dict:
    """What a saved training state must match to be resumed."""
    return json.loads(json.dumps({
        "seed": seed, "model": dataclasses.asdict(scale.model_config),
        "warm_start": dataclasses.asdict(scale.warm_start), "evals": scale.evals,
        "cycle": list(scale.cycle), "tasks": _task_settings(tasks)}, default=str))


def _task_settings(tasks: dict) -> dict:
    """Class and settings of each task (its vocabulary named by ``vocab_source``)."""
    return {name: {"class": type(env).__name__, "vocab_source": os.path.relpath(
        env.vocab.source, REPOSITORY_ROOT) if not env.vocab.is_char else "char",
        **{f.name: getattr(env, f.name) for f in dataclasses.fields(env) if f.name != "vocab"}}
        for name, env in tasks.items()}


class _Stopped(Exception):
    """--stop-after reached (the state of that step is saved)."""


def bpe_warm_start(scale_name: str, out: str | None, seed: int, fresh: bool, argv=None,
                   stop_after: int | None = None):
    """The BPE warm start (module docstring): trains, evaluates and checkpoints periodically,
    resumes from checkpoints/ when interrupted, writes the chosen HF folder to out/model.
    ``stop_after``: return (None) after the periodic evaluation at or past that step."""
    scale = BPE_SCALES[scale_name]
    config, model_config = scale.warm_start, scale.model_config
    out = out or default_out(scale_name, None)
    checkpoints = os.path.join(out, "checkpoints")  # git-ignored (results/**/checkpoints/)
    os.makedirs(checkpoints, exist_ok=True)
    state_path = os.path.join(checkpoints, STATE_DIR)
    if fresh:
        shutil.rmtree(state_path, ignore_errors=True)
    vocab = TaskVocab.from_pretrained(scale.tokenizer)
    tasks = {name: with_vocab(BPE_TASKS[name], vocab) for name in scale.task_names}
    for env in tasks.values():
        check_model_vocab(env, model_config)
    started = time.perf_counter()
    key_train, key_eval = split_run_key(seed_key(seed))
    params = init_params(model_config, jax.random.split(key_train)[0])  # warm_start's init
    opt_state = make_optimizer(config).init(params)
    fingerprint = _fingerprint(scale, seed, tasks)
    meta = {"step": 0, "seconds": 0.0, "history": [], "evals": [], "resumed_at": []}
    # the training state and its JSON meta (histories) in one verified, fingerprinted checkpoint
    checkpointer = RunCheckpointer(state_path, fingerprint=json.dumps(fingerprint, sort_keys=True))
    try:
        restored = checkpointer.restore_latest(jax.eval_shape(lambda: {"params": params,
                                                                       "opt_state": opt_state}))
    except RunIdentityError as err:
        raise RunIdentityError(f"{err}\n(or rerun with --fresh to start over)") from None
    if restored is not None:
        step, tree = restored
        params, opt_state, meta = tree["params"], tree["opt_state"], checkpointer.extra(step)
        meta["resumed_at"].append(meta["step"])
        print(f"resuming from {state_path} at step {meta['step']}", flush=True)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    print(f"{scale_name}: {n_params / 1e6:.2f}M parameters, {config.steps} steps", flush=True)
    evaluators = {name: make_task_metrics(model_config, env, config.eval_episodes,
                                       config.eval_temperature) for name, env in tasks.items()}
    base_seconds, clock, history_before = meta["seconds"], time.perf_counter(), meta["history"]

    def on_every(done, params, opt_state, history):
        begun = time.perf_counter()
        rows = []
        for i, (name, env) in enumerate(tasks.items()):  # the same held-out keys every time
            metrics = evaluators[name](params, jax.random.fold_in(key_eval, i))
            rows.append({"step": done, "task": name, **metrics})
        eval_seconds = time.perf_counter() - begun
        for row in rows:
            row["eval_seconds"] = round(eval_seconds, 1)
        save_hf_model(os.path.join(checkpoints, f"step_{done:05d}"), model_config, params,
                      scale.tokenizer, metadata={"step": done, "success": {
                          r["task"]: r["success"] for r in rows}})
        meta.update(step=done, seconds=base_seconds + time.perf_counter() - clock,
                    history=history_before + history, evals=meta["evals"] + rows)
        checkpointer.save(done, {"params": params, "opt_state": opt_state}, extra=meta)
        write_csv(os.path.join(out, "evals.csv"), meta["evals"])
        print(f"eval at step {done} ({eval_seconds:.0f} s, run {meta['seconds']:.0f} s): "
              + ", ".join(f"{r['task']} {r['success']:.3f}" for r in rows), flush=True)
        if stop_after is not None and done >= stop_after and done < config.steps:
            raise _Stopped

    if meta["step"] < config.steps:
        try:
            warm_start(model_config, tasks, config, key_train, params=params,
                       cycle=scale.cycle, opt_state=opt_state, start_step=meta["step"],
                       every=config.steps // scale.evals, on_every=on_every,
                       log=lambda line: print(line, flush=True))
        except _Stopped:
            print(f"stopped at step {meta['step']} (--stop-after {stop_after}); the state is in "
                  f"{state_path}: rerun without --stop-after to continue", flush=True)
            return None
    step, distance = select_checkpoint(meta["evals"], BAND)
    chosen = [r for r in meta["evals"] if r["step"] == step]
    rule = (f"the last periodic checkpoint at which every task's success is in [{BAND[0]}, "
            f"{BAND[1]}], else the final one (distance to the band: the sum of each task's "
            "shortfall below / excess above it)")
    _, chosen_params, _ = load_hf_model(os.path.join(checkpoints, f"step_{step:05d}"))
    save_hf_model(os.path.join(out, "model"), model_config, chosen_params, scale.tokenizer,
                  metadata={"step": step, "of_steps": config.steps, "selected_by": rule,
                            "band_distance": distance, "seed": seed,
                            "success_t1": {r["task"]: r["success"] for r in chosen},
                            "made_by": command(argv)})
    info = provenance(command=command(argv), started=started)
    write_csv(os.path.join(out, "success.csv"), chosen)
    write_csv(os.path.join(out, "evals.csv"), meta["evals"])
    write_csv(os.path.join(out, "history.csv"), meta["history"])
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"scale": scale_name, **info, "run_seconds": round(meta["seconds"], 1),
                   "resumed_at": meta["resumed_at"], "parameters": n_params,
                   "model": dataclasses.asdict(model_config),
                   "model_preset": scale.model if isinstance(scale.model, str) else None,
                   "tokenizer": fingerprint["tasks"][next(iter(tasks))]["vocab_source"],
                   "selected_step": step, "band": BAND, "band_distance": distance,
                   **{k: v for k, v in fingerprint.items() if k != "model"}}, f, indent=1)
    write_bpe_readme(out, scale_name, scale, info, meta, n_params, step, distance, rule)
    print(f"wrote {out} (model: step {step}, band distance {distance:.3f}) in "
          f"{info['wall_seconds']:.0f} s", flush=True)
    return out


def _shown(path: str) -> str:
    """``path`` relative to the repository root when inside it."""
    path = os.path.abspath(path)
    inside = path.startswith(str(REPOSITORY_ROOT) + os.sep)
    return os.path.relpath(path, REPOSITORY_ROOT) if inside else path


def write_bpe_readme(out, scale_name, scale, info, meta, n_params, step, distance, rule):
    config, model_config = scale.warm_start, scale.model_config
    names = list(dict.fromkeys(r["task"] for r in meta["evals"]))
    steps = sorted({r["step"] for r in meta["evals"]})
    cell = {(r["step"], r["task"]): r for r in meta["evals"]}
    table = "\n".join(f"| {s}{' (model/)' if s == step else ''} | "
                      + " | ".join(f"{cell[s, n]['success']:.3f}" for n in names)
                      + f" | {cell[s, names[0]]['eval_seconds']:.0f} |" for s in steps)
    chosen = "\n".join(f"| {n} | {cell[step, n]['success']:.3f} | {cell[step, n]['return']:.3f} "
                       f"| {cell[step, n]['format_ok']:.3f} | {cell[step, n]['abs_log_rd_mean']:.2e}"
                       f" | {cell[step, n]['abs_log_rd_max']:.2e} |" for n in names)
    shape = (f"hidden {model_config.hidden_size}, {model_config.num_hidden_layers} layers, "
             f"intermediate {model_config.intermediate_size}, {model_config.num_attention_heads} "
             f"heads / {model_config.num_key_value_heads} KV heads (head dim "
             f"{model_config.head_dim}), vocab {model_config.vocab_size}, tied embeddings")
    resumed = (f" It was resumed at step(s) {meta['resumed_at']} (the run time counts the work "
               "up to each save; a resume at the last step trains and evaluates nothing, it only "
               "selects the checkpoint and writes the outputs again, so the wall time above is "
               "that invocation's)." if meta["resumed_at"] else "")
    tasks = "\n".join(f"- {name}: `{type(env).__name__}` "
                      + ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(env).items()
                                  if k != "vocab") for name, env in BPE_TASKS.items()
                      if name in scale.task_names)
    sizing = ("\n\nSizing (step timings of the candidate shapes) and our choices: "
              "[sizing.md](sizing.md)." if os.path.exists(os.path.join(out, "sizing.md")) else "")
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(f"""# BPE warm start ({scale_name} scale): a Qwen2 model worth doing RL on

{provenance_line(info)}
Training and periodic evaluation took {meta['seconds']:.0f} s of run time (includes
compilation).{resumed}

Model: `{scale.model if isinstance(scale.model, str) else 'inline config'}`, {n_params:,}
parameters ({shape}), trained from scratch; the tokenizer and chat template are the BPE
stand-in's (tests/fixtures/qwen2_bpe_tiny: byte-level BPE, 640 tokens, ChatML).
Training: behaviour cloning of each task's expert on fresh episodes
(fresh_rl.llm.warm_start), {config.steps} steps at batch {config.batch_size}, one task per
step in the cycle {list(scale.cycle)}, AdamW lr {config.learning_rate} (warmup
{config.warmup_steps} steps, cosine to 10%), weight decay {config.weight_decay}, clip 1.

Tasks (fresh_rl.llm.presets.BPE_TASKS, speaking the stand-in's tokenizer):
{tasks}

Evaluation every {config.steps // scale.evals} steps: {config.eval_episodes} episodes per
task at temperature {config.eval_temperature} with the bf16 KV-cache sampler, on held-out
keys (the evaluation key is split from the run key apart from the training data's; the same
evaluation episodes every time). Success is the task's verifiable success.

| step | {' | '.join(names)} | eval s |
|---|{'---|' * len(names)}---|
{table}

## model/

`model/` is the checkpoint of step {step}: {rule}; its band distance is {distance:.3f}.
It is a Hugging Face Qwen2ForCausalLM folder (config.json, float32 model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json; fresh_rl_export.json records
the step and its success): `--model {_shown(os.path.join(out, 'model'))}`
of every LLM experiment (`fresh_rl.llm.checkpoint.load_hf_model`), and transformers'
`Qwen2ForCausalLM.from_pretrained` reads it.

| task | success | mean return | format ok | mean abs log r_d | max abs log r_d |
|---|---|---|---|---|---|
{chosen}

Files: evals.csv (every periodic evaluation), success.csv (model/'s), history.csv (training
loss), config.json (settings, provenance). The periodic checkpoints and the resumable
training state are in checkpoints/ (git-ignored, not committed): rerunning the command after
an interruption continues from the last periodic evaluation.{sizing}
""")


if __name__ == "__main__":
    main()
