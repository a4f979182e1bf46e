"""Text tasks: rewards on correct / wrong / malformed answers, solvability, determinism.

Oracles here are independent re-implementations in plain Python over the decoded text
(regex parse of the question, BFS over the rendered grid, a reference Sokoban simulator).
"""
import collections
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from fresh_rl.llm.rollout import expert_policy, run_episodes
from fresh_rl.llm.tasks import (ArithmeticTask, FrozenLakeTask, Gsm8kTask, SearchQATask,
                                SokobanTask, load_gsm8k_jsonl)
from fresh_rl.llm.tasks.arithmetic import parse_final_answer
from fresh_rl.llm.tasks.base import TextEnv
from fresh_rl.llm.tokenizer import CHAR_TOKENIZER as TOK

EOS = TOK.eos_id
# pytest.approx(reward) below: a float32 sum of ≤ 3 decimal task constants, ≤ 2 roundings
# (1.2e-7 relative) ≪ approx's default rel 1e-6


def decode(tokens, length):
    return TOK.decode(np.asarray(tokens)[:int(length)])


def action(env, s, eos=True):
    ids = TOK.encode(s) + ([EOS] if eos else [])
    assert len(ids) <= env.action_len
    return jnp.asarray(ids + [0] * (env.action_len - len(ids)), jnp.int32), jnp.int32(len(ids))


def keys(n, seed=0):
    return jax.random.split(jax.random.PRNGKey(seed), n)


@pytest.mark.parametrize("task", [ArithmeticTask, FrozenLakeTask, SearchQATask, SokobanTask])
def test_every_task_provides_the_text_env_interface(task):
    """The attributes and methods of fresh_rl.llm.tasks.base.TextEnv (the rollout reads them)."""
    assert isinstance(task(), TextEnv)


# ---------------------------------------------------------------- arithmetic / GSM8K
ARITH = ArithmeticTask(digits=2, steps=3)
ARITH_RESET = jax.jit(jax.vmap(ARITH.reset))
ARITH_STEP = jax.jit(ARITH.step)


def solve_word_problem(question):
    """Independent oracle: regex parse of the generated English."""
    value = int(re.match(r"\w+ has (\d+) ", question).group(1))
    for m in re.finditer(r"They get (\d+) more|They give away (\d+)\.|"
                         r"Then they have (\d+) times", question):
        add, sub, mul = m.groups()
        value = value + int(add) if add else value - int(sub) if sub else value * int(mul)
    return value


def test_arithmetic_answers_match_oracle_and_rewards():
    obs, n, states = ARITH_RESET(keys(32))
    for i in range(32):
        question = decode(obs[i], n[i])
        truth = solve_word_problem(question)
        assert truth >= 0 and question.endswith(" now?\n")
        state = jax.tree_util.tree_map(lambda x: x[i], states)
        expert = decode(state.expert, state.expert_length)
        assert expert.endswith(f"#### {truth}")
        cases = [(f"#### {truth}", True, 1.0), (f"x=1 ####  {truth}", True, 1.0),
                 (f"#### {truth + 1}", True, 0.0), (f"{truth}", True, -0.15),
                 (f"#### {truth}", False, -0.15), ("#### 1a", True, -0.15),
                 ("#### ", True, -0.15)]
        for text, eos, reward in cases:
            *_, r, done, info = ARITH_STEP(state, *action(ARITH, text, eos))
            assert float(r) == pytest.approx(reward), (text, eos)
            assert bool(done) and bool(info["success"]) == (reward == 1.0)


def test_arithmetic_determinism_and_config_errors():
    a, b, c = ARITH_RESET(keys(32, 1)), ARITH_RESET(keys(32, 1)), ARITH_RESET(keys(32, 2))
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])
    with pytest.raises(ValueError, match=r"ArithmeticTask.digits must be in \[1, 4\], got 5"):
        ArithmeticTask(digits=5)
    with pytest.raises(ValueError, match="ArithmeticTask.steps"):
        ArithmeticTask(steps=0)


@given(st.integers(0, 10 ** 6), st.text(alphabet="abc =+-*0123456789 ", max_size=20))
def test_parse_final_answer_property(value, prefix):
    ids = TOK.encode(prefix + "#### " + str(value)) + [EOS]
    tokens = jnp.asarray(ids + [0] * (40 - len(ids)), jnp.int32)
    parsed, ok = parse_final_answer(tokens, jnp.int32(len(ids)), 9)
    assert bool(ok) and int(parsed) == value


def test_gsm8k_loader_and_task(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    records = [{"question": "Ann has 3 pens and buys 4. How many?", "answer": "3+4=7\n#### 7"},
               {"question": "A farm sells 1234 eggs twice.", "answer": "... #### 2,468"}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    loaded = load_gsm8k_jsonl(str(path))
    assert loaded == [(records[0]["question"], 7), (records[1]["question"], 2468)]
    task = Gsm8kTask.from_records(loaded, max_question_chars=64)
    for key in keys(6):
        obs, n, state = task.reset(key)
        question = decode(obs, n)
        truth = dict(loaded)[question.strip()]
        assert float(task.step(state, *action(task, f"so #### {truth}"))[3]) == 1.0
        assert float(task.step(state, *action(task, f"#### {truth - 1}"))[3]) == 0.0
        assert float(task.step(state, *action(task, "no idea"))[3]) == pytest.approx(-0.15)
        assert decode(*task.expert_action(state)) == f"#### {truth}"
    path.write_text('{"question": "q", "answer": "42"}\n')
    with pytest.raises(ValueError, match=r"gsm8k.jsonl:1: answer has no '#### <integer>'"):
        load_gsm8k_jsonl(str(path))
    with pytest.raises(ValueError, match="max_question_chars=10"):
        Gsm8kTask.from_records(loaded, max_question_chars=10)


# ---------------------------------------------------------------- grid helpers
def parse_grid(obs_text):
    rows = [r for r in obs_text.split("\n") if r and set(r) <= set("#_.$*@+PGO")]
    return [list(r) for r in rows]


def bfs(start, goal_test, neighbours):
    seen, queue = {start: 0}, collections.deque([start])
    while queue:
        node = queue.popleft()
        if goal_test(node):
            return seen[node]
        for nxt in neighbours(node):
            if nxt not in seen:
                seen[nxt] = seen[node] + 1
                queue.append(nxt)
    return None


MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}

# ---------------------------------------------------------------- FrozenLake
LAKE = FrozenLakeTask(size=5, hole_prob=0.4, max_turns=10)
LAKE_RESET = jax.jit(jax.vmap(LAKE.reset))
LAKE_STEP, LAKE_RESET_ONE = jax.jit(LAKE.step), jax.jit(LAKE.reset)


def test_frozenlake_levels_solvable_and_deterministic():
    obs, n, _ = LAKE_RESET(keys(64))
    holes_seen = 0
    for i in range(64):
        grid = parse_grid(decode(obs[i], n[i]))
        assert grid[0][0] == "P" and grid[4][4] == "G"
        holes_seen += sum(row.count("O") for row in grid)

        def neighbours(p):
            for dr, dc in MOVES.values():
                r, c = p[0] + dr, p[1] + dc
                if 0 <= r < 5 and 0 <= c < 5 and grid[r][c] != "O":
                    yield (r, c)
        assert bfs((0, 0), lambda p: p == (4, 4), neighbours) is not None
    assert holes_seen > 64  # holes are actually placed
    np.testing.assert_array_equal(obs, LAKE_RESET(keys(64))[0])


def test_frozenlake_rewards():
    for key in keys(8, 3):
        obs, n, state = LAKE_RESET_ONE(key)
        grid = parse_grid(decode(obs, n))
        # Malformed actions: penalty, no move.
        for text, eos in [("X", True), ("UD", False), ("u", True), ("R", False)]:
            o, m, s2, r, done, info = LAKE_STEP(state, *action(LAKE, text, eos))
            assert float(r) == pytest.approx(-0.15) and not bool(info["format_ok"])
            assert parse_grid(decode(o, m))[0][0] == "P"
        # A move into a hole ends the episode with reward 0; a safe move continues.
        for move, (dr, dc) in [("D", (1, 0)), ("R", (0, 1))]:
            o, m, s2, r, done, info = LAKE_STEP(state, *action(LAKE, move))
            assert float(r) == 0.0 and bool(done) == (grid[dr][dc] == "O")
            assert parse_grid(decode(o, m))[dr][dc] == "P"


# ---------------------------------------------------------------- Sokoban
class RefSokoban:
    """Reference rules over the rendered text."""

    def __init__(self, grid):
        self.walls = {(r, c) for r, row in enumerate(grid) for c, x in enumerate(row) if x == "#"}
        self.targets = {(r, c) for r, row in enumerate(grid) for c, x in enumerate(row)
                        if x in ".*+"}
        self.boxes = frozenset((r, c) for r, row in enumerate(grid) for c, x in enumerate(row)
                               if x in "$*")
        self.player = next((r, c) for r, row in enumerate(grid) for c, x in enumerate(row)
                           if x in "@+")

    def move(self, player, boxes, m):
        dr, dc = MOVES[m]
        t = (player[0] + dr, player[1] + dc)
        b = (t[0] + dr, t[1] + dc)
        if t in self.walls:
            return player, boxes
        if t in boxes:
            if b in self.walls or b in boxes:
                return player, boxes
            boxes = (boxes - {t}) | {b}
        return t, frozenset(boxes)

    def solve_length(self):
        return bfs((self.player, self.boxes), lambda s: s[1] == self.targets,
                   lambda s: (self.move(*s, m) for m in MOVES))


@pytest.mark.parametrize("env", [SokobanTask(size=5, num_boxes=1, reverse_steps=8),
                                 SokobanTask(size=6, num_boxes=2, reverse_steps=12,
                                             max_turns=16)])
def test_sokoban_levels_solvable_by_bfs(env):
    obs, n, states = jax.jit(jax.vmap(env.reset))(keys(24, 5))
    lengths = []
    for i in range(24):
        ref = RefSokoban(parse_grid(decode(obs[i], n[i])))
        assert len(ref.boxes) == env.num_boxes == len(ref.targets)
        assert ref.boxes != ref.targets  # not already solved
        length = ref.solve_length()
        assert length is not None and 1 <= length <= int(states.solution_length[i])
        lengths.append(length)
    assert max(lengths) > 1  # not all trivial


def test_sokoban_rewards_match_reference_simulator():
    env = SokobanTask(size=6, num_boxes=2, reverse_steps=12, max_turns=16)
    step, reset = jax.jit(env.step), jax.jit(env.reset)
    rng = np.random.default_rng(0)
    for key in keys(6, 7):
        obs, n, state = reset(key)
        ref = RefSokoban(parse_grid(decode(obs, n)))
        player, boxes = ref.player, ref.boxes
        for t in range(env.max_turns):
            m = "UDLR"[rng.integers(4)]
            new_player, new_boxes = ref.move(player, boxes, m)
            delta = len(new_boxes & ref.targets) - len(boxes & ref.targets)
            solved = new_boxes == ref.targets
            expected = -0.1 + delta + 10.0 * solved
            obs, n, state, r, done, info = step(state, *action(env, m))
            assert float(r) == pytest.approx(expected, abs=1e-5)  # float32, |r| ≤ 11: ≤ 2u·11 ≈ 1.3e-6
            grid = RefSokoban(parse_grid(decode(obs, n)))
            assert grid.player == new_player and grid.boxes == new_boxes
            assert bool(done) == (solved or t + 1 == env.max_turns)
            player, boxes = new_player, new_boxes
            if done:
                break
    obs, n, state = reset(key)
    r = step(state, *action(env, "u"))[3]
    assert float(r) == pytest.approx(-0.15)
    with pytest.raises(ValueError, match="SokobanTask.max_turns"):
        SokobanTask(reverse_steps=20, max_turns=10)


# ---------------------------------------------------------------- search QA
QA = SearchQATask(num_entities=5, num_relations=3, max_turns=3, tool_cost=0.05)
QA_STEP, QA_RESET = jax.jit(QA.step), jax.jit(QA.reset)


def test_search_qa_rewards():
    for key in keys(6, 9):
        obs, n, state = QA_RESET(key)
        question = decode(obs, n)
        relation, entity = re.search(r"what is the (\w+) of (\w+)\?", question).groups()
        names = {decode(x, 4) for x in state.names}
        assert len(names) == 5 and entity in names
        o, m, s1, r, done, info = QA_STEP(state, *action(QA, "search:" + entity))
        result = decode(o, m)
        assert float(r) == pytest.approx(-0.05) and not bool(done)
        facts = dict(re.findall(r" (\w+) (\w+)[,.]", result))
        assert result.startswith(entity + ":") and len(facts) == 3
        truth = facts[relation]
        assert float(QA_STEP(s1, *action(QA, "answer:" + truth))[3]) == 1.0
        wrong = "zzzz" if truth != "zzzz" else "bbbb"
        o, m, _, r, done, info = QA_STEP(s1, *action(QA, "answer:" + wrong))
        assert float(r) == 0.0 and bool(done) and not bool(info["success"])
        unknown = next(x for x in ("bibi", "kaka", "lolo") if x not in names)
        o, m, _, r, done, _ = QA_STEP(state, *action(QA, "search:" + unknown))
        assert decode(o, m) == "no result.\n" and float(r) == pytest.approx(-0.05)
        for text, eos in [("lookup:" + entity, True), ("search:" + entity, False),
                          ("search:" + entity[:3], True)]:
            o, m, _, r, done, info = QA_STEP(state, *action(QA, text, eos))
            assert float(r) == pytest.approx(-0.15) and not bool(info["format_ok"])
        # Out of turns without answering: episode ends.
        s = state
        for t in range(3):
            *_, s, r, done, _ = QA_STEP(s, *action(QA, "search:" + entity))
        assert bool(done)


def test_frozenlake_slip_moves_perpendicular():
    env = FrozenLakeTask(size=4, hole_prob=0.0, slip_prob=1.0)
    step, reset = jax.jit(env.step), jax.jit(env.reset)
    ends = set()
    for key in keys(8, 4):
        _, _, state = reset(key)
        _, _, moved, *_ = step(state, *action(env, "R"))
        ends.add(tuple(np.asarray(moved.player)))
    assert ends <= {(0, 0), (1, 0)} and (1, 0) in ends  # U (clipped) or D, never R


@pytest.mark.parametrize("env", [
    ArithmeticTask(digits=4, steps=4), ArithmeticTask(digits=1, steps=1), FrozenLakeTask(size=8),
    SokobanTask(size=8, num_boxes=3, reverse_steps=30, max_turns=30),
    SearchQATask(num_entities=8, num_relations=4)])
def test_buffers_fit_worst_case(env):
    """Text builders count dropped tokens, so lengths above the buffer sizes would show."""
    obs, n, states = jax.jit(jax.vmap(env.reset))(keys(64, 6))
    assert int(n.max()) <= env.obs_len
    _, action_lengths = jax.vmap(env.expert_action)(states)
    assert int(action_lengths.max()) <= env.action_len


def test_search_qa_name_pool():
    env = SearchQATask(num_entities=4, num_relations=2, name_pool=6)
    _, _, states = jax.jit(jax.vmap(env.reset))(keys(16, 12))
    names = {decode(x, 4) for x in np.asarray(states.names).reshape(-1, 4)}
    values = {decode(x, 4) for x in np.asarray(states.values).reshape(-1, 4)}
    assert len(names | values) <= 6 and len(names) > 4
    with pytest.raises(ValueError, match=r"SearchQATask.name_pool must be in \[4, 4900\]"):
        SearchQATask(num_entities=4, name_pool=3)


# ---------------------------------------------------------------- rollouts
@pytest.mark.parametrize("env", [ARITH, LAKE, SokobanTask(), QA])
def test_expert_rollouts_succeed_and_mask_actions(env):
    episodes = jax.jit(lambda k: run_episodes(env, expert_policy(env), k, 8))(
        jax.random.PRNGKey(11))
    assert bool(episodes.success.all())
    assert bool((episodes.format_ok | ~episodes.turn_mask).all())
    tokens = np.asarray(episodes.tokens)
    for i in range(8):
        valid = np.asarray(episodes.mask[i])
        assert valid.sum() <= env.transcript_len and tokens[i, 0] == TOK.bos_id
        acts = np.asarray(episodes.action_mask[i])
        assert not (acts & ~valid).any()
        # The action tokens are exactly the EOS-terminated actions, one per played turn.
        assert (tokens[i][acts] == EOS).sum() == int(episodes.turn_mask[i].sum())
