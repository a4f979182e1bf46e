"""Multi-turn search QA with a tool call (NQ-search-like), over a synthetic knowledge base.

Each episode draws a fresh knowledge base: `num_entities` distinct 4-letter entity names
(consonant-vowel-consonant-vowel), each with a random 4-letter value for each of
`num_relations` relations. The question asks one (entity, relation) pair, so the answer can
only be known by searching (values are random, not guessable). Difficulty knob `name_pool`:
names and values come from `name_pool` of the 4900 possible names (evenly spaced in
name-index order), so a small pool makes the names familiar words that are easier to copy.
  obs 1:  "Use search:<name> or answer:<value>.\nQ: what is the color of kavo?\n"
  action: "search:kavo"<eos>  -> obs "kavo: color bime, city tuso.\n"  (reward -tool_cost)
  action: "answer:bime"<eos>  -> episode ends, reward 1 if exact match else 0.
Searching an unknown name returns "no result.\n" (and still costs `tool_cost`). A malformed
action costs `format_penalty` and uses up a turn. The episode ends on an answer or after
`max_turns` actions. Success = exact-match answer.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from fresh_rl.llm.tasks import text
from fresh_rl.llm.tasks.vocab import CHAR_VOCAB, SpeaksVocab, TaskVocab
from fresh_rl.validation import require_in_range

RELATIONS = ("color", "city", "pet", "food")
RULES = "Use search:<name> or answer:<value>.\n"
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
NAME_LEN = 4
_NUM_NAMES = (len(CONSONANTS) * len(VOWELS)) ** 2
_CONS_T = jnp.asarray(text.const(CONSONANTS))
_VOW_T = jnp.asarray(text.const(VOWELS))
_SEARCH, _ANSWER = text.const("search:"), text.const("answer:")


def name_tokens(index):
    """Tokens of the 4-letter name number `index` in [0, 4900): C V C V."""
    c, v = len(CONSONANTS), len(VOWELS)
    return jnp.stack([_CONS_T[index // (v * c * v)], _VOW_T[(index // (c * v)) % v],
                      _CONS_T[(index // v) % c], _VOW_T[index % v]], axis=-1)


@flax.struct.dataclass
class SearchQAState:
    names: jax.Array  # [E, 4] char ids
    values: jax.Array  # [E, R, 4] char ids
    entity: jax.Array  # asked entity
    relation: jax.Array  # asked relation
    searched: jax.Array  # the asked entity has been searched
    turn: jax.Array
    tool_calls: jax.Array


@flax.struct.dataclass
class SearchQATask(SpeaksVocab):
    num_entities: int = flax.struct.field(pytree_node=False, default=4)
    num_relations: int = flax.struct.field(pytree_node=False, default=2)
    max_turns: int = flax.struct.field(pytree_node=False, default=3)
    tool_cost: float = flax.struct.field(pytree_node=False, default=0.05)
    format_penalty: float = flax.struct.field(pytree_node=False, default=0.15)
    name_pool: int = flax.struct.field(pytree_node=False, default=_NUM_NAMES)
    vocab: TaskVocab = flax.struct.field(pytree_node=False, default=CHAR_VOCAB, repr=False)

    def __post_init__(self):
        self.vocab.require_symbols("SearchQATask", CONSONANTS + VOWELS + "search:answer:")
        require_in_range("SearchQATask.num_entities", self.num_entities, 1, 64)
        require_in_range("SearchQATask.name_pool", self.name_pool, self.num_entities, _NUM_NAMES)
        require_in_range("SearchQATask.num_relations", self.num_relations, 1, len(RELATIONS))
        require_in_range("SearchQATask.max_turns", self.max_turns, 1, 16)
        require_in_range("SearchQATask.tool_cost", self.tool_cost, 0.0, 1.0)
        require_in_range("SearchQATask.format_penalty", self.format_penalty, 0.0, 10.0)

    @property
    def obs_len(self) -> int:
        longest = max(map(len, RELATIONS))
        question = len(RULES) + len("Q: what is the ") + longest + len(" of ") + NAME_LEN + 2
        result = NAME_LEN + 1 + self.num_relations * (longest + NAME_LEN + 3) + 1
        return max(question, result)

    action_len = len("answer:") + NAME_LEN + 1

    @property
    def transcript_len(self) -> int:
        return 1 + self.max_turns * (self.obs_len + self.action_len + self.vocab.frame_len)

    def reset(self, key):
        k_names, k_values, k_entity, k_relation = jax.random.split(key, 4)
        e, r = self.num_entities, self.num_relations
        stride = _NUM_NAMES // self.name_pool
        names = name_tokens(stride * jax.random.choice(k_names, self.name_pool, (e,),
                                                       replace=False))
        values = name_tokens(stride * jax.random.randint(k_values, (e, r), 0, self.name_pool))
        entity = jax.random.randint(k_entity, (), 0, e)
        relation = jax.random.randint(k_relation, (), 0, r)
        state = SearchQAState(names=names, values=values, entity=entity, relation=relation,
                              searched=jnp.bool_(False), turn=jnp.int32(0),
                              tool_calls=jnp.int32(0))
        vocab = self.vocab
        relations, relation_lengths = vocab.segment_table(RELATIONS)
        obs, n = text.append(jnp.zeros(self.obs_len, jnp.int32), 0, vocab.segment(RULES))
        obs, n = text.append(obs, n, vocab.segment("Q: what is the "))
        obs, n = text.append(obs, n, relations[relation], relation_lengths[relation])
        obs, n = text.append(obs, n, vocab.segment(" of "))
        obs, n = text.append(obs, n, vocab.symbols(names[entity]))
        obs, n = text.append(obs, n, vocab.segment("?\n"))
        return obs, n, state

    def _result(self, state, found, index):
        vocab, obs = self.vocab, jnp.zeros(self.obs_len, jnp.int32)
        hit, n = text.append(obs, 0, vocab.symbols(state.names[index]))
        hit, n = text.append(hit, n, vocab.segment(":"))
        for r in range(self.num_relations):
            hit, n = text.append(hit, n, vocab.segment(" " + RELATIONS[r] + " "))
            hit, n = text.append(hit, n, vocab.symbols(state.values[index, r]))
            hit, n = text.append(hit, n, vocab.segment("," if r + 1 < self.num_relations else "."))
        hit, n = text.append(hit, n, vocab.segment("\n"))
        miss, m = text.append(obs, 0, vocab.segment("no result.\n"))
        return jnp.where(found, hit, miss), jnp.where(found, n, m)

    def step(self, state, action, action_length):
        action, length = self.vocab.to_chars(action, action_length)
        length, has_eos = text.strip_eos(action, length)
        prefix = len(_SEARCH)
        is_search = has_eos & text.starts_with(action, length, _SEARCH) & (
            length == prefix + NAME_LEN)
        is_answer = has_eos & text.starts_with(action, length, _ANSWER)
        matches = jax.vmap(lambda name: text.span_equals(action, prefix, length, name,
                                                         NAME_LEN))(state.names)
        found, index = jnp.any(matches), jnp.argmax(matches)
        truth = state.values[state.entity, state.relation]
        correct = is_answer & text.span_equals(action, prefix, length, truth, NAME_LEN)
        ok = is_search | is_answer
        reward = jnp.where(is_search, -self.tool_cost, correct.astype(jnp.float32))
        reward = jnp.where(ok, reward, -self.format_penalty)
        turn = state.turn + 1
        state = state.replace(
            searched=state.searched | (is_search & found & (index == state.entity)),
            turn=turn, tool_calls=state.tool_calls + is_search)
        obs, n = self._result(state, found, index)
        invalid, m = text.append(jnp.zeros(self.obs_len, jnp.int32), 0,
                                 self.vocab.segment("invalid.\n"))
        obs = jnp.where(is_search, obs, jnp.where(is_answer, 0, invalid))
        n = jnp.where(is_search, n, jnp.where(is_answer, 0, m))
        done = is_answer | (turn >= self.max_turns)
        return obs, n, state, reward, done, {"success": correct, "format_ok": ok}

    def expert_action(self, state):
        """search:<asked entity> first, then answer:<value>."""
        payload = jnp.where(state.searched, state.values[state.entity, state.relation],
                            state.names[state.entity])
        verb = jnp.where(state.searched, jnp.asarray(_ANSWER), jnp.asarray(_SEARCH))
        action = jnp.concatenate([verb, payload, jnp.array([text.EOS], jnp.int32)])
        return self.vocab.symbols(action), jnp.int32(self.action_len)
