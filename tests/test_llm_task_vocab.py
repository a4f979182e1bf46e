"""Tokenizer-agnostic tasks: the BPE stand-in's task vocabulary (chat framing, parsing of
model tokens), the mismatch errors and the stand-in model playing episodes. The chat framing
is checked against transformers' own apply_chat_template output
(tests/fixtures/qwen2_bpe_tiny/reference.json); every task's expert episodes through this
vocabulary: tests/test_llm_task_vocab_episodes.py."""
import dataclasses
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fresh_rl.lag import version_ring
from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm.checkpoint import load_hf_checkpoint, load_hf_model
from fresh_rl.llm.model import preset
from fresh_rl.llm.rollout import model_policy, run_episodes
from fresh_rl.llm.sampler import SamplingConfig
from fresh_rl.llm.tasks import (ArithmeticTask, FrozenLakeTask, Gsm8kTask, SearchQATask,
                                SokobanTask)
from fresh_rl.llm.tasks.vocab import (CHAR_VOCAB, UNKNOWN_CHAR, TaskVocab, chat_framing,
                                      check_model_vocab, render_chat_template, with_vocab)
from fresh_rl.llm.tokenizer import CHAR_TOKENIZER
from fresh_rl.llm.trainer import RLConfig
from fresh_rl.llm.warm_start import WarmStartConfig, evaluate, warm_start

STANDIN = os.path.join(os.path.dirname(__file__), "fixtures", "qwen2_bpe_tiny")
BPE = TaskVocab.from_pretrained(STANDIN)
END, ALT_END = BPE.stop_tokens  # <|im_end|>, <|endoftext|> (generation_config.json)
with open(os.path.join(STANDIN, "reference.json")) as f:
    REFERENCE = json.load(f)
ARITH, LAKE = ArithmeticTask(digits=2, steps=2), FrozenLakeTask(size=3, max_turns=4)


def test_vocab_reads_the_folder():
    assert (BPE.vocab_size, BPE.pad_id, BPE.stop_tokens) == (704, 0, (2, 0))
    assert BPE.decode([BPE.bos_id]) == "<|im_start|>"
    assert BPE.decode(BPE.obs_suffix) == "<|im_end|>\n<|im_start|>assistant\n"
    assert BPE.decode(BPE.turn_prefix) == "\n<|im_start|>user\n"
    assert TaskVocab.from_pretrained(STANDIN) == BPE and hash(TaskVocab.from_pretrained(
        STANDIN)) == hash(BPE)  # equal folders: one compilation
    assert CHAR_VOCAB.frame_len == 0
    assert BPE.frame_len == len(BPE.first_prefix) + len(BPE.obs_suffix)
    wide = dataclasses.replace(CHAR_VOCAB, vocab_size=1024)  # a char task for a bigger model
    assert wide.vocab_size == 1024 and wide.is_char and wide.stop_tokens == (2,)
    wide = dataclasses.replace(BPE, vocab_size=1024)  # rebuilt from the same tokenizer
    assert wide.token_chars[0].shape == (1024, 16) and wide.chat_template is not None
    np.testing.assert_array_equal(wide.obs_suffix, BPE.obs_suffix)
    with pytest.raises(ValueError, match="'x' needs its tokenizer"):
        TaskVocab(source="x", vocab_size=128, pad_id=0, bos_id=1, stop_tokens=(2,))


def test_chat_framing_matches_transformers_apply_chat_template():
    for chat in REFERENCE["chats"]:
        messages = chat["messages"]
        ids = [BPE.bos_id, *BPE.first_prefix]
        for i, message in enumerate(messages):
            if message["role"] == "user":
                ids += [*(BPE.turn_prefix if i else []), *BPE.segment(message["content"]),
                        *BPE.obs_suffix]
            else:
                ids += [*BPE.segment(message["content"]), END]
        assert BPE.decode(ids) == chat["text"]
        assert render_chat_template(BPE.tokenizer.chat_template, messages) == chat["text"]


def test_templates_that_are_not_turn_by_turn_raise():
    plain = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
             "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert chat_framing(plain, "</s>") == ("<user>", "<user>", "</s><assistant>")
    header = plain.replace("<{{ m['role'] }}>", "{{ '<bot>' if m['role'] == 'assistant' "
                                                "else '<' + m['role'] + '>' }}")
    with pytest.raises(ValueError, match="the chat template is not turn-by-turn"):
        chat_framing(header, "</s>")


def test_model_answers_parse_whatever_the_tokenization():
    """Canonical BPE encodings (merged tokens like '####'), either stop token, or none."""
    env = ARITH.replace(vocab=BPE)
    assert len(BPE.segment("x=1 #### 105")) < len("x=1 #### 105")  # really merged
    obs, n, states = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), 4))
    step = jax.jit(env.step)
    for i in range(4):
        question = BPE.decode(obs[i][:int(n[i])])
        assert question.endswith(" now?\n") and "<|" not in question
        state = jax.tree_util.tree_map(lambda x: x[i], states)
        truth = int(state.answer)
        for text, end, reward in [(f"x=1 #### {truth}", END, 1.0), (f"####{truth}", ALT_END, 1.0),
                                  (f"#### {truth + 1}", END, 0.0), (f"#### {truth}", None, -0.15),
                                  ("#### 1a", END, -0.15)]:
            ids = list(BPE.segment(text)) + ([end] if end is not None else [])
            action = jnp.asarray(ids + [BPE.pad_id] * (env.action_len - len(ids)), jnp.int32)
            # a float32 task constant: ≤ 6e-8 relative ≪ approx's default rel 1e-6
            assert float(step(state, action, jnp.int32(len(ids)))[3]) == pytest.approx(reward)
    chars, count = BPE.to_chars(jnp.asarray([BPE.bos_id, 300, END, 5], jnp.int32), 3)
    assert int(count) == 1 + len(BPE.decode([300])) + 1
    assert int(chars[0]) == UNKNOWN_CHAR and int(chars[int(count) - 1]) == CHAR_TOKENIZER.eos_id


def test_search_and_grid_answers_from_canonical_tokens():
    qa, lake = SearchQATask(vocab=BPE), LAKE.replace(vocab=BPE)
    obs, n, state = jax.jit(qa.reset)(jax.random.PRNGKey(5))
    entity = re.search(r"of (\w+)\?", BPE.decode(obs[:int(n)])).group(1)
    ids = list(BPE.segment("search:" + entity)) + [END]
    out = jax.jit(qa.step)(state, jnp.asarray(ids + [0] * (qa.action_len - len(ids))),
                           jnp.int32(len(ids)))
    assert BPE.decode(out[0][:int(out[1])]).startswith(entity + ": ")
    assert bool(out[5]["format_ok"]) and not bool(out[4])
    _, _, state = jax.jit(lake.reset)(jax.random.PRNGKey(1))
    for move, ok in [("R", True), (" R", False), ("RR", False)]:
        ids = list(BPE.segment(move)) + [END]
        ids += [0] * (lake.action_len + 2 - len(ids))
        info = jax.jit(lake.step)(state, jnp.asarray(ids[:3]), jnp.int32(len(move) + 1))[5]
        assert bool(info["format_ok"]) == ok, move


class _SplitHash:
    """A tokenizer that spells '#' with two tokens (a vocabulary Sokoban cannot speak)."""

    vocab_size, pad_id, bos_id, eos_id = 128, 0, 1, 2

    def encode(self, text):
        return [i for c in text for i in ([120, 120] if c == "#" else CHAR_TOKENIZER.encode(c))]

    def decode(self, ids, skip_special_tokens=True):
        return CHAR_TOKENIZER.decode([i for i in ids if i != 120], strict=False)

    def token_texts(self):
        return [CHAR_TOKENIZER.decode([i], strict=False) for i in range(128)]


def test_mismatches_raise_naming_both():
    split = TaskVocab(source="split-hash", vocab_size=128, pad_id=0, bos_id=1, stop_tokens=(2,),
                      tokenizer=_SplitHash())
    with pytest.raises(ValueError, match=r"SokobanTask cannot be expressed in the task "
                                         r"vocabulary 'split-hash': symbol '#' encodes to ids "
                                         r"\[120, 120\]"):
        SokobanTask(vocab=split)
    FrozenLakeTask(vocab=split)  # no '#' in FrozenLake
    config, params = load_hf_checkpoint(STANDIN)
    message = (r"ArithmeticTask speaks the task vocabulary 'char' \(vocab_size 128\) but the "
               r"model has vocab_size 704")
    with pytest.raises(ValueError, match=message):
        check_model_vocab(ARITH, config)
    with pytest.raises(ValueError, match=message):
        evaluate(params, config, ARITH, jax.random.PRNGKey(0), episodes=2)
    # The asynchronous (and replay) trainers collect through async_pipeline.collect.
    async_config = ap.AsyncConfig(staleness_window=1)
    rl_config = RLConfig(num_groups=1, group_size=2)
    with pytest.raises(ValueError, match=message):
        ap.collect(version_ring.init(params, 2), jnp.zeros((2,), jnp.int32),
                   jax.random.PRNGKey(0), config=rl_config, async_config=async_config, env=ARITH,
                   model_config=config)
    with pytest.raises(ValueError, match="vocab_size 704.*model has vocab_size 128"):
        warm_start(preset("tiny"), {"a": ARITH.replace(vocab=BPE)}, WarmStartConfig(steps=2,
                   warmup_steps=0), jax.random.PRNGKey(0))
    env = LAKE.replace(vocab=BPE)
    wrong_stop = SamplingConfig(max_new_tokens=2, stop_tokens=(2,), pad_id=0)
    with pytest.raises(ValueError, match=r"stop_tokens \(2,\) must contain the stop tokens "
                                         r"\(2, 0\)"):
        run_episodes(env, model_policy(params, config, wrong_stop), jax.random.PRNGKey(0), 2)


def test_load_hf_model_and_with_vocab():
    config, params, vocab = load_hf_model(STANDIN)
    assert vocab == BPE and config.vocab_size == vocab.vocab_size
    env = with_vocab(ARITH, vocab)
    check_model_vocab(env, config)
    assert (env.digits, env.steps, env.stop_tokens, env.pad_id) == (2, 2, (2, 0), 0)
    assert env.transcript_len == ARITH.transcript_len + BPE.frame_len
    bank = Gsm8kTask.from_records([("Ann has 3 pens.", 3)], max_question_chars=32)
    with pytest.raises(ValueError, match="problem bank is encoded in the vocabulary 'char'"):
        with_vocab(bank, vocab)
    assert with_vocab(bank, CHAR_VOCAB) is not None


@pytest.mark.slow
def test_rl_probe_runs_on_the_standin(tmp_path, csv_rows):
    """experiments/llm_rl_probe.py --model at its smallest scale (~75 s on 2 loaded cores)."""
    out = tmp_path / "probe.csv"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, os.path.join(root, "experiments", "llm_rl_probe.py"),
                           "--model", STANDIN, "--lr", "1e-4", "--iterations", "2", "--num-groups", "2",
                           "--eval-episodes", "16", "--out", str(out)],
                          capture_output=True, text=True, cwd=root, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = csv_rows(out)
    assert row["checkpoint"] == STANDIN
    assert 0.0 <= float(row["heldout_success_after"]) <= 1.0


def test_standin_model_plays_episodes_end_to_end():
    config, params = load_hf_checkpoint(STANDIN)
    env = LAKE.replace(vocab=BPE)
    metrics = evaluate(params, config, env, jax.random.PRNGKey(0), episodes=4)
    assert 0.0 <= metrics["success"] <= 1.0 and 0.0 <= metrics["format_ok"] <= 1.0
    # bf16 sampler vs fp32 on the model's own actions: ≤ 2·max|Δz|, a few bf16 roundings of
    # |z| ≲ 5 (u_bf16·5 ≈ 0.02 each) ≈ 0.1; a target changes only fp32 sums
    assert metrics["abs_log_rd_max"] < 0.5
