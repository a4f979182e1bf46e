"""fresh_rl: off-policy correction for asynchronous and replay-based RL in JAX.

Subpackages: ``replay`` (FreshPER / PER trajectory buffer), ``corrections`` (V-trace, VACO,
decoupled PPO, EWMA reference), ``llm`` (Qwen2-architecture LM and text tasks).
"""

__version__ = "0.1.0"
