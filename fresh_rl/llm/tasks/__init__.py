"""Jittable text tasks with verifiable rewards (interface: fresh_rl.llm.tasks.base)."""
from fresh_rl.llm.tasks.arithmetic import ArithmeticTask
from fresh_rl.llm.tasks.countdown import CountdownTask
from fresh_rl.llm.tasks.frozenlake import FrozenLakeTask
from fresh_rl.llm.tasks.gsm8k import Gsm8kTask, load_gsm8k_jsonl
from fresh_rl.llm.tasks.search_qa import SearchQATask
from fresh_rl.llm.tasks.sokoban import SokobanTask

__all__ = ["ArithmeticTask", "CountdownTask", "FrozenLakeTask", "Gsm8kTask", "SearchQATask",
           "SokobanTask", "load_gsm8k_jsonl"]
