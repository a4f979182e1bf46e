"""Eager (un-jitted) calls of the buffer's public functions compile nothing the second time.

An eager call dispatches each primitive through a compiled program cached on the primitive
and its abstract inputs; a ``lax`` loop or ``cond`` is cached on the identity of its body
functions. A body built as a fresh closure on every call would miss that cache, so a notebook
user would pay a compilation per call. The test counts lowerings to MLIR (one per program
compiled, whether XLA then compiles it or the persistent cache serves it) during a second
call with fresh values of the same shapes: it must be zero."""
import jax
import jax.numpy as jnp
import pytest

from fresh_rl.replay import ReplayConfig, make_trajectory_buffer

LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
CAPACITY, BATCH, SAMPLE = 32, 4, 8


class LoweringCounter:
    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event, duration, **kwargs):
        if event == LOWERING_EVENT:
            self.count += 1


COUNTER = LoweringCounter()


def _lowerings(fn, *args):
    before = COUNTER.count
    jax.block_until_ready(fn(*args))
    return COUNTER.count - before


CONFIGS = {
    "freshper with the default floor": ReplayConfig(
        capacity=CAPACITY, sample_batch_size=SAMPLE, sampling="freshper", age_decay_tau=2.0,
        new_item_priority="given", rebase_exponent=3.0),
    "freshper without a floor": ReplayConfig(
        capacity=CAPACITY, sample_batch_size=SAMPLE, sampling="freshper", age_decay_tau=2.0,
        new_item_priority="given", min_decayed_priority=0.0),
    "per": ReplayConfig(capacity=CAPACITY, sample_batch_size=SAMPLE, sampling="per"),
    "uniform": ReplayConfig(capacity=CAPACITY, sample_batch_size=SAMPLE, sampling="uniform"),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_second_eager_call_of_every_public_function_compiles_nothing(name):
    config = CONFIGS[name]
    buffer = make_trajectory_buffer(config)
    example = {"x": jnp.zeros((3,))}
    batch = {"x": jnp.ones((BATCH, 3))}

    def add(state, step):
        # versions far apart, so the decayed keys cross the floor and a rebase is due
        return buffer.add(state, batch, jnp.int32(40 * step), jnp.full((BATCH,), 1.0 + step))

    calls = {
        "init": lambda state, step: buffer.init(example),
        "add": add,
        "sample": lambda state, step: buffer.sample(state, jax.random.PRNGKey(step)),
        "set_priorities": lambda state, step: buffer.set_priorities(
            state, jnp.arange(BATCH) + step, jnp.full((BATCH,), 0.5 + step)),
        "can_sample": lambda state, step: buffer.can_sample(state),
        "rebase": lambda state, step: buffer.rebase(state, jnp.int32(100 + step)),
        "sampling_probabilities": lambda state, step: buffer.sampling_probabilities(state),
    }
    if config.sampling == "freshper":
        calls["set_age_decay_tau"] = lambda state, step: buffer.set_age_decay_tau(
            state, jnp.float32(3.0 + step))
    state = buffer.init(example)
    for step in range(SAMPLE // BATCH):
        state = add(state, step + 1)
    for function, call in calls.items():
        _lowerings(call, state, 1)  # the first call may compile
        assert _lowerings(call, state, 2) == 0, f"{name}: a second eager {function} compiled"
