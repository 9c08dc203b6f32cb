"""The stylesheet's colours meet WCAG 2.1 contrast: 4.5:1 for text, 3:1 for focus outlines."""

from __future__ import annotations

import re

import pytest

from dpnode.node.console.render import HERE

CSS = (HERE / "static" / "console.css").read_text()
COLOURS = dict(re.findall(r"--([a-z-]+): (#[0-9a-f]{6})", CSS))


def _luminance(colour: str) -> float:
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(int(colour[i : i + 2], 16) / 255) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG 2.1's contrast ratio of two colours, from 1 to 21."""
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


TEXT = [  # (foreground, background) of every kind of text on the pages
    ("ink", "bg"),
    ("ink", "panel"),
    ("ink", "tag"),
    ("muted", "bg"),
    ("muted", "panel"),
    ("link", "bg"),
    ("link", "panel"),
    ("danger", "bg"),
    ("ok", "bg"),
    ("on-dark", "header"),
    ("on-dark", "accent"),
    ("on-dark", "danger"),
    ("header", "on-dark"),
]
FOCUS = [("focus", "bg"), ("focus", "panel"), ("focus-on-dark", "header")]


def test_the_known_pairs_are_checked() -> None:
    assert {name for pair in TEXT + FOCUS for name in pair} <= set(COLOURS)
    assert contrast("#000000", "#ffffff") == pytest.approx(21.0)


@pytest.mark.parametrize(("fg", "bg"), TEXT)
def test_text_has_a_contrast_of_at_least_4_5(fg: str, bg: str) -> None:
    assert contrast(COLOURS[fg], COLOURS[bg]) >= 4.5


@pytest.mark.parametrize(("fg", "bg"), FOCUS)
def test_focus_outlines_have_a_contrast_of_at_least_3(fg: str, bg: str) -> None:
    assert contrast(COLOURS[fg], COLOURS[bg]) >= 3.0
