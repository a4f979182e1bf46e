"""Small-LLM stack: Qwen2-architecture LM (model), HF checkpoint loading (checkpoint),
tokenizers (tokenizer), bf16 KV-cache sampler and fp32 training forward (sampler),
jittable text tasks (tasks), batched multi-turn episodes (rollout), supervised warm start
(warm_start), GRPO / REINFORCE++ advantages (advantages), the synchronous policy-gradient
trainer (trainer), the asynchronous simulator with staleness and partial rollouts
(async_pipeline) and its registry of old-logit routes with their cost accounting
(old_logits), the traced hyperparameters of a run (hparams), replay with FreshPER
(replay_trainer), held-out evaluation (evaluation) and the experiments' shared presets:
checkpoints, tasks, scales (presets).
Import the submodules directly, e.g. ``from fresh_rl.llm import async_pipeline``."""
