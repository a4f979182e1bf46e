"""Cost of one VACO-study program on Breakout-MinAtar: seconds per run-iteration at the ``cpu`` scale.

The study's MinAtar pairs (``fresh_rl.control.presets.VACO_SCALES["cpu"]``) are sized by this:
PPO-clip at the scale's settings (16 envs × 64 steps, 4 epochs × 4 minibatches, CNN encoder,
learner evaluation every 4 versions) on a short budget of ``ITERATIONS`` iterations, ``SEEDS``
vmapped seeds at lag 0. Prints compile and run seconds and the run seconds per run-iteration.

    python benchmarks/vaco_minatar_cost.py 16 10
"""
import dataclasses
import json
import sys

from fresh_rl.control.presets import VACO_SCALES, run_study_variant, study_variants, variant_config


def main(iterations: int, seeds: int) -> dict:
    full = VACO_SCALES["cpu"]
    task = next(t for t in full.tasks if t.name == "Breakout-MinAtar")
    overrides = dict(task.overrides)
    steps = iterations * overrides["num_envs"] * overrides["rollout_length"]
    task = dataclasses.replace(task, overrides=tuple(sorted({**overrides, "total_env_steps": steps}.items())))
    scale = dataclasses.replace(full, tasks=(task,), lags=(0,), num_seeds=seeds, mixture=None,
                                methods=("ppo_clip",), ablations=())
    ((_, method, variant_overrides, deltas),) = list(study_variants(scale, task))
    result = run_study_variant(scale, variant_config(task, method, variant_overrides, scale.ring_size), deltas, 0)
    return {"iterations": iterations, "seeds": seeds, "compile_s": round(result["compile_s"], 1),
            "run_s": round(result["run_s"], 1),
            "s_per_run_iteration": round(result["run_s"] / (iterations * seeds), 3)}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
