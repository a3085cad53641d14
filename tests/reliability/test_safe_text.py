"""Hostile text from the cluster: what a terminal and a spreadsheet get of it.

A pod name, label or team value is chosen by whoever can create objects. These tests hold the
two neutralisers every terminal output and every CSV cell goes through
(auditor/render/safe_text.py): nothing can repaint the terminal, forge a row or run as a formula.
"""

from __future__ import annotations

import pytest

from auditor.render.safe_text import ELLIPSIS, REPLACEMENT, csv_row, csv_safe, terminal_safe


def test_plain_text_passes_unchanged() -> None:
    assert terminal_safe("train-llama-7b/worker-0 ünïcödé 训练") == "train-llama-7b/worker-0 ünïcödé 训练"


def test_a_newline_cannot_forge_a_table_row() -> None:
    forged = "pod\nml-team  fake-job  8  100%  healthy"
    out = terminal_safe(forged)
    assert "\n" not in out
    assert out == "pod\\nml-team  fake-job  8  100%  healthy"


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("a\rb", "a\\rb"),
        ("a\tb", "a\\tb"),
        ("\x1b[2J\x1b[31mred", f"{REPLACEMENT}[2J{REPLACEMENT}[31mred"),  # ANSI clear screen + colour
        ("\x1b]0;title\x07x", f"{REPLACEMENT}]0;title{REPLACEMENT}x"),  # OSC: sets the window title
        ("a\x9bb", f"a{REPLACEMENT}b"),  # C1 CSI, a one-byte escape on some terminals
        ("a\x7fb\x00c", f"a{REPLACEMENT}b{REPLACEMENT}c"),  # DEL, NUL
        ("evil\u202etxt.exe", f"evil{REPLACEMENT}txt.exe"),  # bidi override
        ("a\u2028b", f"a{REPLACEMENT}b"),  # Unicode line separator
    ],
)
def test_control_characters_are_neutralised_visibly(raw: str, expected: str) -> None:
    out = terminal_safe(raw)
    assert out == expected
    assert out.isprintable()


def test_width_truncates_with_an_ellipsis_after_neutralising() -> None:
    name = "x" * 10_000
    out = terminal_safe(name, 40)
    assert len(out) == 40 and out.endswith(ELLIPSIS) and out.startswith("x" * 39)
    assert terminal_safe("short", 40) == "short"
    assert terminal_safe("exactly-10", 10) == "exactly-10"
    assert terminal_safe("a\nb", 3) == "a\\" + ELLIPSIS  # the escape counts against the width
    assert terminal_safe("abc", 0) == ""


@pytest.mark.parametrize(
    "cell", ['=HYPERLINK("http://x","y")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\tx", "\rx"]
)
def test_a_formula_cell_is_written_as_text(cell: str) -> None:
    assert csv_safe(cell) == "'" + cell


@pytest.mark.parametrize("cell", ["ml-team", "", "a=b", "-3.5", "+2", "1e-3"])
def test_ordinary_cells_and_plain_numbers_stay(cell: str) -> None:
    assert csv_safe(cell) == cell


def test_numbers_and_rows() -> None:
    assert csv_safe(-3.5) == -3.5
    assert csv_safe(None) is None
    assert csv_row(("=1+1", 2, "team")) == ["'=1+1", 2, "team"]
    assert csv_safe("-nan") == "'-nan"  # not a figure a spreadsheet reads as a number
