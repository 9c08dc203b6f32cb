"""Every setting is in the README's configuration table, under its environment variable."""

from __future__ import annotations

from pathlib import Path

from dpnode.node.settings import Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_has_a_row_in_the_readme() -> None:
    table = README.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    missing = [
        f"DPNODE_{name.upper()}"
        for name in Settings.model_fields
        if f"`DPNODE_{name.upper()}`" not in table
    ]
    assert missing == [], f"settings missing from the README's configuration table: {missing}"
