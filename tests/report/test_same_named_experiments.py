"""Two experiment directories of one name in one report had identical headings; the heading now
names the directory where the name repeats (and only there)."""

from __future__ import annotations

from pathlib import Path

from senslab.report.html import render_html
from senslab.report.runs import Experiment


def _exp(path: Path, word: str) -> Experiment:
    return Experiment(path=path, info={"name": "fashion_mnist", "claim": "c"},
                      verdict={"verdict": word, "reason": "r"})


def test_headings_of_same_named_experiments_name_their_directories(tmp_path: Path) -> None:
    a, b = tmp_path / "dirA" / "fashion_mnist", tmp_path / "dirB" / "fashion_mnist"
    page = render_html("t", [_exp(a, "supported"), _exp(b, "contradicted")], [], [])
    assert f"<h2>Experiment: fashion_mnist <small>({a})</small></h2>" in page
    assert f"<h2>Experiment: fashion_mnist <small>({b})</small></h2>" in page
    alone = render_html("t", [_exp(a, "supported")], [], [])
    assert "<h2>Experiment: fashion_mnist</h2>" in alone
