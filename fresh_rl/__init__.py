"""fresh_rl: off-policy correction for asynchronous and replay-based RL in JAX.

Subpackages: ``replay`` (FreshPER / PER trajectory buffer), ``corrections`` (V-trace, VACO,
decoupled PPO, EWMA reference), ``lag`` (parameter-version ring, delay samplers, lag metrics),
``control`` (gymnax actor-critic trainer with simulated lag), ``llm`` (Qwen2-architecture LM,
sampler, text tasks, GRPO / REINFORCE++ trainer). ``replay``, ``corrections`` and ``lag`` know
nothing of ``llm`` or ``control``.

``fresh_rl.checked`` turns on the traced range checks of every building block (under
``jax.experimental.checkify``); see :func:`fresh_rl.validation.checked`.
"""

from fresh_rl.validation import checked

__version__ = "0.1.0"
__all__ = ["checked"]
