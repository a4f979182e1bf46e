"""fresh_rl: off-policy correction for asynchronous and replay-based RL in JAX.

Subpackages: ``replay`` (FreshPER / PER trajectory buffer), ``corrections`` (V-trace, VACO,
decoupled PPO, EWMA reference), ``lag`` (parameter-version ring, delay samplers, lag metrics),
``control`` (gymnax actor-critic trainer with simulated lag), ``llm`` (Qwen2-architecture LM,
sampler, text tasks, GRPO / REINFORCE++ trainer). ``replay``, ``corrections`` and ``lag`` know
nothing of ``llm`` or ``control``.
"""

__version__ = "0.1.0"
