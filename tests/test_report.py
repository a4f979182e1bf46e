"""fresh_rl.report: the pieces every study's tables, figures and README are written with."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats

from fresh_rl.provenance import provenance
from fresh_rl.report import (grouped, histogram_mean, interval, markdown_table, plot_interval_curves,
                             position_on_grid, save_panels, write_readme)


def test_markdown_table_has_a_header_a_rule_and_a_line_per_row():
    assert markdown_table(("a", "b"), [(1, "x"), (2.5, None)]) == [
        "| a | b |", "|---|---|", "| 1 | x |", "| 2.5 | None |"]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 2), st.floats(-5, 5)), max_size=30))
def test_grouped_partitions_rows_in_first_seen_order(items):
    rows = [{"k": k, "j": j, "v": v} for k, j, v in items]
    groups = grouped(rows, ("k", "j"))
    assert list(groups) == list(dict.fromkeys((r["k"], r["j"]) for r in rows))
    assert sum(len(g) for g in groups.values()) == len(rows)
    for key, members in groups.items():
        assert [r for r in rows if (r["k"], r["j"]) == key] == members


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=12))
def test_interval_is_the_student_t_interval(values):
    """Differential against SciPy's t quantile; the tolerance covers float64 summation order only."""
    mean, low, high = interval(values)
    x = np.asarray(values)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    assert mean == pytest.approx(x.mean(), abs=1e-9)
    assert (low, high) == pytest.approx((x.mean() - half, x.mean() + half), abs=1e-9)


def test_interval_curves_draw_the_mean_and_interval_at_each_x(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    cells = [[1.0, 2.0, 3.0], [], [4.0, 6.0]]
    plot_interval_curves(ax, [4, 16, 64], {"vaco": cells}, "M", "return")
    line = ax.lines[0]
    assert np.allclose(line.get_ydata()[[0, 2]], [2.0, 5.0]) and np.isnan(line.get_ydata()[1])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4", "16", "64"]
    bars = ax.collections[0].get_segments()  # the error bars: (low, high) per drawn x
    assert np.allclose([bars[0][0][1], bars[0][1][1]], interval(cells[0])[1:])
    plt.close(fig)


def test_save_panels_and_write_readme_write_their_files(tmp_path):
    drawn = []
    save_panels(tmp_path / "f.png", ["CartPole-v1", "Acrobot-v1"],
                lambda ax, task: (drawn.append(task), ax.plot([0, 1], [0, 1], label="x")))
    assert drawn == ["CartPole-v1", "Acrobot-v1"] and (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    text = write_readme(tmp_path, "A study", provenance(), ["", "body"])
    assert text.startswith("# A study\n\n") and text.endswith("\nbody\n")
    assert (tmp_path / "README.md").read_text() == text


def test_position_on_grid_and_histogram_mean():
    assert position_on_grid(10, (1, 10, 100)) == "(= 10, on the grid)"
    assert position_on_grid(20, (1, 10, 100)) == "(between 10 and 100)"
    assert histogram_mean([[0, 2, 0], [0, 0, 2]]) == pytest.approx(1.5)
