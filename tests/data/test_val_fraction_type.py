"""Rotten Tomatoes' val_fraction given as a string (a config's "0.1") is refused by name; it
multiplied the row counts as a string and failed with a bare TypeError."""

from __future__ import annotations

import bz2
from pathlib import Path

import pytest

from senslab.data.text import RT_FILE

from .test_text import _load


@pytest.mark.parametrize("fraction", ["0.1", True])
def test_a_val_fraction_that_is_no_number_is_named(tmp_path: Path, fraction: object) -> None:
    root = tmp_path / "rt"
    root.mkdir()
    rows = ([f"fresh,a fine film number {i}" for i in range(20)]
            + [f"rotten,a dull film number {i}" for i in range(15)])
    with bz2.open(root / RT_FILE, "wt", encoding="utf-8", newline="") as f:
        f.write("category,text\n" + "".join(r + "\n" for r in rows))
    with pytest.raises(TypeError, match=r"val_fraction must be a number in \(0, 1\), got"):
        _load("rotten_tomatoes", root, split="train", val_fraction=fraction)
    assert len(_load("rotten_tomatoes", root, split="validation", val_fraction=0.1)) == 2 + 2
