"""Small-LLM stack: Qwen2-architecture LM (model), HF checkpoint loading (checkpoint),
tokenizers (tokenizer), bf16 KV-cache sampler and fp32 training forward (sampler),
jittable text tasks (tasks), batched multi-turn episodes (rollout), supervised warm start
(warm_start), GRPO / REINFORCE++ advantages (advantages), the synchronous policy-gradient
trainer (trainer) and its registry of policy losses (policy_losses: PPO-clip, decoupled,
VACO), the asynchronous simulator with staleness and partial rollouts (async_pipeline) and
the sources and forward passes behind the shared old-log-prob routes of
``fresh_rl.corrections.routes`` (old_logits), the traced hyperparameters of a run (hparams), replay with FreshPER
(replay_trainer), held-out evaluation (evaluation), the experiments' shared presets:
checkpoints, tasks, scales (presets), the RL-gain study's run records (rl_gain) and the
old-logit study's route verdicts (old_logits_verdicts).
Import the submodules directly, e.g. ``from fresh_rl.llm import async_pipeline``."""
