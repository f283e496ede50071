"""Scale ladders: the runner, the trend rule, ladder.json and the plot, and their records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats

from senslab.cli import main
from senslab.experiments import get_experiment, run_experiment
from senslab.experiments.base import Rung, ladder_differences
from senslab.experiments.ladder import (
    GROWS,
    NO_CLEAR_CHANGE,
    SHRINKS,
    run_ladder,
    select_rungs,
    summarize_ladder,
    trend,
)
from senslab.reproduction import load_ladders, load_records, record, render

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: a two-rung CPU ladder of ib_joint (three optimisers on a one-layer attention model) that
#: trains in seconds, and a GPU rung never run here
TINY = (
    Rung("small", "cpu", ("steps=40",), size=40, note="40 steps"),
    Rung("large", "cpu", ("steps=120",), size=120, note="120 steps"),
    Rung("paper", "paper", size=1000, cpu=False, note="the paper scale"),
)
EXP = "ib_joint"


def test_trend_is_a_welch_type_interval_with_the_smaller_df() -> None:
    low = {"effect": 0.01, "se": 0.003, "df": 2}
    high = {"effect": 0.05, "se": 0.004, "df": 4}
    t = trend(low, high)
    half = stats.t.ppf(0.975, 2) * 0.005  # √(0.003² + 0.004²) = 0.005, df = min(2, 4)
    assert t["change"] == pytest.approx(0.04) and t["se"] == pytest.approx(0.005)
    assert t["interval"] == pytest.approx([0.04 - half, 0.04 + half])
    assert t["word"] == GROWS  # 0.04 − 4.30·0.005 = 0.0185 > 0
    assert trend(high, low)["word"] == SHRINKS
    # the same change measured less precisely is no clear change (t₂ = 4.30: half-width 0.0430)
    assert trend({**low, "se": 0.006}, {**high, "se": 0.008})["word"] == NO_CLEAR_CHANGE
    # JSON null: an undecidable effect, or a normal reference distribution (df ∞)
    assert trend({**low, "se": None}, high)["interval"] is None
    z = trend({**low, "df": None}, {**high, "df": None})
    assert z["interval"][1] - 0.04 == pytest.approx(stats.norm.ppf(0.975) * 0.005)


def test_rungs_are_chosen_by_name_and_errors_list_what_exists() -> None:
    exp = get_experiment("mnist_binary")
    assert [r.name for r in select_rungs(exp)] == ["cpu", "plateau", "paper-arch"]
    assert [r.name for r in select_rungs(exp, ["paper", "cpu"])] == ["cpu", "paper"]
    with pytest.raises(ValueError, match="has no rung 'huge'; its rungs: cpu, plateau"):
        select_rungs(exp, ["huge"])
    with pytest.raises(ValueError, match="synthetic_sparse_frequent has no scale ladder; "
                                         "experiments with one: .*mnist_binary"):
        select_rungs(get_experiment("synthetic_sparse_frequent"))


def test_mnist_binary_paper_arch_rung_differs_from_the_paper_only_where_it_says() -> None:
    exp = get_experiment("mnist_binary")
    top = next(r for r in exp.ladder if r.paper_arch)
    assert set(ladder_differences(exp, top)) == {k for k, _ in top.differs}
    assert all(reason for _, reason in top.differs)
    # the model itself is the paper scale's: no model field is among the differences
    assert not any(k.startswith("model.") for k in ladder_differences(exp, top))
    assert ladder_differences(exp, exp.ladder[-1]) == {}  # the paper rung is the paper scale


@pytest.mark.heavy
def test_a_ladder_runs_its_cpu_rungs_and_records_effect_against_scale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(type(get_experiment(EXP)), "ladder", TINY)
    out = tmp_path / "ladder"
    assert main(["run", EXP, "--scale", "ladder", "--set", "seeds=2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (f"paper: needs a GPU: not run here; to run it: senslab run {EXP} --scale paper"
            in printed)
    lad = json.loads((out / "ladder.json").read_text())
    assert [r["rung"] for r in lad["rungs"]] == ["small", "large", "paper"]
    small, large, gpu = lad["rungs"]
    assert small["status"] == large["status"] == "done" and gpu["status"].startswith("needs")
    assert small["seeds"] == 2 and small["extra_overrides"] == ["seeds=2"]
    for rung in ("small", "large"):  # each rung is an ordinary experiment directory
        v = json.loads((out / rung / "verdict.json").read_text())
        assert v["overrides"] == [*next(r for r in TINY if r.name == rung).overrides, "seeds=2"]
        assert (out / rung / "report.html").is_file()
        assert small["effects"].keys() == v["effects"].keys()
    assert lad["effects"] and lad["effects"].keys() == small["effects"].keys()
    for part, e in lad["effects"].items():
        assert set(e["at"]) == {"small", "large"}
        t = e["trend"]
        assert (t["from"], t["to"]) == ("small", "large")
        assert t["change"] == pytest.approx(large["effects"][part]["effect"]
                                            - small["effects"][part]["effect"])
        assert t["word"] in (GROWS, SHRINKS, NO_CLEAR_CHANGE)
    assert lad["summary"].endswith("Not run: paper")
    assert (out / "ladder.png").read_bytes().startswith(PNG_MAGIC)

    # a rung directory run with other settings is left out, with the reason
    v = json.loads((out / "large" / "verdict.json").read_text())
    v["overrides"] = ["steps=7"]
    (out / "large" / "verdict.json").write_text(json.dumps(v))
    again = summarize_ladder(EXP, out)
    assert "not the rung's 'cpu'" in again["rungs"][1]["status"]
    assert all("trend" not in e for e in again["effects"].values())
    v["overrides"] = [*TINY[1].overrides, "seeds=2"]
    (out / "large" / "verdict.json").write_text(json.dumps(v))

    # recorded for REPRODUCTION.md: the ladder table, the trend and the plot beside the record
    rec = record(out, tmp_path / "rec")
    assert rec == tmp_path / "rec" / "ladders" / f"{EXP}.json"
    assert rec.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    ladders = load_ladders(tmp_path / "rec")
    gpu_row = ladders[EXP]["rungs"][2]
    assert gpu_row["command"] == f"senslab run {EXP} --scale paper --out runs/ladder/{EXP}/paper"
    text = render(load_records(tmp_path / "rec"), ladders)
    assert "## Scale ladders" in text and f"### `{EXP}`" in text
    assert f"![{EXP}: effect vs scale](reproduction/ladders/{EXP}.png)" in text
    rows = [line for line in text.splitlines() if line.startswith(("| small", "| large"))]
    assert len(rows) == 2 and all("| 2 |" in r for r in rows)
    assert "(its runs:" not in text  # trained in one sitting: the runs took the wall time

    # a rung trained over several sittings: its runs' summed time is shown beside the wall time
    for run in (out / "large").glob("*/summary.json"):
        summary = json.loads(run.read_text())
        summary["seconds"] = 3600.0
        run.write_text(json.dumps(summary))
    lad = summarize_ladder(EXP, out)
    runs = len(list((out / "large").glob("*/summary.json")))
    assert lad["rungs"][1]["run_seconds"] == 3600.0 * runs
    record(out, tmp_path / "rec")
    text = render(load_records(tmp_path / "rec"), load_ladders(tmp_path / "rec"))
    large_row = next(line for line in text.splitlines() if line.startswith("| large"))
    assert f"(its runs: {60.0 * runs:.1f} min)" in large_row

    # a ladder still running has no ladder.json yet: its rung directories name the experiment
    (out / "ladder.json").unlink()
    rec2 = record(out, tmp_path / "rec2")
    assert json.loads(rec2.read_text())["rungs"] == json.loads(rec.read_text())["rungs"]
    with pytest.raises(FileNotFoundError, match="no experiment.json"):
        record(tmp_path / "rec2", tmp_path / "rec3")  # neither an experiment nor a ladder

    # a rung whose runs no longer give its verdict is refused, as an experiment directory is
    # (the ladder was recorded under the verdict of runs that were gone)
    next((out / "large").glob("*/summary.json")).unlink()
    with pytest.raises(FileNotFoundError, match=r"large: 1 of the \d+ runs its experiment\.json "
                                                r"lists have no summary\.json"):
        record(out, tmp_path / "rec4")
    assert not (tmp_path / "rec4" / "ladders").exists()


def test_a_gpu_rung_runs_only_when_named_and_rungs_need_the_ladder_scale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(get_experiment(EXP)), "ladder", TINY)
    lad = run_ladder(EXP, tmp_path, rungs=["small"], extra=["seeds=1"], log=lambda _: None)
    assert [r["status"] for r in lad["rungs"]] == ["done", "not run", "needs a GPU: not run here"]
    assert not (tmp_path / "large").exists()
    # a rung that started but did not finish (interrupted) says so
    (tmp_path / "large").mkdir()
    (tmp_path / "large" / "experiment.json").write_text("{}")
    lad = summarize_ladder(EXP, tmp_path)
    assert lad["rungs"][1]["status"].startswith("started, not finished")
    assert "Not finished: large. Not run: paper" in lad["summary"]
    assert main(["run", EXP, "--rungs", "small", "--out", str(tmp_path / "x")]) == 2
    # an override a rung cannot take fails before anything trains
    with pytest.raises(Exception, match="no_such_key"):
        run_ladder(EXP, tmp_path / "y", extra=["no_such_key=1"], log=lambda _: None)
    assert not (tmp_path / "y").exists()


def test_the_cpu_rung_reuses_an_existing_cpu_scale_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rung "cpu" of a real ladder is the CPU scale unchanged: a finished CPU-scale experiment
    directory copied to OUT/cpu is that rung (nothing is retrained)."""
    ladder = (Rung("cpu", "cpu", ("steps=40",), size=1), TINY[2])
    monkeypatch.setattr(type(get_experiment(EXP)), "ladder", ladder)
    run_experiment(EXP, tmp_path / "cpu", overrides=["steps=40", "seeds=1"], log=lambda _: None)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "cpu").glob("*/summary.json")}
    lad = run_ladder(EXP, tmp_path, extra=["seeds=1"], log=lambda _: None)
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "cpu").glob("*/summary.json")}
    assert lad["rungs"][0]["status"] == "done" and before == after
    assert lad["rungs"][0]["seeds"] == 1 and lad["rungs"][0]["effects"]  # the reused verdict


def test_verdict_json_is_strict_json_when_the_evidence_holds_nan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An undefined number in a verdict's evidence (a 0/0 ratio) is written as null: Python's
    json would write the non-standard token NaN, which other JSON readers refuse."""
    cls = type(get_experiment(EXP))
    judged = cls.verdict
    monkeypatch.setattr(cls, "verdict", lambda self, s: {
        **judged(self, s), "evidence": {"ratio": math.nan, "per_run": (1.0, math.inf)}})
    run_experiment(EXP, tmp_path, overrides=["steps=40", "seeds=1"], log=lambda _: None)

    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    v = json.loads((tmp_path / "verdict.json").read_text(), parse_constant=refuse)
    assert v["evidence"] == {"ratio": None, "per_run": [1.0, None]}


def test_list_experiments_names_the_ladder_rungs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "experiments", "mnist_binary"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("[ladder: cpu → plateau → paper-arch → paper (GPU)]")
    assert main(["list", "experiments", "synthetic_sparse_frequent"]) == 0
    assert "ladder" not in capsys.readouterr().out


def test_a_rung_without_effects_shows_why_in_its_effect_column() -> None:
    from senslab.reproduction import render_ladders, short_reason

    reason = ("train accuracies differ by 0.311 (> 0.05): end-of-training sensitivity lstm 0.0114;"
              " Sub-claims — relu_below_softmax: inconclusive")
    assert short_reason(reason) == "train accuracies differ by 0.311 (> 0.05)"
    assert short_reason("after 630 steps SGD is at the plateau; train longer") == (
        "after 630 steps SGD is at the plateau")
    assert short_reason("differ by 0.031 | not in the verdict: x") == "differ by 0.031"
    assert short_reason("") == ""
    rung = {"rung": "wide", "size": 1.84e6, "note": "wider", "status": "done", "seeds": 3,
            "effects": {}, "verdict": "not comparable", "reason": reason, "runtime_s": 60.0}
    lines = render_ladders({"x": {"summary": "not comparable at wide", "rungs": [rung]}})
    row = next(line for line in lines if line.startswith("| wide"))
    assert "| 3 | — (train accuracies differ by 0.311 (> 0.05)) |" in row
    assert "**not comparable**" in row
    del rung["reason"]  # no reason recorded: the bare dash
    row = next(line for line in render_ladders({"x": {"rungs": [rung]}})
               if line.startswith("| wide"))
    assert "| 3 | — |" in row


def test_an_extra_override_of_a_key_a_rung_sets_is_refused(tmp_path) -> None:
    """`--scale ladder --rungs cpu,longer --set steps=300` trained both rungs at 300 steps while
    the ladder's record named "longer" 10,000 steps (and read "no clear change" between them)."""
    with pytest.raises(ValueError, match=r"--set steps=300: the ladder's rungs set steps "
                                         r"themselves \(rung\(s\) longer\)"):
        run_ladder("ib_joint", tmp_path / "ladder", rungs=["cpu", "longer"],
                   extra=["steps=300"], log=lambda _: None)
    assert not (tmp_path / "ladder").exists()  # refused before anything trained
    # a key no chosen rung sets is still passed on to every rung: checked, then refused by the
    # experiment itself if it is not one of its settings
    from senslab.train.config import UnknownKey

    with pytest.raises(UnknownKey, match="unknown config key 'stepz'"):
        run_ladder("ib_joint", tmp_path / "ladder", rungs=["cpu"], extra=["stepz=3"],
                   log=lambda _: None)
