"""Countdown: the jitted verifier against a plain-Python reference over the answer text (expert
answers, their mutations, random programs), reachability of the generated targets, bounds,
the char and BPE stand-in vocabularies, knob errors and expert rollouts."""
import os
import random
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fresh_rl.llm.rollout import expert_policy, run_episodes
from fresh_rl.llm.tasks import CountdownTask
from fresh_rl.llm.tasks.vocab import TaskVocab, with_vocab
from fresh_rl.llm.tokenizer import CHAR_TOKENIZER as TOK

STANDIN = os.path.join(os.path.dirname(__file__), "fixtures", "qwen2_bpe_tiny")
BPE = TaskVocab.from_pretrained(STANDIN)
ENVS = {"default": CountdownTask(), "wide": CountdownTask(num_count=4, max_number=30)}
JIT = {name: (jax.jit(env.reset), jax.jit(env.step), jax.jit(with_vocab(env, BPE).step))
       for name, env in ENVS.items()}
STEP_LINE = re.compile(r"([0-9]+)([-+*])([0-9]+)=([0-9]+)")
FINAL_LINE = re.compile(r"#### ([0-9]+)")
PROMPT = re.compile(r"Numbers:((?: [0-9]+)+) Target: ([0-9]+) Use \+ - \*\.\n")


def reference(env, numbers, target, answer, eos):
    """(format_ok, success) of an answer text by the rules, in plain Python."""
    lines = answer.split("\n")
    steps, final = [STEP_LINE.fullmatch(x) for x in lines[:-1]], FINAL_LINE.fullmatch(lines[-1])
    if not eos or final is None or None in steps:
        return False, False
    if not 1 <= len(steps) <= env.num_count - 1:
        return True, False
    pool, result = list(numbers), None
    for a, op, b, c in (m.groups() for m in steps):
        if max(map(len, (a, b, c))) > env.value_digits:
            return True, False
        a, b, c = int(a), int(b), int(c)
        for x in (a, b):
            if x not in pool:
                return True, False
            pool.remove(x)
        if c != {"+": a + b, "-": a - b, "*": a * b}[op]:
            return True, False
        pool.append(c)
        result = c
    value = final.group(1)
    return True, len(value) <= env.value_digits and int(value) == result == target


def char_action(env, answer, eos=True):
    ids = TOK.encode(answer) + [TOK.eos_id] * eos
    return jnp.asarray(ids + [0] * (env.action_len - len(ids)), jnp.int32), jnp.int32(len(ids))


def bpe_action(env, answer, eos=True):
    ids = BPE.tokenizer.encode(answer) + [BPE.stop_tokens[0]] * eos
    return jnp.asarray(ids + [0] * (env.action_len - len(ids)), jnp.int32), jnp.int32(len(ids))


def episode(name, seed):
    obs, n, state = JIT[name][0](jax.random.PRNGKey(seed))
    expert = TOK.decode(np.asarray(state.expert)[:int(state.expert_length)])
    return TOK.decode(np.asarray(obs)[:int(n)]), expert, state


def random_program(rng, numbers, reuse_p):
    """A well-formed answer of correct steps over the pool, drawing operands that are not (or,
    with probability ``reuse_p``, may no longer be) available; negatives stay as written."""
    pool, seen, lines = list(numbers), list(numbers), []
    for _ in range(rng.randint(1, len(numbers))):
        operands = []
        for _ in range(2):
            x = rng.choice(seen if rng.random() < reuse_p or not pool else pool)
            if x in pool:
                pool.remove(x)
            operands.append(x)
        (a, b), op = operands, rng.choice("+-*")
        c = {"+": a + b, "-": a - b, "*": a * b}[op]
        pool.append(c)
        seen.append(c)
        lines.append(f"{a}{op}{b}={c}")
    return "\n".join(lines + [f"#### {c}"]), c


def mutate(rng, kind, expert, numbers):
    """(answer text, ends with the stop token, target override or None)."""
    chars = list(expert)
    where = lambda chars_set: [i for i, c in enumerate(chars) if c in chars_set]  # noqa
    lines = expert.split("\n")
    if kind == "digit":
        i = rng.choice(where("0123456789"))
        chars[i] = rng.choice([d for d in "0123456789" if d != chars[i]])
    elif kind == "op":
        i = rng.choice(where("+-*"))
        chars[i] = rng.choice([o for o in "+-*" if o != chars[i]])
    elif kind == "swap_operands":
        k = rng.randrange(len(lines) - 1)
        a, op, b, c = STEP_LINE.fullmatch(lines[k]).groups()
        lines[k] = f"{b}{op}{a}={c}"
        return "\n".join(lines), True, None
    elif kind == "reuse":  # an operand replaced by the other one, the line recomputed
        k = rng.randrange(len(lines) - 1)
        a, op, b, _ = STEP_LINE.fullmatch(lines[k]).groups()
        c = {"+": int(a) * 2, "-": 0, "*": int(a) ** 2}[op]
        lines[k] = f"{a}{op}{a}={c}"
        return "\n".join(lines), True, None
    elif kind == "final":
        value = int(lines[-1][5:])
        lines[-1] = rng.choice([f"#### {value + rng.choice([-2, -1, 1, 7])}", f"### {value}",
                                f"####{value}", f"#### {value} ", f"#### 0{value}", "#### "])
        return "\n".join(lines), True, None
    elif kind == "drop_number":  # an empty operand or result
        runs = list(re.finditer(r"[0-9]+", expert))
        m = rng.choice(runs[:-1])
        return expert[:m.start()] + expert[m.end():], True, None
    elif kind == "no_stop":
        return expert, False, None
    elif kind == "edit":
        i = rng.randrange(len(chars) + 1)
        chars[i:i + rng.randint(0, 1)] = rng.choice(["", " ", "\n", "=", "1", "x", "-"])
    elif kind == "lines":
        k = rng.randrange(len(lines) - 1)
        lines = rng.choice([lines[:k] + lines[k + 1:], lines[:k + 1] + lines[k:],
                            lines[-1:], [" " + lines[0]] + lines[1:],
                            [lines[0].replace("=", " = ")] + lines[1:], lines + [""]])
        return "\n".join(lines), True, None
    elif kind == "program":
        answer, value = random_program(rng, numbers, rng.choice([0.0, 0.3]))
        return answer, True, (value if rng.random() < 0.7 else None)
    elif kind == "garbage":
        return "".join(rng.choice("0123456789+-*=# \nab") for _ in range(rng.randint(0, 30))), \
            rng.random() < 0.8, None
    return "".join(chars), True, None


KINDS = ["expert", "digit", "op", "swap_operands", "reuse", "final", "drop_number", "no_stop",
         "edit", "lines", "program", "program", "garbage"]


@settings(max_examples=100)
@given(st.sampled_from(sorted(ENVS)), st.integers(0, 2 ** 31 - 1), st.sampled_from(KINDS))
def test_step_agrees_with_the_python_reference(name, seed, kind):
    env, (_, step, bpe_step) = ENVS[name], JIT[name]
    prompt, expert, state = episode(name, seed % 100_000)
    rng = random.Random(seed)
    numbers = [int(x) for x in PROMPT.fullmatch(prompt).group(1).split()]
    answer, eos, target = mutate(rng, kind, expert, numbers)
    answer = answer[:env.action_len - eos]  # a longer action would be truncated
    if target is not None:
        state = state.replace(target=jnp.int32(target))
    format_ok, success = reference(env, numbers, int(state.target), answer, eos)
    if kind == "expert":
        assert success
    for act, run in ((char_action, step), (bpe_action, bpe_step)):
        *_, reward, done, info = run(state, *act(env, answer, eos))
        assert (bool(info["format_ok"]), bool(info["success"])) == (format_ok, success), \
            (act.__name__, prompt, answer, eos)
        expected = 1.0 if success else (0.0 if format_ok else -env.format_penalty)
        # a float32 task constant: ≤ 6e-8 relative ≪ approx's default rel 1e-6
        assert float(reward) == pytest.approx(expected) and bool(done)


def test_handwritten_answers():
    env, (_, step, _) = ENVS["default"], JIT["default"]
    _, _, state = episode("default", 0)
    state = state.replace(numbers=jnp.asarray([3, 7, 2], jnp.int32), target=jnp.int32(23))
    cases = {"7*3=21\n21+2=23\n#### 23": (True, True),
             "3*7=21\n2+21=23\n#### 23": (True, True),  # any order of operands
             "2*3=6\n6+7=13\n#### 23": (True, False),  # final is not the last result
             "3*7=21\n21+2=23\n#### 21": (True, False),
             "7*3=21\n21+2=23\n21+2=23\n#### 23": (True, False),  # 21 consumed once
             "7*3=21\n21+3=24\n#### 24": (True, False),  # 3 used twice
             "7-2=5\n5*3=15\n15+8=23\n#### 23": (True, False),  # 8 is not available
             "2-7=-5\n#### -5": (False, False),  # no negative numbers
             "7 * 3 = 21\n21+2=23\n#### 23": (False, False),  # no spaces
             "#### 23": (True, False),  # at least one step
             "7*=21\n21+2=23\n#### 23": (False, False),
             "7*3=21\n21+2=23\n#### 23\n": (False, False)}
    for answer, (format_ok, success) in cases.items():
        assert reference(env, [3, 7, 2], 23, answer, True) == (format_ok, success), answer
        *_, reward, _, info = step(state, *char_action(env, answer))
        assert (bool(info["format_ok"]), bool(info["success"])) == (format_ok, success), answer


@pytest.mark.parametrize("knobs", [dict(num_count=2, max_number=9, value_digits=2), dict(),
                                   dict(num_count=5, max_number=99, value_digits=4)])  # smallest, default, largest
def test_targets_reachable_and_bounds_fit(knobs):
    env = CountdownTask(**knobs)

    def play(key):  # one compilation: 256 resets, the expert's answers and their scores
        obs, n, states = jax.vmap(env.reset)(jax.random.split(key, 256))
        actions, lengths = jax.vmap(env.expert_action)(states)
        return obs, n, actions, lengths, *jax.vmap(env.step)(states, actions, lengths)[3::2]

    obs, n, actions, lengths, reward, info = jax.jit(play)(jax.random.PRNGKey(1))
    assert bool(info["success"].all()) and float(reward.min()) == 1.0
    assert int(n.max()) <= env.obs_len and int(lengths.max()) <= env.action_len
    assert int(n.max()) >= env.obs_len - 1 and 3 * env.action_len <= 4 * int(lengths.max())
    ops, targets = set(), set()
    for i in range(0, 256, 8):  # the reference, from the prompt text alone, agrees
        prompt = TOK.decode(np.asarray(obs[i])[:int(n[i])])
        expert = TOK.decode(np.asarray(actions[i])[:int(lengths[i])])
        numbers, target = PROMPT.fullmatch(prompt).groups()
        numbers = [int(x) for x in numbers.split()]
        assert len(numbers) == env.num_count and 1 <= min(numbers) <= max(numbers) <= env.max_number
        assert reference(env, numbers, int(target), expert, True) == (True, True)
        ops |= set(expert) & set("+-*")
        targets.add(int(target))
    assert ops == set("+-*") and len(targets) > 8


def test_determinism_and_knob_errors():
    reset = JIT["default"][0]
    a, b, c = (reset(jax.random.PRNGKey(k))[0] for k in (5, 5, 6))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    for knobs, match in [(dict(num_count=1), r"CountdownTask.num_count must be in \[2, 5\]"),
                         (dict(num_count=6), "CountdownTask.num_count"),
                         (dict(max_number=1), r"CountdownTask.max_number must be in \[2, 99\]"),
                         (dict(max_number=100), "CountdownTask.max_number"),
                         (dict(max_number=10, value_digits=1),
                          r"CountdownTask.value_digits must be in \[2, 4\]"),
                         (dict(value_digits=5), "CountdownTask.value_digits"),
                         (dict(format_penalty=-1.0), "CountdownTask.format_penalty")]:
        with pytest.raises(ValueError, match=match):
            CountdownTask(**knobs)


PLAY = jax.jit(lambda e: run_episodes(e, expert_policy(e), jax.random.PRNGKey(3), 8),
               static_argnums=0)


@pytest.mark.parametrize("vocab", ["char", "bpe"])
def test_expert_rollouts_succeed(vocab):
    char_env = ENVS["default"]
    env = char_env if vocab == "char" else with_vocab(char_env, BPE)
    episodes = PLAY(env)
    assert bool(episodes.success.all()) and bool(episodes.format_ok.all())
    assert int(episodes.mask.sum(1).max()) <= env.transcript_len
    if vocab == "bpe":  # the same episodes as with the char vocabulary, read through BPE
        char = PLAY(char_env)
        for i in range(8):
            tokens = np.asarray(episodes.tokens[i])
            text = BPE.decode(tokens[np.asarray(episodes.action_mask[i])])
            expected = TOK.decode(np.asarray(char.tokens[i])[np.asarray(char.action_mask[i])])
            assert text == expected + BPE.decode([BPE.stop_tokens[0]])
            assert PROMPT.search(BPE.decode(tokens[np.asarray(episodes.mask[i])]))
