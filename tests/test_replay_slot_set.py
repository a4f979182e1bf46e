"""The slot set behind the replay floor: batched insert/remove against a Python set, and the
floored items' sampled frequencies against their exact probabilities."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fresh_rl.replay import ReplayConfig, make_trajectory_buffer, slot_set

CAPACITY, BATCH = 24, 6


def _check_members(s: slot_set.SlotSet, model: set, capacity: int) -> None:
    size = int(s.size)
    members = np.asarray(s.members)[:size]
    assert size == len(model) and set(members.tolist()) == model
    position = np.asarray(s.position)
    for slot in range(capacity):
        if slot in model:
            assert members[position[slot]] == slot
        else:
            assert position[slot] == capacity
    np.testing.assert_array_equal(np.asarray(slot_set.contains(s, jnp.arange(capacity))),
                                  [slot in model for slot in range(capacity)])


def _check(s: slot_set.SlotSet, model: set) -> None:
    _check_members(s, model, CAPACITY)


_insert = jax.jit(slot_set.insert)
_remove = jax.jit(slot_set.remove)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, CAPACITY - 1), min_size=BATCH,
                                                   max_size=BATCH, unique=True),
                          st.lists(st.booleans(), min_size=BATCH, max_size=BATCH)),
                min_size=1, max_size=12),
       st.lists(st.booleans(), min_size=CAPACITY, max_size=CAPACITY))
def test_batched_insert_and_remove_match_a_python_set(operations, start):
    """Any sequence of batched inserts (of non-members) and removals (of members) from any
    starting set keeps ``members[:size]`` equal to the set and ``position`` its inverse."""
    s = slot_set.from_mask(jnp.asarray(start))
    model = {i for i, x in enumerate(start) if x}
    _check(s, model)
    for is_insert, slots, mask in operations:
        # Keep only the entries the operation allows: non-members to insert, members to remove.
        mask = [m and ((slot not in model) == is_insert) for slot, m in zip(slots, mask)]
        args = (s, jnp.asarray(slots, jnp.int32), jnp.asarray(mask))
        s = _insert(*args) if is_insert else _remove(*args)
        chosen = {slot for slot, m in zip(slots, mask) if m}
        model = model | chosen if is_insert else model - chosen
        _check(s, model)


def test_removing_the_whole_tail_and_everything():
    s = slot_set.from_mask(jnp.arange(CAPACITY) < 10)
    s = _remove(s, jnp.asarray([9, 8, 7, 0, 1, 2], jnp.int32), jnp.ones(BATCH, bool))
    _check(s, {3, 4, 5, 6})
    s = _remove(s, jnp.asarray([3, 4, 5, 6, 0, 0], jnp.int32),
                jnp.asarray([True, True, True, True, False, False]))
    _check(s, set())


def test_floored_items_are_sampled_at_their_exact_probability():
    """Most of the buffer below the floor (f = 0.05, ages ≫ τ): chi-square of 2^15 draws (512 batches of 64)
    against P(i) ∝ max(p_i e^{−age/τ}, f)^α, floored and unfloored items alike."""
    capacity, sample_size, tau, floor, alpha = 64, 64, 5.0, 0.05, 0.6
    buffer = make_trajectory_buffer(ReplayConfig(
        capacity=capacity, sample_batch_size=sample_size, sampling="freshper",
        priority_exponent=alpha, age_decay_tau=tau, new_item_priority="given",
        min_decayed_priority=floor))
    rng = np.random.default_rng(0)
    priorities = rng.uniform(0.1, 2.0, capacity).astype(np.float32)
    versions = np.repeat(np.arange(0, 64, 8), 8).astype(np.int32)  # ages 0..56 at τ = 5
    state = buffer.init({"x": jnp.zeros(())})
    for chunk in range(8):
        rows = slice(8 * chunk, 8 * chunk + 8)
        state = buffer.add(state, {"x": jnp.zeros((8,))}, jnp.asarray(versions[rows]),
                           jnp.asarray(priorities[rows]))
    decayed = priorities * np.exp(-(versions.max() - versions) / tau)
    expected = np.maximum(decayed, floor) ** alpha
    expected /= expected.sum()
    # ages ≥ 24 give p·e^(−age/τ) ≤ 2e^(−4.8) < f: at least 40 floored, the age-0 ones never
    assert 20 <= int(state.floored.size) < capacity  # both paths of the draw are exercised
    # float32 keys and F with exponents ≲ 7 (α Δt/τ ≤ 6.7) and a 64-leaf sum: ≲ 50 u ≈ 3e-6, rtol 1e-4
    np.testing.assert_allclose(np.asarray(buffer.sampling_probabilities(state)), expected,
                               rtol=1e-4)
    draw = jax.jit(jax.vmap(lambda k: buffer.sample(state, k).indices))
    counts = np.bincount(np.asarray(draw(jax.random.split(jax.random.key(1), 512))).ravel(),
                         minlength=capacity)
    chi2 = stats.chisquare(counts, expected * counts.sum())
    assert chi2.pvalue > 1e-3, chi2  # fixed key: a 0.1% false alarm for a correct sampler


def test_a_large_crossing_floors_exactly_the_items_below_the_floor():
    """900 items cross the floor in one add: afterwards exactly they are floored, at the eager
    P(i)."""
    capacity, tau, floor, alpha = 1024, 10.0, 1e-4, 0.6
    buffer = make_trajectory_buffer(ReplayConfig(
        capacity=capacity, sample_batch_size=8, sampling="freshper", priority_exponent=alpha,
        age_decay_tau=tau, new_item_priority="given", min_decayed_priority=floor))
    rng = np.random.default_rng(0)
    priorities = rng.uniform(0.5, 2.0, capacity).astype(np.float32)
    versions = np.where(np.arange(capacity) < 900, 0, 200).astype(np.int32)  # e^−20 < f
    state = buffer.init({"x": jnp.zeros(())})
    add = jax.jit(buffer.add)
    state = add(state, {"x": jnp.zeros((900,))}, jnp.asarray(versions[:900]),
                jnp.asarray(priorities[:900]))
    assert int(state.floored.size) == 0
    state = add(state, {"x": jnp.zeros((124,))}, jnp.asarray(versions[900:]),
                jnp.asarray(priorities[900:]))
    # robust to rounding: the old items sit ≥ 2e4× below f (2·e^−20 = 4e-9), the new ones ≥ 5e3× above
    _check_members(state.floored, set(range(900)), capacity)
    decayed = priorities * np.exp(-(200 - versions) / tau)
    expected = np.maximum(decayed, floor) ** alpha
    # exponents ≲ 13 (α·200/τ = 12, no rebase) in float32, a 1024-leaf sum: ≲ 80 u ≈ 5e-6, rtol 1e-4
    np.testing.assert_allclose(np.asarray(buffer.sampling_probabilities(state)),
                               expected / expected.sum(), rtol=1e-4)


@pytest.mark.parametrize("sampling, floor", [("freshper", 1e-8), ("freshper", 0.0),
                                             ("uniform", 1e-8)])
def test_replay_state_checkpoints_and_restores(tmp_path, sampling, floor):
    """Every configuration's state saves and restores through the run checkpointer (orbax
    cannot save zero-size arrays: the floor-less buffer's set has one unused slot)."""
    from fresh_rl.sweep import RunCheckpointer

    buffer = make_trajectory_buffer(ReplayConfig(capacity=16, sample_batch_size=4,
                                                 sampling=sampling, min_decayed_priority=floor))
    state = buffer.add(buffer.init({"x": jnp.zeros(())}), {"x": jnp.arange(5.0)}, 3)
    checkpointer = RunCheckpointer(tmp_path, "replay")
    checkpointer.save(1, state)
    step, restored = checkpointer.restore_latest(jax.tree.map(np.zeros_like, state))
    assert step == 1
    jax.tree.map(np.testing.assert_array_equal, restored, state)  # saved bytes restored: exact
