"""GRPO / REINFORCE++ advantages against a NumPy reference; masks are respected."""
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fresh_rl.llm import advantages as adv

B, T = 8, 6
EPS = 1e-6

returns_st = st.lists(st.sampled_from([-0.15, 0.0, 0.0, 1.0, 0.5, 2.0]), min_size=B, max_size=B)
mask_rows_st = st.lists(st.tuples(st.integers(0, T - 1), st.integers(0, T)), min_size=B,
                        max_size=B)


def make_mask(rows):
    mask = np.zeros((B, T), bool)
    for b, (start, length) in enumerate(rows):
        mask[b, start:start + length] = True
    return mask


def np_group_norm(r, g, scale_by_std=True, ddof=0):
    r = np.asarray(r, np.float64).reshape(-1, g)
    centred = r - r.mean(axis=1, keepdims=True)
    if not scale_by_std:
        return centred.reshape(-1)
    return (centred / (r.std(axis=1, ddof=ddof, keepdims=True) + EPS)).reshape(-1)


def np_whiten(x, mask):
    v = x[mask]
    if v.size == 0:
        return np.zeros_like(x)
    return np.where(mask, (x - v.mean()) / (v.std() + EPS), 0.0)


def np_reinforce_pp(r, mask, gamma, clip):
    r = np.asarray(r, np.float64)
    norm = (r - r.mean()) / (r.std() + EPS)
    out = np.zeros((B, T))
    for b in range(B):
        idx = np.flatnonzero(mask[b])
        if idx.size == 0:
            continue
        # outcome on the last response token, discounted back over response tokens only
        for j, t in enumerate(idx):
            out[b, t] = gamma ** (idx.size - 1 - j) * norm[b]
    return np.where(mask, np.clip(np_whiten(out, mask), -clip, clip), 0.0)


@given(returns_st, mask_rows_st, st.sampled_from([2, 4, 8]), st.booleans(),
       st.sampled_from([0, 1]))
def test_grpo_matches_numpy(returns, rows, group, scale_by_std, ddof):
    mask = make_mask(rows)
    got = adv.grpo_advantages(jnp.asarray(returns), jnp.asarray(mask), group,
                              scale_by_std=scale_by_std, ddof=ddof)
    expected = np.where(mask, np_group_norm(returns, group, scale_by_std, ddof)[:, None], 0.0)
    # float32 vs float64: ≲ 10 roundings of |r| ≤ 2 over a std ≥ 0.05 (or exactly 0): ≲ 3e-5
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    # every token of a rollout carries the same advantage; equal-return groups get 0 (cross-target
    # risk: exact only if the float32 mean of equal returns is; a sequential sum of 8 × −0.15 is
    # 1 ulp off, which the ε = 1e-6 denominator turns into ≈ 0.015 here and above)
    grouped = np.asarray(returns).reshape(-1, group)
    for g in np.flatnonzero(grouped.max(1) == grouped.min(1)):
        assert np.all(np.asarray(got)[g * group:(g + 1) * group] == 0)


@given(returns_st, mask_rows_st, st.sampled_from([1.0, 0.9]), st.sampled_from([0.2, 2.0]))
def test_reinforce_pp_matches_numpy(returns, rows, gamma, clip):
    mask = make_mask(rows)
    got = adv.reinforce_pp_advantages(jnp.asarray(returns), jnp.asarray(mask), gamma=gamma,
                                      advantage_clip=clip)
    # as above (and its equal-returns risk), then whitening ≤ 48 tokens: √48·u·2.6/σ(≥ .04) ≈ 3e-5
    np.testing.assert_allclose(got, np_reinforce_pp(returns, mask, gamma, clip), rtol=1e-4,
                               atol=1e-4)
    assert np.all(np.abs(np.asarray(got)) <= clip + 1e-6)  # float32(clip): ≤ 6e-8·clip above it


def test_reinforce_pp_whitened_statistics_and_group_mode():
    returns = jnp.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    mask = jnp.asarray(make_mask([(1, 3), (0, 6), (2, 2), (0, 1), (3, 3), (1, 4), (0, 5),
                                  (2, 4)]))
    a = np.asarray(adv.reinforce_pp_advantages(returns, mask, advantage_clip=None))
    valid = a[np.asarray(mask)]
    # 2 float32 sums of 28 terms, |a| ≤ 1: ≤ 56·u ≈ 3e-6; the std is 1 − ε/std ± rounding
    assert abs(valid.mean()) < 1e-5 and abs(valid.std() - 1) < 1e-4
    # group mode: a group whose members all have the same return gets exactly 0 (ROLL mean_std)
    same = jnp.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    g = np.asarray(adv.reinforce_pp_advantages(same, mask, group_size=2, whiten_tokens=False,
                                               advantage_clip=None))
    assert np.all(g[:2] == 0) and np.all(g[4:6] == 0) and np.any(g[2:4] != 0)


@given(st.lists(st.floats(-5, 5), min_size=B * T, max_size=B * T), mask_rows_st)
def test_masked_tokens_change_nothing(values, rows):
    mask = make_mask(rows)
    x = np.asarray(values, np.float32).reshape(B, T)
    garbage = np.where(mask, x, np.nan).astype(np.float32)
    for fn in (lambda v: adv.whiten(v, jnp.asarray(mask)),
               lambda v: adv.discounted_token_returns(v, jnp.asarray(mask), 0.9),
               lambda v: adv.clip_advantages(v, jnp.asarray(mask), 1.0)):
        clean, dirty = np.asarray(fn(jnp.asarray(x))), np.asarray(fn(jnp.asarray(garbage)))
        np.testing.assert_array_equal(clean, dirty)
        assert np.all(clean[~mask] == 0)
    # float32 (x − μ)/(σ + ε): μ's rounding ≲ 2n·u·max|x| over σ + ε, unbounded by 1e-4 when
    # hypothesis draws near-equal values; atol 1e-4 widened to 1e-4 + that
    v = x[mask].astype(np.float64)
    spread = 2 * v.size * 2.0 ** -24 * np.abs(v).max() / (v.std() + EPS) if v.size else 0.0
    np.testing.assert_allclose(adv.whiten(jnp.asarray(x), jnp.asarray(mask)),
                               np_whiten(x.astype(np.float64), mask), rtol=1e-4,
                               atol=1e-4 + spread)


def test_group_size_must_divide_batch():
    with pytest.raises(ValueError, match="group_size must be >= 1 and divide the batch size 8"):
        adv.group_normalize(jnp.zeros(8), 3)
