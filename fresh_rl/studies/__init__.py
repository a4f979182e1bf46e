"""Study pieces that belong to no one area: the FreshPER τ sweep's tables shared by the bandit bed
and control (:mod:`.freshper_tau_sweep`) and the aging-buffer simulation (:mod:`.priority_staleness`).
Study machinery of one area lives with it (``fresh_rl/control/*_study.py``, ``fresh_rl/llm/*_study.py``)."""
