"""The documents hold no control characters: a formula's ``\\v`` of ``\\varepsilon`` once
became a vertical tab (a Python string's escape), and the rendered page read "arepsilon"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md")])


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_no_control_characters(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    bad = [(text.count("\n", 0, m.start()) + 1, repr(m.group()))
           for m in re.finditer(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", text)]
    assert not bad, f"{path.name}: control characters at (line, char) {bad[:5]}"
