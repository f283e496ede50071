"""The ladder summary and the ``senslab`` command say what they left out or overrode: a rung that
judged a part without a value, a trend without an interval, the extra overrides a finished rung
was trained with (in the command that reproduces it), and a ``--set`` key given two values."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from cliproc import QUICK_TRAIN

from senslab.cli import main, parser
from senslab.experiments import get_experiment
from senslab.experiments.base import Rung
from senslab.experiments.ladder import summarize_ladder

EXP = "ib_vit_mnist"  # rungs: cpu (4 epochs), longer (epochs=20), paper (GPU)


def part(value: float | None, se: float | None = 0.01) -> dict[str, Any]:
    """One part of a verdict as verdict.json holds it (JSON null: NaN)."""
    return {"p": {"effect": value, "se": se, "df": 2, "seeds": 3, "unit": "seed",
                  "method": "mean over 3 seeds (t)", "verdict": "inconclusive",
                  "interval": [None, None] if value is None else [value - 0.05, value + 0.05]}}


def rung_dir(out: Path, rung: str, effects: dict[str, Any], extra: tuple[str, ...] = ()) -> None:
    """A finished rung directory of ``EXP`` as another machine would leave it."""
    r = next(r for r in get_experiment(EXP).ladder if r.name == rung)
    d = out / rung
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps({"name": EXP, "scale": r.scale, "runs": []}))
    (d / "verdict.json").write_text(json.dumps({
        "verdict": "inconclusive", "reason": "r", "effects": effects, "scale": r.scale,
        "overrides": [*r.overrides, *extra], "seeds": 3}))


def test_a_rung_that_judged_a_part_without_a_value_is_listed(tmp_path: Path) -> None:
    """The top rung judged part p without a value (NaN): it was dropped from the part's ``at``
    and the sentence read "p grows from cpu to longer" as the whole ladder's, no word of it."""
    rung_dir(tmp_path, "cpu", part(0.1))
    rung_dir(tmp_path, "longer", part(0.3))
    rung_dir(tmp_path, "paper", part(None, None))
    lad = summarize_ladder(EXP, tmp_path)
    p = lad["effects"]["p"]
    assert p["at"] == {"cpu": "inconclusive", "longer": "inconclusive", "paper": "inconclusive"}
    assert p["no_estimate"] == ["paper"]
    assert (p["trend"]["from"], p["trend"]["to"]) == ("cpu", "longer")  # the ends with a value
    assert p["trend"]["change"] == pytest.approx(0.2)
    assert "No value (not estimable): p at paper" in lad["summary"]
    assert json.loads((tmp_path / "ladder.json").read_text())["effects"]["p"]["no_estimate"] \
        == ["paper"]


def test_a_trend_without_an_interval_is_said_with_why(tmp_path: Path) -> None:
    """A rung's effect without a standard error gave a trend without an interval, and the
    summary sentence left the part out, as if the ladder had not measured it."""
    rung_dir(tmp_path, "cpu", part(0.1))
    rung_dir(tmp_path, "longer", part(0.3, None))
    lad = summarize_ladder(EXP, tmp_path)
    t = lad["effects"]["p"]["trend"]
    assert t["interval"] is None and "no standard error" in t["note"]
    assert "p from cpu to longer: +0.2, no interval (a rung's effect has no standard error" \
        in lad["summary"], lad["summary"]


def test_a_finished_rungs_command_carries_its_extra_overrides(tmp_path: Path) -> None:
    """ladder.json's command for a rung trained with ``--set seeds=2 --set data.root=…`` left
    them out: copied, it trained other runs (3 seeds) than the rung's."""
    extra = ("seeds=2", "data.root=/data/my mnist")
    rung_dir(tmp_path, "longer", part(0.3), extra)
    lad = summarize_ladder(EXP, tmp_path)
    longer, paper = lad["rungs"][1], lad["rungs"][2]
    assert longer["rung"] == "longer" and longer["extra_overrides"] == list(extra)
    assert longer["command"] == (f"senslab run {EXP} --scale cpu --set epochs=20 --set seeds=2 "
                                 f"--set 'data.root=/data/my mnist' --out {tmp_path / 'longer'}")
    # read back as the shell and the command's parser read it: the rung's scale and overrides
    args = parser().parse_args(shlex.split(longer["command"])[1:])
    verdict = json.loads((tmp_path / "longer" / "verdict.json").read_text())
    assert (args.scale, args.set, args.out) == (verdict["scale"], verdict["overrides"],
                                                str(tmp_path / "longer"))
    # a rung not run has no runs to reproduce: its own settings only
    assert paper["command"] == f"senslab run {EXP} --scale paper --out {tmp_path / 'paper'}"
    assert Rung("r", "cpu", ("steps=4",)).command("demo", "o", ["seeds=1"]) == \
        "senslab run demo --scale cpu --set steps=4 --set seeds=1 --out o"


#: a command, a key it takes, and two values given to that key below
SET_TWICE = [
    (["train", *QUICK_TRAIN, "--out", "run"], "optim.lr", "0.1", "0.01"),
    (["measure", "--num-examples", "4", "--threads", "1"], "model.overrides.seed", "1", "2"),
]


@pytest.mark.parametrize(("command", "key", "first", "then"), SET_TWICE,
                         ids=[c[0] for c, *_ in SET_TWICE])
def test_a_set_key_given_two_values_is_warned_of(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        command: list[str], key: str, first: str, then: str) -> None:
    """``--set optim.lr=0.1 --set optim.lr=0.01`` trained (or measured) with the last value
    without a word. The last one is still used: the command's own errors say "add --set
    model.overrides.dim=40" to correct an earlier ``dim=32`` (tests/test_cli.py). The same
    value twice (seed) says one thing: no warning."""
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning) as said:
        assert main([*command, "--set", f"{key}={first}", "--set", "seed=0", "--set",
                     f" {key} = {then}", "--set", "seed = 0"]) == 0
    twice = [str(w.message) for w in said if "given twice" in str(w.message)]
    assert twice == [f"--set {key} is given twice, as {key}={first} and then {key}={then}: the "
                     f"last is used ({key}={then}); drop the other --set if that is not what "
                     "you meant"], [str(w.message) for w in said]
    if command[0] == "train":
        assert json.loads((tmp_path / "run" / "config.json").read_text())["optim"]["lr"] == 0.01
    capsys.readouterr()
