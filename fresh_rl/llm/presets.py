"""Presets shared by the LLM experiments, tests and notebooks: warm-start checkpoints, task
settings, the old-logits and FreshPER scales, and parameter loading.

Everything here used to live in ``experiments/*.py``; the scripts now import it, so a test or
notebook never imports a script. Checkpoint paths resolve against the repository root
(:data:`fresh_rl.provenance.REPOSITORY_ROOT`), so they hold from any working directory with
an editable install.

* :data:`WARM_START`, :data:`ARITHMETIC_WARM_START` — the committed tiny-model checkpoints
  (``experiments/llm_warm_start.py``, multi-task and arithmetic-specialised).
* :data:`TASKS`, :data:`CYCLE`, :data:`SPECIALIZE` — the warm start's task settings, its task
  cycle and the arithmetic specialisation; :data:`BPE_TASKS`, :data:`BPE_CYCLE` — those of
  the BPE warm start (``--scale bpe``).
* :class:`OldLogitsScale` / :data:`OLD_LOGITS_SCALES` — ``experiments/old_logits.py``
  (arXiv 2605.12070) and ``experiments/llm_rl_probe.py``.
* :class:`RLGainScale` / :data:`RL_GAIN_SCALES` — ``experiments/llm_rl_gain.py`` (does RL
  raise held-out success from the BPE warm start :data:`BPE_WARM_START`?).
* :class:`FreshPERScale` / :data:`FRESHPER_SCALES`, :data:`SYNC`, :func:`freshper_methods` —
  ``experiments/freshper.py`` (arXiv 2604.16918).
* :func:`load_params` — ``(model_config, params)`` of a preset model.
* :data:`QWEN2_5_1_5B` — the Qwen2.5-1.5B shapes (the scale benchmark's larger model);
  :func:`char_task_for` — a char task sized for a preset model without its tokenizer.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from fresh_rl.corrections.routes import FACTORIAL_ROUTES, REPAIR_ROUTES
from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm import replay_trainer as rt
from fresh_rl.llm.model import preset
from fresh_rl.llm.tasks import (ArithmeticTask, CountdownTask, FrozenLakeTask, SearchQATask,
                                SokobanTask)
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.llm.trainer import RLConfig
from fresh_rl.llm.warm_start import WarmStartConfig
from fresh_rl.presets import Preset, named
from fresh_rl.provenance import REPOSITORY_ROOT

RESULTS = REPOSITORY_ROOT / "results"
WARM_START = str(RESULTS / "llm_warm_start" / "checkpoint")
ARITHMETIC_WARM_START = str(RESULTS / "llm_warm_start_arithmetic" / "checkpoint")
# Hugging Face folders: the BPE warm start (experiments/llm_warm_start.py --scale bpe) and the
# random-weight BPE stand-in the tests use
BPE_WARM_START = str(RESULTS / "llm_warm_start_bpe" / "model")
BPE_STANDIN = str(REPOSITORY_ROOT / "tests" / "fixtures" / "qwen2_bpe_tiny")
# Where the paper-scale LLM slices look for the Qwen2.5-0.5B Hugging Face folder (not shipped)
QWEN2_5_0_5B_FOLDER = str(REPOSITORY_ROOT / "models" / "Qwen2.5-0.5B")

# The Qwen2.5-1.5B shapes (model.PRESETS["qwen2.5-1.5b"]), the scale benchmark's larger model.
QWEN2_5_1_5B = preset("qwen2.5-1.5b")


def char_task_for(env, model_config):
    """``env`` speaking its (char) vocabulary widened to ``model_config.vocab_size`` (ids above
    the tokenizer's never produced by the task): what a scale benchmark of a preset without
    its tokenizer folder runs (char-level sequence lengths)."""
    return with_vocab(env, dataclasses.replace(env.vocab, vocab_size=model_config.vocab_size))

# --------------------------------------------------------------------------- warm start

# Task difficulty for the tiny model (our choice: small enough that behaviour cloning in
# minutes gives a non-zero success rate, hard enough that it does not saturate).
TASKS = {
    "arithmetic": ArithmeticTask(digits=1, steps=2),
    "frozenlake": FrozenLakeTask(size=4, hole_prob=0.3, max_turns=8),
    "sokoban": SokobanTask(size=5, num_boxes=1, reverse_steps=6, max_turns=6),
    "search_qa": SearchQATask(num_entities=4, num_relations=1, max_turns=3, tool_cost=0.05,
                              name_pool=32),
}
# Copying names (search QA) and multi-digit arithmetic are learned slowest: they get 2 of
# every 6 steps, the grid tasks 1 each (our choice: with a uniform cycle and all 4900 names,
# search QA stayed at 0 success; the tiny model copies 4-letter random names imprecisely).
CYCLE = ("arithmetic", "search_qa", "frozenlake", "arithmetic", "search_qa", "sokoban")
# The BPE warm start (experiments/llm_warm_start.py --scale bpe): the tasks of TASKS
# speaking the BPE stand-in's tokenizer (with_vocab at run time) plus Countdown at its default
# knobs (3 numbers in 1..9). Our choices, from a 200-step pilot and a first 1600-step run of
# the bpe-5m model (results/llm_warm_start_bpe/sizing.md): arithmetic stays at 1 digit (at 2
# digits it answered 0.016 of the prompts after 200 steps); the grid tasks learn fastest
# (FrozenLake 0.71, Sokoban 0.56 after ~110 steps of each) and the copying tasks slowest
# (search QA 0.10, Countdown 0.00 after 156 and 467 steps of each), so the cycle gives each
# grid task 1 of every 20 steps, search QA 6, Countdown 8 and arithmetic 4.
BPE_TASKS = {**TASKS, "countdown": CountdownTask(num_count=3, max_number=9)}
BPE_CYCLE = ("countdown", "search_qa", "arithmetic", "countdown", "search_qa", "frozenlake",
             "countdown", "search_qa", "arithmetic", "countdown", "search_qa", "countdown",
             "search_qa", "arithmetic", "countdown", "sokoban", "countdown", "search_qa",
             "arithmetic", "countdown")

# Arithmetic specialisation: (rounds, per-round config, seed); our choice, from a probe in which
# 250-step rounds at batch 32 raised temperature-1 success from 0.02 to 0.19 in two rounds.
SPECIALIZE = {"arithmetic": (2, WarmStartConfig(steps=250, batch_size=32, learning_rate=2e-3,
                                                warmup_steps=10, eval_episodes=256), 11)}


def load_params(model: str, checkpoint: Optional[str] = None):
    """``(model_config, params)``: the tiny preset from an orbax checkpoint (default
    :data:`WARM_START`), any other preset from a Hugging Face folder (required)."""
    if model == "tiny":
        from fresh_rl.llm.warm_start import restore_params
        return preset("tiny"), restore_params(checkpoint or WARM_START, preset("tiny"))
    if checkpoint is None:
        raise ValueError(f"--checkpoint (a Hugging Face model folder) is required for the "
                         f"{model} preset")
    from fresh_rl.llm.checkpoint import load_hf_checkpoint
    return load_hf_checkpoint(checkpoint)


def model_folder(model: str) -> Optional[str]:
    """The Hugging Face folder a scale's ``model`` names (a path), or None for a preset name
    (``"tiny"``, ``"qwen2.5-0.5b"``, …: :func:`load_params`)."""
    return model if "/" in model or "\\" in model else None


# --------------------------------------------------------------------------- RL gain



@dataclasses.dataclass(frozen=True)
class RLGainScale(Preset):
    """One scale of ``experiments/llm_rl_gain.py`` (does RL raise *held-out*
    success from the warm start?): GRPO through the pipeline at ``staleness_window`` (0:
    on-policy; snapshot old logits) from the Hugging Face folder ``model`` on each of ``tasks``
    (:data:`BPE_TASKS`, speaking the folder's tokenizer) for ``iterations`` iterations ×
    ``seeds`` seeds; the warm start and the final policy are scored on the same
    ``eval_episodes`` held-out episodes. No KL term (the trainer has none; our choice, as
    DAPO-style GRPO)."""

    model: str
    rl: RLConfig
    tasks: tuple[str, ...]
    seeds: int
    iterations: int
    eval_episodes: int
    checkpoint_every: int = 10
    seeds_per_program: int = 1  # seeds vmapped in one compiled program
    staleness_window: int = 0  # 0: on-policy (each batch from the version it updates)


# Our choice before the probe (results/llm_rl_gain/README.md records the probe): 8 prompts × 8
# rollouts = 64 episodes per iteration, one epoch, the decoupled PPO loss (with snapshots its
# proximal policy is the acting one; on-policy at window 0 it is PPO-clip on fresh data).
RL_GAIN_RL = RLConfig(estimator="grpo", num_groups=8, group_size=8, learning_rate=1e-4,
                      loss="decoupled")


def rl_gain_pipeline(window: int) -> ap.AsyncConfig:
    """The RL-gain study's pipeline: staleness window ``window`` (0: on-policy, each batch
    collected by the version it updates) with snapshot old logits (exact)."""
    return ap.AsyncConfig(staleness_window=window, old_logit_route="snapshot")


# The LLM confirmations' bed: RL_GAIN_RL on a fixed pool of 64 training prompts.
# Our choice, from the RL-gain probe (results/llm_rl_gain/README.md): RL on this warm start
# learns the prompts it trains on (pool 64: 0.363 → 0.590 in 60 iterations) but not unseen
# ones, so the confirmations compare methods on training-pool success, held-out beside it.
BPE_POOL_RL = dataclasses.replace(RL_GAIN_RL, prompt_pool=64)
RL_GAIN_SCALES = named({
    # the test suite: the random-weight stand-in, 2 iterations of 2 prompts × 4 rollouts
    "ci": RLGainScale(model=BPE_STANDIN, rl=dataclasses.replace(RL_GAIN_RL, num_groups=2, group_size=4),
                      tasks=("arithmetic",), seeds=2, iterations=2, eval_episodes=16,
                      checkpoint_every=1, seeds_per_program=2),
    "cpu": RLGainScale(model=BPE_WARM_START, rl=RL_GAIN_RL, tasks=tuple(BPE_TASKS), seeds=5,
                       iterations=60, eval_episodes=512),
    # one GPU, a real checkpoint (--model): the old-logit paper scale's batch and learning rate
    "paper": RLGainScale(model="", rl=dataclasses.replace(RL_GAIN_RL, num_groups=64, learning_rate=1e-6,
                                                          minibatches=4, remat=True),
                         tasks=tuple(BPE_TASKS), seeds=5, iterations=200, eval_episodes=1024),
})

# --------------------------------------------------------------------------- old logits


@dataclasses.dataclass(frozen=True)
class OldLogitsScale(Preset):
    """One scale of ``experiments/old_logits.py``. ``grid_routes`` × ``windows`` × ``seeds``
    learning-curve runs; ``partial_routes`` run again with partial rollouts at
    ``partial_window``; the routes not in the grid are run once (seed 0) at
    ``overhead_window`` for the overhead table."""

    model: str
    rl: RLConfig
    env: ArithmeticTask
    windows: tuple[int, ...]
    grid_routes: tuple[str, ...]
    seeds: int
    iterations: int
    overhead_window: int
    overhead_iterations: int
    partial_routes: tuple[str, ...] = ()
    partial_window: int = 4
    segment_tokens: int = 8
    eval_episodes: int = 0  # 0: no evaluation
    warm_start: Optional[str] = None  # tiny-model checkpoint (None: the multi-task WARM_START)
    lag_kind: str = "fixed"  # AsyncConfig.lag_kind: "fixed" (L = w) or "uniform" (L ~ U{0..w})
    ewma_beta_rule: str = "mean_age"  # AsyncConfig.ewma_beta_rule (the library's one default)

    def async_config(self, route: str, partial: bool = False) -> ap.AsyncConfig:
        """The pipeline settings of a run: the ring holds max(windows) + 1 versions for every
        run (each run's window is a hyperparameter), so each route compiles once."""
        return ap.AsyncConfig(staleness_window=max(self.windows + (self.overhead_window,)),
                              old_logit_route=route, partial_rollouts=partial,
                              segment_tokens=self.segment_tokens, lag_kind=self.lag_kind,
                              ewma_beta_rule=self.ewma_beta_rule)


# Our tuning probe of the synchronous trainer from the warm start (GRPO, 30-40 iterations of
# 64-128 episodes, lr 3e-4 / 1e-3 / 3e-3) found no setting that clearly raised arithmetic
# success above the warm start's ~0.05 (results/old_logits/README.md). lr 1e-3 is the stable
# middle: large enough for the policy to drift measurably per version, which is what
# staleness acts on.
OLD_LOGITS_RL = RLConfig(estimator="grpo", num_groups=8, group_size=8, learning_rate=1e-3,
                         loss="decoupled")
# ci: from the arithmetic-specialised warm start (≈ 0.2 success), on a fixed training set of
# 32 prompts (RLConfig.prompt_pool), 2 epochs per batch at lr 1e-4. Our probes
# (results/old_logits/README.md, "RL from the arithmetic warm start") found that RL at this
# budget raises success on the prompts it trains on but not on unseen prompts, so the ci run
# scores both.
_OLD_LOGITS_CI = OldLogitsScale(
    model="tiny", rl=dataclasses.replace(OLD_LOGITS_RL, learning_rate=1e-4, epochs=2,
                                         prompt_pool=32),
    env=ArithmeticTask(digits=1, steps=2), windows=(1,), grid_routes=("snapshot",),
    seeds=1, iterations=16, overhead_window=1, overhead_iterations=0,
    eval_episodes=1024, warm_start=ARITHMETIC_WARM_START)
OLD_LOGITS_SCALES = named({
    "ci": _OLD_LOGITS_CI,
    # the default test suite's end-to-end run: the ci programs (same shapes, so a test session
    # compiles them once) for 4 iterations and 64 evaluation episodes per policy; the learning
    # claim is the ci scale's (a slow test and the quickstart)
    "smoke": dataclasses.replace(_OLD_LOGITS_CI, iterations=4, eval_episodes=64),
    "cpu": OldLogitsScale(
        model="tiny", rl=dataclasses.replace(OLD_LOGITS_RL, num_groups=4),
        env=ArithmeticTask(digits=1, steps=2), windows=(1, 2, 4, 8),
        grid_routes=("recompute_current", "snapshot", "linear_proxy", "ewma", "ewma_no_reset"),
        seeds=3, iterations=12, overhead_window=4, overhead_iterations=4),
    # remat at the paper scales: without it the 0.5B update of one 128-row minibatch needs
    # 80.6 GB of compiled memory, with it 11.3 GB (results/bench/llm_scale.md).
    "paper": OldLogitsScale(
        model="qwen2.5-0.5b",
        rl=dataclasses.replace(OLD_LOGITS_RL, num_groups=64, group_size=8, learning_rate=1e-6,
                               minibatches=4, remat=True),
        env=ArithmeticTask(digits=2, steps=2), windows=(1, 2, 4, 8),
        grid_routes=REPAIR_ROUTES, seeds=5, iterations=300, overhead_window=4,
        overhead_iterations=10, partial_routes=REPAIR_ROUTES, partial_window=4,
        segment_tokens=32, eval_episodes=1024),
    # the LLM confirmation on the BPE warm start: random staleness L ~ U{0..W}, the route
    # grid at W ∈ {1, 4, 16}, GRPO at the RL-gain study's settings on a fixed pool of 64
    # training prompts (BPE_POOL_RL), 60 iterations of 64 episodes, 5 seeds; every final
    # policy scored on the pool and on held-out prompts. EWMA β = W/(W + 1) (the "window"
    # variant), the β of the committed results/old_logits_bpe/ tables; the default rule would
    # give W/(W + 2) under these uniform lags
    "bpe": OldLogitsScale(
        model=BPE_WARM_START, rl=BPE_POOL_RL, env=BPE_TASKS["arithmetic"], windows=(1, 4, 16),
        grid_routes=("recompute_current", "snapshot", "linear_proxy", "ewma", "ewma_no_reset"),
        seeds=5, iterations=60, overhead_window=4, overhead_iterations=0, eval_episodes=512,
        lag_kind="uniform", ewma_beta_rule="window"),
    # the mask × clip factorial at W = 16 (experiments/old_logits.py --scale bpe-factorial): the
    # bpe scale's setting (the same ring of 17 versions, so snapshot and recompute_current are
    # its runs) with the two crossed routes, which take the MIS mask's old log-probs from one of
    # them and the clip centre from the other
    "bpe-factorial": OldLogitsScale(
        model=BPE_WARM_START, rl=BPE_POOL_RL, env=BPE_TASKS["arithmetic"], windows=(16,),
        grid_routes=("snapshot", "recompute_current") + FACTORIAL_ROUTES,
        seeds=5, iterations=60, overhead_window=4, overhead_iterations=0, eval_episodes=512,
        lag_kind="uniform", ewma_beta_rule="window"),
    # its test-suite version on the random-weight stand-in: one route, two windows
    "bpe-ci": OldLogitsScale(
        model=BPE_STANDIN, rl=dataclasses.replace(BPE_POOL_RL, num_groups=2, group_size=4, prompt_pool=4),
        env=BPE_TASKS["arithmetic"], windows=(1, 4), grid_routes=("ewma",), seeds=1,
        iterations=3, overhead_window=4, overhead_iterations=0, eval_episodes=16,
        lag_kind="uniform"),
})

# --------------------------------------------------------------------------- FreshPER

# REINFORCE++ as the paper (batch normalisation, whitening, clip 2 as ROLL's
# example_reinforce_pp.yaml; the FreshPER configs' clip of 0.2 is not known to be the paper's).
# lr 3e-5: Adam's steps have size ≈ lr per weight whatever the gradient's scale, and on the
# 0.8M-parameter tiny model one step at 1e-4 already moved a sequence's log-prob by 3.6 nats;
# RL at 1e-3 lowered success on sokoban and arithmetic (results/old_logits/README.md, "lr").
FRESHPER_RL = RLConfig(estimator="reinforce_pp", num_groups=4, group_size=8, learning_rate=3e-5,
                       loss="decoupled")
SYNC = ap.AsyncConfig(staleness_window=0, old_logit_route="snapshot")


@dataclasses.dataclass(frozen=True)
class FreshPERScale(Preset):
    """One scale of ``experiments/freshper.py``. ``methods``: name → replay settings;
    ``taus``: the τ ablation rows of "freshper" on the ``tau_ablation_tasks`` (None: every
    task); ``task_methods``: the methods run on a task (None: all)."""

    rl: RLConfig
    tasks: tuple[str, ...]
    methods: tuple[tuple[str, rt.LLMReplayConfig], ...]
    taus: tuple[float, ...]
    seeds: int
    iterations: int
    model: str = "tiny"
    tau_ablation_tasks: Optional[tuple[str, ...]] = None
    task_methods: Optional[dict[str, tuple[str, ...]]] = None
    eval_episodes: int = 0  # held-out episodes per final policy (experiments/freshper_llm.py)

    def ablates_tau(self, task: str, method: str) -> bool:
        return bool(method in ("freshper", "freshper_authors") and self.taus and (
            self.tau_ablation_tasks is None or task in self.tau_ablation_tasks))

    def runs(self, task: str, method: str) -> bool:
        return self.task_methods is None or method in self.task_methods.get(
            task, tuple(dict(self.methods)))

    def run_rows(self, task: str, method: str) -> list[tuple[Optional[float], int]]:
        """(τ, seed) of every vmapped row of a run: the τ ablation rows for "freshper"."""
        taus = self.taus if self.ablates_tau(task, method) else (None,)
        return [(tau, seed) for tau in taus for seed in range(self.seeds)]


def freshper_methods(tau: float, replay_updates: int, capacity: int, controls: bool = False):
    """The compared methods: on-policy (K = 0), standard PER, FreshPER (τ), FreshPER without
    importance weights and with online τ; with ``controls`` also the matched controls
    on-policy with 1 + K epochs (the replay methods' update count) and uniform replay."""
    base = rt.LLMReplayConfig(replay_updates=replay_updates, capacity=capacity,
                              age_decay_tau=tau)
    on_policy = dataclasses.replace(base, replay_updates=0, sampling="uniform")
    methods = (("on_policy", on_policy),
               ("per", dataclasses.replace(base, sampling="per")),
               ("freshper", base),
               ("freshper_no_is", dataclasses.replace(base, importance_correction=False)),
               ("freshper_auto_tau", dataclasses.replace(base, auto_tau=True)))
    if controls:
        methods += (("on_policy_epochs", dataclasses.replace(on_policy, fresh_epochs=1 + replay_updates)),
                    ("uniform", dataclasses.replace(base, sampling="uniform")))
    return methods


def authors_methods(capacity: int):
    """On-policy (K = 0) and, with K = 1, the FreshPER authors' PER (``per_authors``: new
    trajectories at the running max priority, sampled ones refreshed) and FreshPER (that
    pipeline plus the age decay; τ per row of the scale's ``taus``)."""
    base = rt.LLMReplayConfig(replay_updates=1, capacity=capacity, new_item_priority="max")
    return (("on_policy", dataclasses.replace(base, replay_updates=0, sampling="uniform")),
            ("per_authors", dataclasses.replace(base, sampling="per")),
            ("freshper_authors", base))


FRESHPER_SCALES = named({
    "ci": FreshPERScale(rl=dataclasses.replace(FRESHPER_RL, num_groups=2, group_size=4),
                        tasks=("arithmetic",),
                        methods=freshper_methods(tau=4.0, replay_updates=1, capacity=32)[:3],
                        taus=(), seeds=2, iterations=3),
    # τ = ∞ is standard PER exactly (tests/test_llm_replay.py), so the "per" rows stand for it.
    # The 2-core budget: the τ, IS and auto-τ ablations on sokoban only (the τ ablation alone
    # is 4 × the cost of a method); the headline three methods on every task.
    "cpu": FreshPERScale(
        rl=dataclasses.replace(FRESHPER_RL, num_groups=2),
        tasks=("sokoban", "frozenlake", "arithmetic", "search_qa"),
        methods=freshper_methods(8.0, 1, 256), taus=(2.0, 8.0, 32.0), seeds=5, iterations=16,
        tau_ablation_tasks=("sokoban",),
        task_methods={t: ("on_policy", "per", "freshper")
                      for t in ("frozenlake", "arithmetic", "search_qa")}),
    # The stronger-drift diagnostic of the cpu verdicts (the policy barely moved there): the
    # fastest-drifting task, lr 1e-4 (the highest the old-logits probe found harmless),
    # K = 4 replay updates per iteration, 32 iterations.
    "drift": FreshPERScale(
        rl=dataclasses.replace(FRESHPER_RL, num_groups=2, learning_rate=1e-4),
        tasks=("search_qa",), methods=freshper_methods(8.0, 4, 256)[:3], taus=(), seeds=5,
        iterations=32),
    # The FreshPER pilot on the BPE warm start: how fast the stored trajectories' ESS decays
    # with age (ess_fit.csv), which sets the confirmation's τ grid (multiples of the time
    # constant) and buffer (≥ 10 time constants). Standard PER (τ = ∞) keeps every age, K = 1,
    # REINFORCE++ as the paper at the RL-gain study's learning rate, 64 episodes per
    # iteration on the confirmations' pool of 64 training prompts (BPE_POOL_RL), a buffer
    # holding the whole run.
    "bpe-pilot": FreshPERScale(
        rl=dataclasses.replace(FRESHPER_RL, num_groups=8, group_size=8,
                               learning_rate=RL_GAIN_RL.learning_rate,
                               prompt_pool=BPE_POOL_RL.prompt_pool),
        tasks=("arithmetic",), methods=(("per", rt.LLMReplayConfig(
            replay_updates=1, capacity=64 * 40, sampling="per")),), taus=(), seeds=3,
        iterations=40, model=BPE_WARM_START),
    # FreshPER as its authors run it, on the BPE warm start (experiments/freshper_llm.py): the
    # pilot's REINFORCE++ settings with 4 prompts × 8 rollouts per iteration (the CPU sizing in
    # results/freshper_llm/README.md; at 2 × 8 on-policy success fell from 0.44 to 0.27 within
    # 11 iterations, so that size was dropped before any replay arm ran), K = 1, a buffer
    # holding the whole run, on-policy vs the authors' PER vs FreshPER at two τ (rows of one
    # program, common seeds)
    "bpe-slice": FreshPERScale(
        rl=dataclasses.replace(FRESHPER_RL, num_groups=4, group_size=8,
                               learning_rate=RL_GAIN_RL.learning_rate,
                               prompt_pool=BPE_POOL_RL.prompt_pool),
        tasks=("arithmetic",), methods=authors_methods(32 * 48), taus=(8.0, 32.0), seeds=5,
        iterations=48, model=BPE_WARM_START, eval_episodes=256),
    # its test-suite version on the random-weight stand-in
    "bpe-slice-ci": FreshPERScale(
        rl=dataclasses.replace(FRESHPER_RL, num_groups=1, group_size=4, prompt_pool=4),
        tasks=("arithmetic",), methods=authors_methods(4 * 4), taus=(1.0, 4.0), seeds=2,
        iterations=4, model=BPE_STANDIN, eval_episodes=8),
    # the slice at paper scale, for one accelerator (experiments/freshper_llm.py --scale paper-slice):
    # Qwen2.5-0.5B (a Hugging Face folder at QWEN2_5_0_5B_FOLDER), 16 × 8 = 128 episodes per
    # iteration (the authors' trajrb rollout batch), lr 1e-6 as the old-logit paper scale (the
    # FreshPER paper's is unknown to us), τ = 100 and the authors' default 500 versions, and a
    # buffer holding the whole run of 5 × 500 iterations, so it spans 5 τ at τ = 500 (the
    # authors' 50,000-trajectory capacity would hold 390 versions, less than their τ).
    "paper-slice": FreshPERScale(
        rl=dataclasses.replace(FRESHPER_RL, num_groups=16, group_size=8, learning_rate=1e-6,
                               prompt_pool=BPE_POOL_RL.prompt_pool, minibatches=4, remat=True),
        tasks=("arithmetic",), methods=authors_methods(128 * 2500), taus=(100.0, 500.0), seeds=5,
        iterations=2500, model=QWEN2_5_0_5B_FOLDER, eval_episodes=1024),
    "paper": FreshPERScale(
        rl=dataclasses.replace(FRESHPER_RL, num_groups=128, group_size=8, learning_rate=1e-6,
                               minibatches=4, remat=True),  # as the old-logit paper scale
        tasks=tuple(TASKS), methods=freshper_methods(500.0, 1, 50_000),
        taus=(100.0, 250.0, 500.0, 1000.0, math.inf), seeds=5, iterations=300,
        model="qwen2.5-0.5b"),
})

__all__ = ["ARITHMETIC_WARM_START", "BPE_CYCLE", "BPE_POOL_RL", "BPE_STANDIN", "BPE_TASKS", "BPE_WARM_START", "CYCLE", "FRESHPER_RL", "FRESHPER_SCALES", "FreshPERScale",
           "OLD_LOGITS_RL", "OLD_LOGITS_SCALES", "OldLogitsScale", "QWEN2_5_0_5B_FOLDER", "QWEN2_5_1_5B", "RESULTS", "RL_GAIN_RL",
           "RL_GAIN_SCALES", "RLGainScale", "rl_gain_pipeline",
           "SPECIALIZE", "SYNC", "TASKS", "WARM_START", "authors_methods", "char_task_for", "freshper_methods",
           "load_params", "model_folder"]
