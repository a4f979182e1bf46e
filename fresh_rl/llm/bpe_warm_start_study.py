"""The BPE warm start (``experiments/llm_warm_start.py --scale bpe*``): a model from scratch on
:data:`fresh_rl.llm.presets.BPE_TASKS` in the BPE stand-in's tokenizer, behaviour-cloned
(:func:`fresh_rl.llm.warm_start.warm_start`), evaluated and checkpointed periodically, resumable
from its fingerprinted training state; the checkpoint in :data:`BAND` is exported as a Hugging
Face folder. The character-level warm start and the specialisation rounds are
:mod:`fresh_rl.llm.warm_start_study`'s.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time

import jax
import numpy as np

from fresh_rl.llm.checkpoint import load_hf_model, save_hf_model
from fresh_rl.llm.model import Qwen2Config, init_params, preset
from fresh_rl.llm.presets import BPE_CYCLE, BPE_STANDIN, BPE_TASKS
from fresh_rl.llm.tasks.vocab import TaskVocab, check_model_vocab, with_vocab
from fresh_rl.llm.warm_start import WarmStartConfig, make_optimizer, make_task_metrics, select_checkpoint, warm_start
from fresh_rl.llm.warm_start_study import success_table
from fresh_rl.presets import Preset
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, write_atomic, write_csv
from fresh_rl.report import markdown_table, write_readme
from fresh_rl.sweep.checkpoint import RunCheckpointer, RunIdentityError
from fresh_rl.sweep.keys import seed_key, split_run_key


BAND = (0.2, 0.5)
"""The success band the chosen BPE checkpoint should lie in at temperature 1 (the target
"roughly 0.2-0.5 on each task, not saturated"); the rule: :func:`~fresh_rl.llm.warm_start.select_checkpoint`."""
STATE_DIR = "state"
"""The folder under ``checkpoints/`` of the BPE run's :class:`RunCheckpointer` steps: params,
optimizer state, meta."""


@dataclasses.dataclass(frozen=True)
class BpeScale(Preset):
    """A scale of the BPE warm start: the model (a preset name or a config) trained from
    scratch on presets.BPE_TASKS in the tokenizer of ``tokenizer``, evaluated (and
    checkpointed) ``evals`` times, every ``warm_start.steps // evals`` steps."""

    model: str | Qwen2Config
    warm_start: WarmStartConfig
    evals: int = 8
    tokenizer: str = BPE_STANDIN
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


def _task_settings(tasks: dict) -> dict:
    """Class and settings of each task (its vocabulary named by ``vocab_source``)."""
    return {name: {"class": type(env).__name__, "vocab_source": os.path.relpath(
        env.vocab.source, REPOSITORY_ROOT) if not env.vocab.is_char else "char",
        **{f.name: getattr(env, f.name) for f in dataclasses.fields(env) if f.name != "vocab"}}
        for name, env in tasks.items()}


def _fingerprint(scale: BpeScale, seed: int, tasks: dict) -> dict:
    """What a saved training state must match to be resumed."""
    return json.loads(json.dumps({
        "seed": seed, "model": dataclasses.asdict(scale.model_config),
        "warm_start": dataclasses.asdict(scale.warm_start), "evals": scale.evals,
        "cycle": list(scale.cycle), "tasks": _task_settings(tasks)}, default=str))


class _Stopped(Exception):
    """--stop-after reached (the state of that step is saved)."""


def bpe_warm_start(scale: BpeScale, out: str, seed: int, fresh: bool, command: str,
                   stop_after: int | None = None) -> str | None:
    """The BPE warm start (module docstring): trains, evaluates and checkpoints periodically,
    resumes from checkpoints/ when interrupted, writes the chosen HF folder to out/model.
    ``stop_after``: return (None) after the periodic evaluation at or past that step."""
    config, model_config = scale.warm_start, scale.model_config
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
        restored = checkpointer.restore_latest(jax.eval_shape(lambda: {"params": params, "opt_state": opt_state}))
    except RunIdentityError as err:
        raise RunIdentityError(f"{err}\n(or rerun with --fresh to start over)") from None
    if restored is not None:
        step, tree = restored
        params, opt_state, meta = tree["params"], tree["opt_state"], checkpointer.extra(step)
        meta["resumed_at"].append(meta["step"])
        print(f"resuming from {state_path} at step {meta['step']}", flush=True)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    print(f"{scale.name}: {n_params / 1e6:.2f}M parameters, {config.steps} steps", flush=True)
    evaluators = {name: make_task_metrics(model_config, env, config.eval_episodes, config.eval_temperature)
                  for name, env in tasks.items()}
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
        save_hf_model(os.path.join(checkpoints, f"step_{done:05d}"), model_config, params, scale.tokenizer,
                      metadata={"step": done, "success": {r["task"]: r["success"] for r in rows}})
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
            warm_start(model_config, tasks, config, key_train, params=params, cycle=scale.cycle, opt_state=opt_state,
                       start_step=meta["step"], every=config.steps // scale.evals, on_every=on_every,
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
                            "success_t1": {r["task"]: r["success"] for r in chosen}, "made_by": command})
    info = provenance(command=command, started=started)
    write_csv(os.path.join(out, "success.csv"), chosen)
    write_csv(os.path.join(out, "evals.csv"), meta["evals"])
    write_csv(os.path.join(out, "history.csv"), meta["history"])
    write_atomic(os.path.join(out, "config.json"), json.dumps(
        {"scale": scale.name, **info, "run_seconds": round(meta["seconds"], 1), "resumed_at": meta["resumed_at"],
         "parameters": n_params, "model": dataclasses.asdict(model_config),
         "model_preset": scale.model if isinstance(scale.model, str) else None,
         "tokenizer": fingerprint["tasks"][next(iter(tasks))]["vocab_source"], "selected_step": step, "band": BAND,
         "band_distance": distance, **{k: v for k, v in fingerprint.items() if k != "model"}}, indent=1))
    write_readme(out, f"BPE warm start ({scale.name} scale): a Qwen2 model worth doing RL on", info,
                 _bpe_readme_lines(out, scale, meta, n_params, step, distance, rule))
    print(f"wrote {out} (model: step {step}, band distance {distance:.3f}) in {info['wall_seconds']:.0f} s", flush=True)
    return out


def _shown(path: str) -> str:
    """``path`` relative to the repository root when inside it."""
    path = os.path.abspath(path)
    inside = path.startswith(str(REPOSITORY_ROOT) + os.sep)
    return os.path.relpath(path, REPOSITORY_ROOT) if inside else path


def _bpe_readme_lines(out: str, scale: BpeScale, meta: dict, n_params: int, step: int, distance: float,
                      rule: str) -> list[str]:
    """The BPE README after its provenance line: run time, model, training, tasks, the periodic
    evaluations, the chosen checkpoint and its per-task metrics, the files."""
    config, model_config = scale.warm_start, scale.model_config
    names = list(dict.fromkeys(r["task"] for r in meta["evals"]))
    cell = {(r["step"], r["task"]): r for r in meta["evals"]}
    shape = (f"hidden {model_config.hidden_size}, {model_config.num_hidden_layers} layers, "
             f"intermediate {model_config.intermediate_size}, {model_config.num_attention_heads} "
             f"heads / {model_config.num_key_value_heads} KV heads (head dim "
             f"{model_config.head_dim}), vocab {model_config.vocab_size}, tied embeddings")
    resumed = (f" It was resumed at step(s) {meta['resumed_at']} (the run time counts the work "
               "up to each save; a resume at the last step trains and evaluates nothing, it only "
               "selects the checkpoint and writes the outputs again, so the wall time above is "
               "that invocation's)." if meta["resumed_at"] else "")
    sizing = ("\n\nSizing (step timings of the candidate shapes) and our choices: "
              "[sizing.md](sizing.md)." if os.path.exists(os.path.join(out, "sizing.md")) else "")
    return [
        f"Training and periodic evaluation took {meta['seconds']:.0f} s of run time (includes",
        f"compilation).{resumed}", "",
        f"Model: `{scale.model if isinstance(scale.model, str) else 'inline config'}`, {n_params:,}",
        f"parameters ({shape}), trained from scratch; the tokenizer and chat template are the BPE",
        "stand-in's (tests/fixtures/qwen2_bpe_tiny: byte-level BPE, 640 tokens, ChatML).",
        "Training: behaviour cloning of each task's expert on fresh episodes",
        f"(fresh_rl.llm.warm_start), {config.steps} steps at batch {config.batch_size}, one task per",
        f"step in the cycle {list(scale.cycle)}, AdamW lr {config.learning_rate} (warmup",
        f"{config.warmup_steps} steps, cosine to 10%), weight decay {config.weight_decay}, clip 1.", "",
        "Tasks (fresh_rl.llm.presets.BPE_TASKS, speaking the stand-in's tokenizer):",
        *(f"- {name}: `{type(env).__name__}` " + ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(env).items()
                                                          if k != "vocab")
          for name, env in BPE_TASKS.items() if name in scale.task_names), "",
        f"Evaluation every {config.steps // scale.evals} steps: {config.eval_episodes} episodes per",
        f"task at temperature {config.eval_temperature} with the bf16 KV-cache sampler, on held-out",
        "keys (the evaluation key is split from the run key apart from the training data's; the same",
        "evaluation episodes every time). Success is the task's verifiable success.", "",
        *markdown_table(("step", *names, "eval s"), (
            [f"{s}{' (model/)' if s == step else ''}", *(f"{cell[s, n]['success']:.3f}" for n in names),
             f"{cell[s, names[0]]['eval_seconds']:.0f}"] for s in sorted({r["step"] for r in meta["evals"]}))), "",
        "## model/", "",
        f"`model/` is the checkpoint of step {step}: {rule}; its band distance is {distance:.3f}.",
        "It is a Hugging Face Qwen2ForCausalLM folder (config.json, float32 model.safetensors,",
        "generation_config.json, tokenizer.json, tokenizer_config.json; fresh_rl_export.json records",
        f"the step and its success): `--model {_shown(os.path.join(out, 'model'))}`",
        "of every LLM experiment (`fresh_rl.llm.checkpoint.load_hf_model`), and transformers'",
        "`Qwen2ForCausalLM.from_pretrained` reads it.", "",
        *success_table([cell[step, n] for n in names]), "",
        "Files: evals.csv (every periodic evaluation), success.csv (model/'s), history.csv (training",
        "loss), config.json (settings, provenance). The periodic checkpoints and the resumable",
        "training state are in checkpoints/ (git-ignored, not committed): rerunning the command after",
        f"an interruption continues from the last periodic evaluation.{sizing}"]


__all__ = ["BAND", "STATE_DIR", "BpeScale", "bpe_warm_start"]
