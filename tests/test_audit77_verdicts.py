"""Audit 77 (verdicts): scale ladders that compared rungs trained alike, read a summary it could
not, or read a change as certain (src/senslab/experiments/ladder.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from senslab.experiments import get_experiment
from senslab.experiments.ladder import (
    GROWS,
    _refuse_rung_keys,
    run_ladder,
    summarize_ladder,
    trend,
)

EXP = "ib_vit_mnist"  # rungs: cpu (4 epochs), longer (epochs=20), paper (GPU)


def quiet(_: str) -> None:
    pass


def NO_DATA(tmp: Path) -> str:  # noqa: N802
    """A data root without MNIST: had the ladder let the runs through, they stop at once."""
    return f"data.root={tmp / 'no-mnist'}"


def rung_dir(out: Path, rung: str, scale: str, overrides: list[str], verdict: dict[str, Any],
             name: str = EXP) -> None:
    d = out / rung
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps({"name": name, "scale": scale, "runs": []}))
    (d / "verdict.json").write_text(json.dumps({**verdict, "scale": scale,
                                                "overrides": overrides, "seeds": 3}))


def effects(value: float) -> dict[str, Any]:
    return {"p": {"effect": value, "se": 0.01, "df": 2, "seeds": 3, "unit": "seed",
                  "method": "mean over 3 seeds (t)", "verdict": "supported",
                  "interval": [value - 0.05, value + 0.05]}}


def test_a_rungs_factor_under_another_key_is_refused_before_training(tmp_path: Path) -> None:
    """`--scale ladder --rungs cpu,longer --set train.epochs=20` trained both rungs 20 epochs
    (rung longer's factor, `epochs=20`, reached through the run field it sets): the key test
    let it through, both rungs carried the same extra override, and the ladder read the two
    alike-trained rungs as "cpu" and "longer" without a word."""
    with pytest.raises(ValueError, match=r"--set train\.epochs=20: it changes in the runs what "
                                         r"the ladder's rungs set themselves under another key "
                                         r"\(rung\(s\) longer: epochs=20\)"):
        run_ladder(EXP, tmp_path / "ladder", rungs=["cpu", "longer"],
                   extra=[NO_DATA(tmp_path), "train.epochs=20"], log=quiet)
    # rung cpu alone, trained with rung longer's 20 epochs, would be recorded as rung cpu
    with pytest.raises(ValueError, match="rung\\(s\\) longer: epochs=20"):
        run_ladder(EXP, tmp_path / "ladder", rungs=["cpu"],
                   extra=[NO_DATA(tmp_path), "train.epochs=20"], log=quiet)
    assert not (tmp_path / "ladder").exists()  # refused before anything was written
    exp = get_experiment(EXP)
    # an override that changes no rung's factor still passes
    _refuse_rung_keys(exp.ladder[:2], ["seeds=1", "data.root=/tmp/mnist", "device=cpu"],
                      exp.ladder, exp)


def test_a_rung_directory_trained_with_another_rungs_factor_under_another_key_is_left_out(
        tmp_path: Path) -> None:
    rung_dir(tmp_path, "cpu", "cpu", ["train.epochs=20"], {"verdict": "supported",
                                                            "effects": effects(0.1)})
    rung_dir(tmp_path, "longer", "cpu", ["epochs=20"], {"verdict": "supported",
                                                         "effects": effects(0.3)})
    row = summarize_ladder(EXP, tmp_path)["rungs"][0]
    assert row["rung"] == "cpu" and row["status"] != "done"
    assert "train.epochs=20 (set by rung(s) longer)" in row["status"]


def test_a_rung_verdict_without_a_verdict_word_is_left_out_with_the_reason(
        tmp_path: Path) -> None:
    """A verdict.json that is a JSON object without "verdict" failed the whole ladder summary
    with a bare ``KeyError: 'verdict'`` naming no file."""
    rung_dir(tmp_path, "cpu", "cpu", [], {"reason": "r", "effects": effects(0.1)})
    rung_dir(tmp_path, "longer", "cpu", ["epochs=20"], {"verdict": "supported",
                                                         "effects": effects(0.3)})
    lad = summarize_ladder(EXP, tmp_path)
    cpu = lad["rungs"][0]["status"]
    assert "cpu/verdict.json holds no verdict" in cpu and "left out" in cpu
    assert lad["rungs"][1]["status"] == "done"


def test_a_trend_between_two_zero_standard_errors_is_not_certain() -> None:
    """Two rung effects with a standard error of 0 (verdicts written before 2026-12-04 kept
    them) gave a zero-width interval: a change of 1e-7 "grows", [+1e-7, +1e-7]."""
    t = trend({"effect": 0.1, "se": 0.0, "df": 2}, {"effect": 0.1000001, "se": 0.0, "df": 2})
    assert t["word"] != GROWS and t["interval"] is None
    assert "standard error" in t["note"]
    # one rung with a standard error still gives an interval
    assert trend({"effect": 0.1, "se": 0.0, "df": 2},
                 {"effect": 0.2, "se": 0.01, "df": 2})["interval"] is not None
