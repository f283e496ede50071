"""The integration tests run docs/integrations.md's code blocks literally: ``snippet(heading, i)``
is the i-th ``python`` block of the section under that ``##`` heading."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def section(heading: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.M)
    for part in parts[1:]:
        title, _, body = part.partition("\n")
        if title.strip() == heading:
            return body
    raise AssertionError(f"docs/integrations.md has no section '## {heading}'")


@pytest.fixture
def snippet() -> Callable[[str, int], str]:
    def get(heading: str, i: int = 0) -> str:
        blocks = BLOCK.findall(section(heading))
        assert len(blocks) > i, f"section {heading!r} has {len(blocks)} python blocks"
        code = blocks[i]
        lines = [ln for ln in code.splitlines() if ln.strip()]
        assert 3 <= len(lines) <= 7, f"{heading!r} block {i}: {len(lines)} lines (keep it short)"
        return code

    return get
