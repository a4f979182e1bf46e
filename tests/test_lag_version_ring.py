"""Version ring: semantics vs a Python deque, eviction, early-training clipping, batched
gather, jit / vmap / donation, and bad input."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fresh_rl.lag import version_ring


def make_params(value):
    """A two-leaf pytree whose content identifies the version it was pushed as."""
    return {
        "w": jnp.full((2, 3), value, jnp.float32),
        "b": jnp.asarray(value, jnp.int32),
    }


push_jit = jax.jit(version_ring.push)
get_jit = jax.jit(version_ring.get)
version_of_jit = jax.jit(version_ring.version_of)
gather_jit = jax.jit(version_ring.gather)


class DequeRing:
    """Reference: ``deque(maxlen=K)`` of (version, value); lag clipped to the oldest held."""

    def __init__(self, capacity):
        self.items = collections.deque([(0, 0)], maxlen=capacity)

    def push(self, value):
        self.items.append((self.items[-1][0] + 1, value))

    def get(self, lag):
        return self.items[-1 - min(lag, len(self.items) - 1)]


def build(capacity, values):
    ring = version_ring.init(make_params(0), capacity)
    ref = DequeRing(capacity)
    for v in values:
        ring = push_jit(ring, make_params(v))
        ref.push(v)
    return ring, ref


@given(
    capacity=st.sampled_from([1, 2, 3, 5]),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("push"), st.integers(1, 1000)),
            st.tuples(st.just("get"), st.integers(0, 4)),
        ),
        max_size=14,
    ),
)
def test_ring_matches_deque_reference(capacity, ops):
    ring = version_ring.init(make_params(0), capacity)
    ref = DequeRing(capacity)
    for op, arg in ops:
        if op == "push":
            ring = push_jit(ring, make_params(arg))
            ref.push(arg)
        else:
            lag = min(arg, capacity - 1)
            version, value = ref.get(lag)
            params = get_jit(ring, jnp.int32(lag))
            assert int(params["b"]) == value
            np.testing.assert_array_equal(np.asarray(params["w"]), np.full((2, 3), value))
            assert int(version_of_jit(ring, jnp.int32(lag))) == version
    assert int(ring.latest_version) == ref.items[-1][0]
    assert int(version_ring.available_versions(ring)) == len(ref.items)
    held = sorted(int(v) for v in np.asarray(ring.versions) if v >= 0)
    assert held == sorted(v for v, _ in ref.items)


def test_push_evicts_the_oldest_version():
    capacity = 3
    ring, _ = build(capacity, [10, 11, 12, 13, 14])  # versions 0..5; holds 3, 4, 5
    assert sorted(np.asarray(ring.versions).tolist()) == [3, 4, 5]
    assert int(version_ring.version_of(ring, capacity - 1)) == 3
    assert int(version_ring.get(ring, capacity - 1)["b"]) == 12
    assert int(version_ring.get(ring, 0)["b"]) == 14
    assert int(version_ring.available_versions(ring)) == capacity


def test_early_training_lag_is_clipped_to_the_oldest_held_version():
    ring = version_ring.init(make_params(7), 4)
    assert int(version_ring.available_versions(ring)) == 1
    for lag in range(4):  # only version 0 exists: every lag serves it
        assert int(version_ring.get(ring, lag)["b"]) == 7
        assert int(version_ring.version_of(ring, lag)) == 0
    ring = version_ring.push(ring, make_params(8))
    assert version_ring.effective_lag(ring, jnp.arange(4, dtype=jnp.int32)).tolist() == [0, 1, 1, 1]
    assert version_ring.version_of(ring, jnp.arange(4, dtype=jnp.int32)).tolist() == [1, 0, 0, 0]
    assert int(get_jit(ring, jnp.int32(3))["b"]) == 7


@given(
    num_pushes=st.integers(0, 8),
    lags=st.lists(st.integers(0, 3), min_size=5, max_size=5),
)
def test_gather_equals_per_group_get(num_pushes, lags):
    ring, _ = build(4, list(range(1, num_pushes + 1)))
    lags = jnp.asarray(lags, jnp.int32)
    params, versions = gather_jit(ring, lags)
    assert params["w"].shape == (5, 2, 3)
    for g in range(5):
        single = version_ring.get(ring, lags[g])
        jax.tree.map(np.testing.assert_array_equal, jax.tree.map(lambda x: x[g], params), single)
        assert int(versions[g]) == int(version_ring.version_of(ring, lags[g]))
    # Pushed values equal their versions here, so the tag names the parameters served.
    np.testing.assert_array_equal(np.asarray(params["b"]), np.asarray(versions))
    np.testing.assert_array_equal(
        np.asarray(versions), num_pushes - np.minimum(np.asarray(lags), num_pushes)
    )


def test_vmap_over_rings_and_donated_push():
    seeds = 3
    rings = jax.vmap(lambda v: version_ring.init(make_params(v), 3))(jnp.arange(seeds))
    push_many = jax.jit(jax.vmap(version_ring.push), donate_argnums=0)
    for step in range(1, 5):  # ring s gets values 100·step + s
        rings = push_many(rings, jax.vmap(make_params)(100 * step + jnp.arange(seeds)))
    lags = jnp.asarray([[0, 2], [1, 1], [2, 0]], jnp.int32)  # [seeds, groups]
    params, versions = jax.jit(jax.vmap(version_ring.gather))(rings, lags)
    assert params["w"].shape == (seeds, 2, 2, 3)
    np.testing.assert_array_equal(np.asarray(versions), 4 - np.asarray(lags))
    expected = 100 * (4 - np.asarray(lags)) + np.arange(seeds)[:, None]
    np.testing.assert_array_equal(np.asarray(params["b"]), expected)


def test_bad_lags_and_capacity_raise():
    ring = version_ring.init(make_params(0), 3)
    with pytest.raises(ValueError, match=r"lag must be in \[0, 2\]"):
        version_ring.get(ring, 3)
    with pytest.raises(ValueError, match=r"lag must be in \[0, 2\]"):
        version_ring.gather(ring, jnp.asarray([0, -1], jnp.int32))
    with pytest.raises(TypeError, match="integer"):
        version_ring.get(ring, 1.0)
    for capacity in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match=r"capacity must be an integer in \[1, inf\)"):
            version_ring.init(make_params(0), capacity)
    with pytest.raises(AssertionError):  # wrong leaf shape
        version_ring.push(ring, {"w": jnp.zeros((3, 3)), "b": jnp.asarray(0, jnp.int32)})


def test_traced_out_of_range_lag_is_clipped_safely():
    ring, _ = build(3, [1, 2, 3, 4])  # latest version 4, holds 2..4
    assert int(version_of_jit(ring, jnp.int32(9))) == 2
    assert int(version_of_jit(ring, jnp.int32(-5))) == 4


def test_bf16_storage_casts_float_leaves_on_init_and_push():
    """A bfloat16 ring stores the floating leaves in bf16 (rounded as ``astype``), keeps the
    integer leaves, and ``push`` casts fp32 parameters to the stored dtype."""
    ring = version_ring.init(make_params(0.1), 3, jnp.bfloat16)
    assert ring.params["w"].dtype == jnp.bfloat16 and ring.params["b"].dtype == jnp.int32
    value = 1.0 + 2.0 ** -10  # not representable in bf16: rounds to 1.0
    ring = jax.jit(version_ring.push)(ring, make_params(value))
    latest = version_ring.get(ring, 0)
    assert latest["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(latest["w"], np.float32),
                                  np.asarray(jnp.full((2, 3), value).astype(jnp.bfloat16),
                                             np.float32))
    assert float(latest["w"][0, 0]) == 1.0 and int(latest["b"]) == 1
