"""Every task's expert episodes through the BPE stand-in's vocabulary against the char
vocabulary's: same episodes and rewards, and the BPE transcript decodes to the chat-template
rendering of the char transcript's text."""
import os

import jax
import numpy as np
import pytest

from fresh_rl.llm.rollout import expert_policy, run_episodes
from fresh_rl.llm.tasks import (ArithmeticTask, FrozenLakeTask, Gsm8kTask, SearchQATask,
                                SokobanTask)
from fresh_rl.llm.tasks.vocab import TaskVocab, render_chat_template
from fresh_rl.llm.tokenizer import CHAR_TOKENIZER

STANDIN = os.path.join(os.path.dirname(__file__), "fixtures", "qwen2_bpe_tiny")
BPE = TaskVocab.from_pretrained(STANDIN)
END = BPE.stop_tokens[0]
GSM8K_RECORDS = [("Ann has 3 pens. Bob gives her 4. How many now?", 7),
                 ("A farm sells 1234 eggs twice; how many?", 2468),
                 ("It was 5 C and fell by 12. Now?", -7)]
TASKS = {
    "arithmetic": ArithmeticTask(digits=2, steps=2),
    "frozenlake": FrozenLakeTask(size=3, hole_prob=0.3, max_turns=4),
    "sokoban": SokobanTask(size=4, num_boxes=1, reverse_steps=4, max_turns=4),
    "search_qa": SearchQATask(num_entities=3, num_relations=2, max_turns=2),
    "gsm8k": Gsm8kTask.from_records(GSM8K_RECORDS, max_question_chars=64),
}


def bpe_task(name):
    if name == "gsm8k":  # the bank is encoded at construction
        return Gsm8kTask.from_records(GSM8K_RECORDS, max_question_chars=64, vocab=BPE)
    return TASKS[name].replace(vocab=BPE)


def transcript_messages(tokens, mask, action_mask):
    """The char transcript as chat messages (user observations, assistant actions)."""
    n = int(mask.sum())
    messages, start = [], 1
    for end in list(np.flatnonzero(np.diff(action_mask[:n].astype(int))) + 1) + [n]:
        role = "assistant" if action_mask[start] else "user"
        messages.append({"role": role, "content": CHAR_TOKENIZER.decode(tokens[start:end])})
        start = end
    return messages


@pytest.mark.parametrize("name", sorted(TASKS))
def test_expert_episodes_succeed_and_read_as_the_char_text(name):
    """Same keys, same episodes: the BPE transcript decodes to the chat rendering of the
    char transcript, and the expert earns the same (successful) rewards."""
    char_env, env = TASKS[name], bpe_task(name)
    char, bpe = (jax.jit(lambda k, e=e: run_episodes(e, expert_policy(e), k, 4))(
        jax.random.PRNGKey(3)) for e in (char_env, env))
    assert bool(bpe.success.all()) and bool((bpe.format_ok | ~bpe.turn_mask).all())
    np.testing.assert_allclose(bpe.rewards, char.rewards)  # the same float32 constants: exact
    tokens = np.asarray(bpe.tokens)
    for i in range(4):
        messages = transcript_messages(np.asarray(char.tokens[i]), np.asarray(char.mask[i]),
                                       np.asarray(char.action_mask[i]))
        assert messages[-1]["role"] == "assistant"  # an episode ends after an action
        expected = render_chat_template(BPE.tokenizer.chat_template, messages)
        decoded = BPE.decode(tokens[i][np.asarray(bpe.mask[i])])
        assert decoded + "\n<|im_start|>assistant\n" == expected  # + the generation prompt
        assert int(bpe.mask[i].sum()) <= env.transcript_len
        acted = tokens[i][np.asarray(bpe.action_mask[i])]
        assert (acted == END).sum() == int(bpe.turn_mask[i].sum())
