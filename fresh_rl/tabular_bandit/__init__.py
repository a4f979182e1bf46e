"""An exact stale-buffer test bed: tabular softmax policy over token sequences with replay.

The name says what makes it exact: the policy is a table, so expected reward, the true policy
gradient and KL/ESS of every stored behaviour policy are closed-form (see :mod:`.bed`). It
imports :mod:`fresh_rl.replay` and :mod:`fresh_rl.corrections` only.
"""
from fresh_rl.tabular_bandit.bed import (BedConfig, BedHParams, BedState, apply_update,
                                         drift_by_age, ess_fraction, expected_reward,
                                         init_state, insert, kl_divergence,
                                         make_iteration, method_hparams, optimizer, refresh,
                                         sample_sequences, sequence_rewards, stack_hparams,
                                         step_ess_fraction, token_log_probs, train)

__all__ = ["BedConfig", "BedHParams", "BedState", "apply_update", "drift_by_age", "ess_fraction",
           "expected_reward", "init_state", "insert", "kl_divergence",
           "make_iteration", "method_hparams", "optimizer", "refresh", "sample_sequences",
           "sequence_rewards", "stack_hparams", "step_ess_fraction", "token_log_probs", "train"]
