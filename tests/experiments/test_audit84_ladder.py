"""Audit 84, scale ladders: a rung that ran but whose verdict is left out is not said to be
"not run" (the summary sentence, and the figure's rung labels)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib
import pytest

from senslab.experiments import get_experiment
from senslab.experiments.base import Rung
from senslab.experiments.ladder import ladder_figure, summarize_ladder

matplotlib.use("Agg")

EXP = "ib_joint"
LADDER = (Rung("cpu", "cpu", (), size=1, note="the CPU scale"),
          Rung("longer", "cpu", ("steps=8",), size=2, note="8 steps"),
          Rung("more", "cpu", ("steps=16",), size=3, note="16 steps"),
          Rung("paper", "paper", size=4, cpu=False, note="the paper scale"))
PART = {"p": {"effect": 0.1, "se": 0.01, "df": 2, "seeds": 3, "verdict": "supported",
              "method": "mean over 3 seeds (t)", "interval": [0.057, 0.143]}}


def rung_dir(out: Path, rung: Rung, verdict: str | dict[str, Any] | None,
             extra: tuple[str, ...] = ()) -> None:
    """A rung directory: experiment.json of the experiment, and verdict.json (a dict: the
    rung's, made with ``extra`` overrides; a string: written as it is; None: none yet)."""
    d = out / rung.name
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps({"name": EXP, "scale": rung.scale,
                                                   "runs": []}))
    if isinstance(verdict, dict):
        verdict = json.dumps({"verdict": "supported", "reason": "r", "effects": verdict,
                              "scale": rung.scale, "overrides": [*rung.overrides, *extra],
                              "seeds": 3})
    if verdict is not None:
        (d / "verdict.json").write_text(verdict)


@pytest.fixture
def ladder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(get_experiment(EXP)), "ladder", LADDER)


def test_a_rung_left_out_is_not_said_to_be_not_run(tmp_path: Path, ladder: None) -> None:
    """A rung whose verdict.json is torn, or made with an extra override of a key the rungs
    set, ran (its runs sit in its directory) but read "Not run: longer, more" in the summary
    (REPRODUCTION.md, the command's last line) and "(not run)" under the figure."""
    rung_dir(tmp_path, LADDER[0], PART)
    rung_dir(tmp_path, LADDER[1], '{"verdict": "supp')  # a torn copy
    rung_dir(tmp_path, LADDER[2], PART, extra=("steps=4",))
    lad = summarize_ladder(EXP, tmp_path)
    assert [r["status"] == "done" for r in lad["rungs"]] == [True, False, False, False]
    text = lad["summary"]
    assert text.startswith("supported at cpu")
    assert ("Left out (run, but its verdict cannot be used; its status says why): longer, "
            "more") in text
    assert text.endswith("Not run: paper")
    labels = [t.get_text() for t in ladder_figure(lad).axes[0].get_xticklabels()]
    assert [lab.rsplit("\n", 1)[1] for lab in labels] == [
        "(supported)", "(left out)", "(left out)", "(not run)"]


def test_a_ladder_with_no_usable_rung_says_which_ran(tmp_path: Path, ladder: None) -> None:
    """With no rung done, the sentence was "no rung has run yet" even where rungs had been
    started or had run with a verdict left out."""
    rung_dir(tmp_path, LADDER[0], None)  # started: experiment.json, no verdict yet
    rung_dir(tmp_path, LADDER[1], "[]")  # a JSON list: no verdict
    text = summarize_ladder(EXP, tmp_path)["summary"]
    assert text == ("no rung has a verdict yet. Not finished: cpu. Left out (run, but its "
                    "verdict cannot be used; its status says why): longer. Not run: more, "
                    "paper")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert summarize_ladder(EXP, empty)["summary"] == "no rung has run yet"
