"""The example in docs/privacy.md runs and says what it claims."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "privacy.md"


def test_mechanisms_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "docs/privacy.md lost its example"
    namespace: dict[str, object] = {}
    for block in blocks:
        lines = block.splitlines()
        # The example's last line is an expression with its result in a comment: check it.
        *body, last = lines
        exec("\n".join(body), namespace)  # the repository's own documentation
        expression, _, expected = last.partition("#")
        assert repr(eval(expression, namespace)) == expected.split(":")[1].strip()
