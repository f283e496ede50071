"""What an experiment directory and a ladder summary may be trusted with: a verdict kept only
beside the runs it judged, a rung read only when its runs are that rung's, and a trend that says
what its two rungs do not hold equal."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from senslab.experiments import get_experiment, run_experiment
from senslab.experiments.base import SUPERSEDED, Rung
from senslab.experiments.ladder import run_ladder, summarize_ladder

EXP = "ib_joint"  # three optimisers on a one-layer attention model: about a second at 5 steps
#: a ladder whose rung "longer" changes the number of steps; rung "cpu" is the CPU scale as is
LADDER = (Rung("cpu", "cpu", (), size=1, note="the CPU scale"),
          Rung("longer", "cpu", ("steps=8",), size=2, note="8 steps"))


def quiet(_: str) -> None:
    pass


class Stop(KeyboardInterrupt):
    """A Ctrl-C between two runs, raised from the log line that announces the next run."""


def stop_at(prefix: str) -> Any:
    def log(msg: str) -> None:
        if msg.startswith(prefix):
            raise Stop(msg)
    return log


@pytest.fixture
def default_seeds(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``set(n)``: the experiment's CPU-scale default number of seeds becomes ``n``, as when a
    newer senslab changes that default (the same command line then trains other runs)."""
    cls = type(get_experiment(EXP))
    scales = dict(cls.scales)

    def set_seeds(n: int) -> None:
        monkeypatch.setattr(cls, "scales", {**scales, "cpu": dataclasses.replace(
            scales["cpu"], seeds=n)})
    return set_seeds


def test_a_verdict_of_other_runs_is_not_kept_when_the_same_settings_stop_early(
        tmp_path: Path, default_seeds: Any) -> None:
    """The same scale and overrides, but the experiment now gives other runs (its default seeds
    went from 1 to 2): the one-seed verdict stayed as verdict.json beside an experiment.json
    listing 8 runs, 3 of them unfinished, and read as this directory's verdict."""
    out = tmp_path / "exp"
    default_seeds(1)
    first = run_experiment(EXP, out, overrides=["steps=5"], log=quiet)
    assert first["seeds"] == 1
    old_listing = (out / "experiment.json").read_bytes()
    assert len(json.loads(old_listing)["runs"]) == 4

    default_seeds(2)
    # stopped before any new run wrote a thing: the directory is put back as it was
    with pytest.raises(Stop):
        run_experiment(EXP, out, overrides=["steps=5"], log=stop_at("[5/8]"))
    assert (out / "experiment.json").read_bytes() == old_listing
    assert json.loads((out / "verdict.json").read_text()) == first
    assert not (out / SUPERSEDED).exists()

    # stopped after the first new run trained: no verdict claims to describe these 8 runs
    with pytest.raises(Stop):
        run_experiment(EXP, out, overrides=["steps=5"], log=stop_at("[6/8]"))
    listed = json.loads((out / "experiment.json").read_text())["runs"]
    assert len(listed) == 8 and not all((out / r / "summary.json").is_file() for r in listed)
    assert not (out / "verdict.json").exists()
    assert json.loads((out / SUPERSEDED).read_text()) == first  # kept, set aside


def test_a_rung_run_with_another_rungs_factor_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU-scale directory run with ``--set steps=8`` copied in as rung "cpu" was read as
    that rung although it trained rung "longer"'s 8 steps (the trend between the two then
    compared runs trained alike)."""
    monkeypatch.setattr(type(get_experiment(EXP)), "ladder", LADDER)
    run_experiment(EXP, tmp_path / "cpu", overrides=["steps=8", "seeds=1"], log=quiet)
    row = summarize_ladder(EXP, tmp_path)["rungs"][0]
    assert row["rung"] == "cpu" and row["status"] != "done"
    assert "steps=8 (set by rung(s) longer)" in row["status"]
    assert "not rung cpu's: left out" in row["status"]


def test_the_ladder_refuses_a_key_that_only_an_unchosen_rung_sets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--rungs cpu --set steps=8`` trained rung cpu with rung longer's factor and recorded it
    as rung cpu."""
    monkeypatch.setattr(type(get_experiment(EXP)), "ladder", LADDER)
    with pytest.raises(ValueError, match=r"--set steps=8: the ladder's rungs set steps "
                                         r"themselves \(rung\(s\) longer\)"):
        run_ladder(EXP, tmp_path / "ladder", rungs=["cpu"], extra=["seeds=1", "steps=8"],
                   log=quiet)
    assert not (tmp_path / "ladder").exists()  # refused before anything trained


def part(effect: float, se: float | None, df: float | None, seeds: int, method: str,
         unit: str = "seed") -> dict[str, Any]:
    return {"effect": effect, "se": se, "df": df, "seeds": seeds, "method": method,
            "unit": unit, "verdict": "inconclusive", "interval": [None, None]}


def rung_dir(out: Path, rung: Rung, effects: dict[str, Any], extra: tuple[str, ...] = (),
             seeds: int = 3, name: str = EXP) -> None:
    """A finished rung directory as another machine would leave it: experiment.json naming the
    experiment, verdict.json with the rung's settings and ``effects``."""
    d = out / rung.name
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps({"name": name, "scale": rung.scale,
                                                   "runs": []}))
    (d / "verdict.json").write_text(json.dumps({
        "verdict": "inconclusive", "reason": "r", "effects": effects, "scale": rung.scale,
        "overrides": [*rung.overrides, *extra], "seeds": seeds}))


def test_a_damaged_or_foreign_rung_verdict_is_left_out_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(get_experiment(EXP)), "ladder", LADDER)
    rung_dir(tmp_path, LADDER[1], {"p": part(0.1, 0.01, 2, 3, "mean over 3 seeds (t)")})
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "experiment.json").write_text(json.dumps({"name": EXP}))
    (tmp_path / "cpu" / "verdict.json").write_text('{"verdict": "supp')  # a torn copy
    lad = summarize_ladder(EXP, tmp_path)  # was a bare JSONDecodeError naming no file
    cpu = lad["rungs"][0]["status"]
    assert "cpu/verdict.json cannot be read (JSONDecodeError" in cpu and "left out" in cpu
    assert lad["rungs"][1]["status"] == "done"

    # another experiment's directory of the same scale and overrides is not this rung
    foreign = tmp_path / "foreign"
    rung_dir(foreign, LADDER[0], {"p": part(0.5, 0.01, 2, 3, "mean over 3 seeds (t)")},
             name="mnist_binary")
    row = summarize_ladder(EXP, foreign)["rungs"][0]
    assert row["status"].endswith("holds the runs of experiment 'mnist_binary', not "
                                  "'ib_joint': left out (its verdict is another claim's)")


def three_seeds(effect: float) -> dict[str, Any]:
    return {"p": part(effect, 0.01, 2, 3, "mean over 3 seeds (t)")}


def test_a_trend_says_what_its_rungs_do_not_hold_equal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rungs trained in separate invocations (other extra overrides, other seeds) or on one
    seed gave a trend stated as the scale's effect, without a word."""
    monkeypatch.setattr(type(get_experiment(EXP)), "ladder", LADDER)
    # like for like: no note (0.3 − 0.1 with s.e. √2·0.01 on 2 df: an interval above zero)
    alike = tmp_path / "alike"
    rung_dir(alike, LADDER[0], three_seeds(0.1), ("seeds=3",))
    rung_dir(alike, LADDER[1], three_seeds(0.3), ("seeds=3",))
    lad = summarize_ladder(EXP, alike)
    t = lad["effects"]["p"]["trend"]
    assert t["word"] == "grows" and "note" not in t
    assert "p grows from cpu to longer (+0.2 [" in lad["summary"]

    # the top rung run with other extra overrides and more seeds
    mixed = tmp_path / "mixed"
    rung_dir(mixed, LADDER[0], three_seeds(0.1), ("seeds=3",))
    rung_dir(mixed, LADDER[1], {"p": part(0.3, 0.01, 4, 5, "mean over 5 seeds (t)")},
             ("seeds=5", "train_subset=64"), seeds=5)
    lad = summarize_ladder(EXP, mixed)
    note = lad["effects"]["p"]["trend"]["note"]
    assert ("cpu ran with extra overrides ['seeds=3'] and longer with ['seeds=5', "
            "'train_subset=64'], so the change is not the rungs' alone") in note
    assert "cpu has 3 seed(s) and longer 5" in note
    assert note in lad["summary"]  # REPRODUCTION.md shows the sentence

    # one seed at the bottom rung: its interval is measurement noise only
    single = tmp_path / "single"
    rung_dir(single, LADDER[0], {"p": part(0.1, 0.01, None, 1, "measurement (one seed)")},
             seeds=1)
    rung_dir(single, LADDER[1], {"p": part(0.3, 0.01, None, 1, "measurement (one seed)")},
             seeds=1)
    lad = summarize_ladder(EXP, single)
    note = lad["effects"]["p"]["trend"]["note"]
    assert note == ("cpu has one seed: its part of the interval is measurement noise only, no "
                    "seed-to-seed variation; longer has one seed: its part of the interval is "
                    "measurement noise only, no seed-to-seed variation")
    assert note in lad["summary"]
