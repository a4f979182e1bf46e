"""Every notebook in notebooks/ runs top to bottom (nbclient, fresh kernel, tiny scale), through
the ``run_notebook`` fixture (conftest.py). Notebook 02 runs the VACO study's ci programs and is
tested beside that experiment (test_experiment_vaco.py), where the session's compilation cache
already holds them. The two LLM notebooks compile programs of their own for 1.5–3 minutes
each on two cores and run in the slow lane (``pytest -m slow``); what they show is checked in
the default run by test_llm_async_pipeline.py (r_d vs staleness per route) and
test_llm_replay.py (the ci FreshPER experiment, its ESS-by-age fit)."""
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
NOTEBOOKS = sorted((TESTS.parent / "notebooks").glob("*.ipynb"))


def test_every_notebook_is_run_by_a_test():
    assert len(NOTEBOOKS) >= 2
    run = {m for f in TESTS.glob("test_*.py")
           for m in re.findall(r'run_notebook\("([^"]+)"\)', f.read_text())}
    assert {p.stem for p in NOTEBOOKS} <= run, {p.stem for p in NOTEBOOKS} - run


def test_notebook_01_replay_priority_staleness(run_notebook):
    run_notebook("01_replay_priority_staleness")


@pytest.mark.slow  # ~165 s: a staleness probe and two async training runs, programs of its own
def test_notebook_03_old_logits_mask_collapse(run_notebook):
    run_notebook("03_old_logits_mask_collapse")


@pytest.mark.slow  # ~90 s: traces the three ci FreshPER programs again in its own kernel
def test_notebook_04_freshper_vs_per(run_notebook):
    run_notebook("04_freshper_vs_per")
