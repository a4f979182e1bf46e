"""Text Sokoban (multi-turn), procedural levels that are solvable by construction.

Generation by reverse play: start from the solved state (boxes on random targets, player on
a free cell) in a `size x size` room with wall border, then take `reverse_steps` random
player moves in which the player PULLS a box that is directly behind it. Every reverse move
undone is a legal forward move (a pull undone is a push), so the reversed move list is a
solution; it is kept in the state as the expert demonstration. Levels that end up solved
are re-drawn.
Observation: (first turn only) the rules, then the grid: '#' wall, '_' floor, '.' target,
'$' box, '*' box on target, '@' player, '+' player on target; then "move:".
Action: U, D, L or R then EOS (the vocabulary's end-of-turn token). Reward (ROLL/RAGEN
convention): -0.1 per move, +1 for a box pushed onto a target, -1 for one pushed off, +10
when all boxes are on targets (episode ends); a malformed action costs `format_penalty` and
does not move.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from fresh_rl.llm.tasks import text
from fresh_rl.llm.tasks.frozenlake import DELTAS, MOVES
from fresh_rl.llm.tasks.vocab import CHAR_VOCAB, SpeaksVocab, TaskVocab
from fresh_rl.validation import require_in_range

RULES = "Push every $ onto a . target. Reply U, D, L or R.\n"
_MOVE_T = jnp.asarray(text.const(MOVES))
_OPPOSITE = jnp.array([1, 0, 3, 2], jnp.int32)
STEP_REWARD, BOX_REWARD, SOLVED_REWARD = -0.1, 1.0, 10.0
_MAX_DRAWS = 16


@flax.struct.dataclass
class SokobanState:
    walls: jax.Array  # [size, size] bool
    targets: jax.Array  # [size, size] bool
    boxes: jax.Array  # [size, size] bool
    player: jax.Array  # [2]
    turn: jax.Array
    solution: jax.Array  # [reverse_steps] forward moves, valid up to solution_length
    solution_length: jax.Array


def move_player(walls, boxes, player, move):
    """One forward Sokoban move: (boxes, player, moved?) — walls and double boxes block."""
    delta = jnp.asarray(DELTAS)[move]
    target = player + delta
    beyond = target + delta
    size = walls.shape[0]
    in_bounds = jnp.all((beyond >= 0) & (beyond < size))
    beyond = jnp.clip(beyond, 0, size - 1)
    box_ahead = boxes[target[0], target[1]]
    can_push = in_bounds & ~walls[beyond[0], beyond[1]] & ~boxes[beyond[0], beyond[1]]
    moved = ~walls[target[0], target[1]] & (~box_ahead | can_push)
    pushed = moved & box_ahead
    boxes = jnp.where(pushed, boxes.at[target[0], target[1]].set(False)
                      .at[beyond[0], beyond[1]].set(True), boxes)
    return boxes, jnp.where(moved, target, player), moved


@flax.struct.dataclass
class SokobanTask(SpeaksVocab):
    size: int = flax.struct.field(pytree_node=False, default=5)
    num_boxes: int = flax.struct.field(pytree_node=False, default=1)
    reverse_steps: int = flax.struct.field(pytree_node=False, default=8)
    max_turns: int = flax.struct.field(pytree_node=False, default=10)
    format_penalty: float = flax.struct.field(pytree_node=False, default=0.15)
    vocab: TaskVocab = flax.struct.field(pytree_node=False, default=CHAR_VOCAB, repr=False)

    def __post_init__(self):
        self.vocab.require_symbols("SokobanTask", "#_.$*@+\n" + MOVES)
        require_in_range("SokobanTask.size", self.size, 4, 10)
        require_in_range("SokobanTask.num_boxes", self.num_boxes, 1, (self.size - 2) ** 2 // 4)
        require_in_range("SokobanTask.reverse_steps", self.reverse_steps, 1, 64)
        require_in_range("SokobanTask.max_turns", self.max_turns, self.reverse_steps, 64)
        require_in_range("SokobanTask.format_penalty", self.format_penalty, 0.0, 10.0)

    @property
    def obs_len(self) -> int:
        return text.grid_observation_len(RULES, self.size)

    action_len = 2

    @property
    def transcript_len(self) -> int:
        """BOS + rules + max_turns x (action + grid + chat framing)."""
        return text.grid_transcript_len(RULES, self.obs_len, self.action_len, self.max_turns,
                                        self.vocab.frame_len)

    def _draw_level(self, key):
        s = self.size
        walls = jnp.ones((s, s), bool).at[1:-1, 1:-1].set(False)
        k_cells, k_moves = jax.random.split(key)
        interior = jnp.stack(jnp.meshgrid(jnp.arange(1, s - 1), jnp.arange(1, s - 1),
                                          indexing="ij"), -1).reshape(-1, 2)
        cells = interior[jax.random.permutation(k_cells, interior.shape[0])]
        targets = jnp.zeros((s, s), bool).at[cells[:self.num_boxes, 0],
                                               cells[:self.num_boxes, 1]].set(True)
        player = cells[self.num_boxes]

        def reverse_move(carry, move):
            boxes, player, solution, count = carry
            delta = jnp.asarray(DELTAS)[move]
            new = player + delta
            behind = player - delta
            free = ~walls[new[0], new[1]] & ~boxes[new[0], new[1]]
            pull = free & boxes[behind[0], behind[1]]
            boxes = jnp.where(pull, boxes.at[behind[0], behind[1]].set(False)
                              .at[player[0], player[1]].set(True), boxes)
            solution = jnp.where(free, solution.at[count].set(_OPPOSITE[move]), solution)
            return (boxes, jnp.where(free, new, player), solution, count + free), None

        moves = jax.random.randint(k_moves, (self.reverse_steps,), 0, 4)
        init = (targets, player, jnp.zeros(self.reverse_steps, jnp.int32), jnp.int32(0))
        (boxes, player, reverse_solution, count), _ = jax.lax.scan(reverse_move, init, moves)
        # The forward solution is the reverse list read backwards.
        idx = jnp.clip(count - 1 - jnp.arange(self.reverse_steps), 0, self.reverse_steps - 1)
        solution = jnp.where(jnp.arange(self.reverse_steps) < count, reverse_solution[idx], 0)
        return SokobanState(walls=walls, targets=targets, boxes=boxes, player=player,
                            turn=jnp.int32(0), solution=solution, solution_length=count)

    def _render(self, state, with_rules):
        s = self.size
        grid = jnp.full((s, s), text.tok("_"))
        grid = jnp.where(state.targets, text.tok("."), grid)
        grid = jnp.where(state.boxes, jnp.where(state.targets, text.tok("*"), text.tok("$")), grid)
        grid = jnp.where(state.walls, text.tok("#"), grid)
        on_target = state.targets[state.player[0], state.player[1]]
        grid = grid.at[state.player[0], state.player[1]].set(
            jnp.where(on_target, text.tok("+"), text.tok("@")))
        return text.grid_observation(grid, RULES, with_rules, self.obs_len, self.vocab)

    def reset(self, key):
        def unsolved(carry):
            _, state, draws = carry
            return jnp.all(state.boxes == state.targets) & (draws < _MAX_DRAWS)

        def redraw(carry):
            key, _, draws = carry
            key, sub = jax.random.split(key)
            return key, self._draw_level(sub), draws + 1

        key, sub = jax.random.split(key)
        _, state, _ = jax.lax.while_loop(unsolved, redraw, (key, self._draw_level(sub), 1))
        obs, n = self._render(state, True)
        return obs, n, state

    def step(self, state, action, action_length):
        chars, length = self.vocab.to_chars(action, action_length)
        length, has_eos = text.strip_eos(chars, length)
        ok = has_eos & (length == 1) & jnp.any(chars[0] == _MOVE_T)
        move = jnp.argmax(chars[0] == _MOVE_T)
        boxes, player, _ = move_player(state.walls, state.boxes, state.player, move)
        boxes = jnp.where(ok, boxes, state.boxes)
        player = jnp.where(ok, player, state.player)
        on_before = jnp.sum(state.boxes & state.targets)
        on_after = jnp.sum(boxes & state.targets)
        solved = on_after == self.num_boxes
        reward = (STEP_REWARD + BOX_REWARD * (on_after - on_before).astype(jnp.float32)
                  + SOLVED_REWARD * solved)
        reward = jnp.where(ok, reward, -self.format_penalty)
        turn = state.turn + 1
        state = state.replace(boxes=boxes, player=player, turn=turn)
        obs, n = self._render(state, False)
        done = solved | (turn >= self.max_turns)
        return obs, n, state, reward, done, {"success": solved, "format_ok": ok}

    def expert_action(self, state):
        move = state.solution[jnp.minimum(state.turn, self.reverse_steps - 1)]
        return self.vocab.symbols(jnp.stack([_MOVE_T[move], text.EOS])), jnp.int32(2)
