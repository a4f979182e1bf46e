"""Text FrozenLake (multi-turn), our own jittable implementation.

Map: `size x size`, start top-left, goal bottom-right. A random monotone start-goal path is
kept safe and every other cell is a hole with probability `hole_prob`, so each map is
solvable by construction. With probability `slip_prob` a move goes to a random perpendicular
direction instead (gym's "slippery" ice, as a knob).
Observation: (first turn only) the rules line, then the grid, one row per line:
  'P' player, 'O' hole, 'G' goal, '_' ice; then "move:".
Action: one of U D L R followed by EOS (the vocabulary's end-of-turn token). Reward 1 on
reaching G (episode ends), 0 otherwise; falling in a hole ends the episode; a malformed
action costs `format_penalty` and does not move. The episode also ends after `max_turns`
moves.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.llm.tasks import text
from fresh_rl.llm.tasks.vocab import CHAR_VOCAB, SpeaksVocab, TaskVocab
from fresh_rl.validation import require_in_range

RULES = "Reach G, avoid O. Reply U, D, L or R.\n"
MOVES = "UDLR"
DELTAS = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], np.int32)
_MOVE_T = jnp.asarray(text.const(MOVES))
_ICE, _HOLE, _GOAL, _PLAYER = (text.tok(c) for c in "_OGP")


@flax.struct.dataclass
class FrozenLakeState:
    holes: jax.Array  # [size, size] bool
    player: jax.Array  # [2] int32
    turn: jax.Array
    key: jax.Array


def grid_distances(blocked, goal, size: int):
    """Shortest-path distance to `goal` on the 4-connected grid avoiding `blocked` (BFS by
    `size*size` rounds of min-relaxation); unreachable cells get size*size."""
    far = size * size
    dist = jnp.full((size, size), far, jnp.int32).at[goal[0], goal[1]].set(0)

    def relax(_, d):
        padded = jnp.pad(d, 1, constant_values=far)
        neighbours = jnp.minimum(jnp.minimum(padded[:-2, 1:-1], padded[2:, 1:-1]),
                                 jnp.minimum(padded[1:-1, :-2], padded[1:-1, 2:]))
        return jnp.where(blocked, far, jnp.minimum(d, neighbours + 1))

    return jax.lax.fori_loop(0, far, relax, dist)


@flax.struct.dataclass
class FrozenLakeTask(SpeaksVocab):
    size: int = flax.struct.field(pytree_node=False, default=4)
    hole_prob: float = flax.struct.field(pytree_node=False, default=0.3)
    slip_prob: float = flax.struct.field(pytree_node=False, default=0.0)
    max_turns: int = flax.struct.field(pytree_node=False, default=8)
    format_penalty: float = flax.struct.field(pytree_node=False, default=0.15)
    vocab: TaskVocab = flax.struct.field(pytree_node=False, default=CHAR_VOCAB, repr=False)

    def __post_init__(self):
        self.vocab.require_symbols("FrozenLakeTask", "_OGP\n" + MOVES)
        require_in_range("FrozenLakeTask.size", self.size, 2, 8)
        require_in_range("FrozenLakeTask.hole_prob", self.hole_prob, 0.0, 1.0)
        require_in_range("FrozenLakeTask.slip_prob", self.slip_prob, 0.0, 1.0)
        require_in_range("FrozenLakeTask.max_turns", self.max_turns, 1, 64)
        require_in_range("FrozenLakeTask.format_penalty", self.format_penalty, 0.0, 10.0)

    @property
    def obs_len(self) -> int:
        return text.grid_observation_len(RULES, self.size)

    action_len = 2

    @property
    def transcript_len(self) -> int:
        """BOS + rules + max_turns x (action + grid + chat framing)."""
        return text.grid_transcript_len(RULES, self.obs_len, self.action_len, self.max_turns,
                                        self.vocab.frame_len)

    def _render(self, state, with_rules):
        s = self.size
        grid = jnp.where(state.holes, _HOLE, _ICE).at[s - 1, s - 1].set(_GOAL)
        grid = grid.at[state.player[0], state.player[1]].set(_PLAYER)
        return text.grid_observation(grid, RULES, with_rules, self.obs_len, self.vocab)

    def reset(self, key):
        s = self.size
        k_path, k_holes, k_state = jax.random.split(key, 3)
        # Monotone path: a random order of (s-1) downs and (s-1) rights.
        downs = jax.random.permutation(k_path, jnp.arange(2 * (s - 1))) < s - 1
        rows = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(downs)])
        cols = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(~downs)])
        on_path = jnp.zeros((s, s), bool).at[rows, cols].set(True)
        holes = (jax.random.uniform(k_holes, (s, s)) < self.hole_prob) & ~on_path
        state = FrozenLakeState(holes=holes, player=jnp.zeros(2, jnp.int32), turn=jnp.int32(0),
                                key=k_state)
        obs, n = self._render(state, True)
        return obs, n, state

    def step(self, state, action, action_length):
        s = self.size
        chars, length = self.vocab.to_chars(action, action_length)
        length, has_eos = text.strip_eos(chars, length)
        move = jnp.argmax(chars[0] == _MOVE_T)
        ok = has_eos & (length == 1) & jnp.any(chars[0] == _MOVE_T)
        key, k_slip, k_side = jax.random.split(state.key, 3)
        slipped = jax.random.uniform(k_slip) < self.slip_prob
        # Perpendicular moves: U/D (0, 1) slip to L/R (2, 3) and vice versa.
        side = jnp.where(move < 2, 2, 0) + jax.random.randint(k_side, (), 0, 2)
        move = jnp.where(slipped, side, move)
        target = jnp.clip(state.player + jnp.asarray(DELTAS)[move], 0, s - 1)
        player = jnp.where(ok, target, state.player)
        fell = state.holes[player[0], player[1]]
        success = jnp.all(player == s - 1)
        turn = state.turn + 1
        state = FrozenLakeState(holes=state.holes, player=player, turn=turn, key=key)
        reward = jnp.where(ok, success.astype(jnp.float32), -self.format_penalty)
        done = fell | success | (turn >= self.max_turns)
        obs, n = self._render(state, False)
        return obs, n, state, reward, done, {"success": success, "format_ok": ok}

    def expert_action(self, state):
        s = self.size
        dist = grid_distances(state.holes, jnp.array([s - 1, s - 1]), s)
        targets = jnp.clip(state.player[None] + jnp.asarray(DELTAS), 0, s - 1)
        move = jnp.argmin(dist[targets[:, 0], targets[:, 1]])
        return self.vocab.symbols(jnp.stack([_MOVE_T[move], text.EOS])), jnp.int32(2)
