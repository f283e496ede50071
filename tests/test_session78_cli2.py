"""An option and a ``--set`` that give one config key two values are refused (the ``--set`` won
without a word), and the ladder plot marks a rung that judged an effect without a value (it
was drawn blank, like a rung not run)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from cliproc import QUICK_TRAIN

from senslab.cli import _check_args, _config, main, parser
from senslab.experiments.ladder import ladder_figure, plot_ladder

#: a command line with an option and a ``--set`` of its key at another value, and the error
CONFLICTS = [
    (["train", "--seed", "3", "--set", "seed=4"], "--seed 3 and --set seed=4 give seed"),
    (["train", "--data", "mnist", "--data-root", "/tmp/a", "--set", "data.root = /tmp/b"],
     "--data-root /tmp/a and --set data.root=/tmp/b give data.root"),
    (["train", "--model", "mlp", "--set", "model.name=cnn"],
     "--model mlp and --set model.name=cnn give model.name"),
    (["train", "--data", "digits", "--set", "data.name=mnist"],
     "--data digits and --set data.name=mnist give data.name"),
    (["train", "--name", "a", "--set", "name=b"], "--name a and --set name=b give name"),
    (["measure", "--seed", "3", "--set", "seed=4"], "--seed 3 and --set seed=4 give seed"),
    (["measure", "--checkpoint", "run", "--data-root", "/tmp/a", "--set", "data.root=/tmp/b"],
     "--data-root /tmp/a and --set data.root=/tmp/b give data.root"),
    (["measure", "--hf", "some/model", "--data", "sst2", "--set", "data.name=mrpc"],
     "--data sst2 and --set data.name=mrpc give data.name"),
]


@pytest.mark.parametrize(("argv", "said"), CONFLICTS, ids=[
    "train-seed", "train-data-root", "train-model", "train-data", "train-name", "measure-seed",
    "measure-checkpoint-data-root", "measure-hf-data"])
def test_an_option_and_a_set_of_its_key_at_another_value_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], said: str) -> None:
    """``train --seed 3 --set seed=4`` trained seed 4 (``--data-root A --set data.root=B`` read
    B, ``--model mlp --set model.name=cnn`` trained a cnn), the option ignored without a word.
    Refused before anything is written, naming both and asking for one."""
    monkeypatch.chdir(tmp_path)
    assert main([*argv, *(QUICK_TRAIN if argv[0] == "train" else ("--threads", "1"))]) == 2
    err = capsys.readouterr().err
    assert f"senslab: error: {said} two values; pass one of them" in err, err
    assert list(tmp_path.iterdir()) == []


def test_an_option_and_a_set_of_the_same_value_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same value twice says one thing and passes (a data root as ``~/d`` and as the path it
    expands to); left out, the seed is 0 and ``--set seed`` alone still names the run after its
    seed; ``--seed 0``, the default, is told given and refused against another ``--set seed``."""
    for argv in (["train", "--seed", "3", "--set", "seed = 3"],
                 ["train", "--data-root", "~/d", "--set", "data.root=~/d/"]):
        args = parser().parse_args(argv)
        _check_args(args)
        cfg = _config(args)
        assert (cfg.seed, cfg.data.root) == ((3, None) if "--seed" in argv else (0, "~/d/"))
    for argv, seed, name in ((["train"], 0, "mlp-digits-s0"),
                             (["train", "--set", "seed=4"], 4, "mlp-digits-s4")):
        cfg = _config(parser().parse_args(argv))
        assert (cfg.seed, cfg.name) == (seed, name)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--seed", "0", "--set", "seed=4", *QUICK_TRAIN, "--out", "x"]) == 2
    assert "--seed 0 and --set seed=4 give seed two values" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def summary(effects: dict[str, list[float | None]]) -> dict[str, Any]:
    """A ladder summary of three rungs (the last not run) with the parts' ``effects`` at the
    first two, as :func:`summarize_ladder` writes it (JSON null: no value)."""
    rows: list[dict[str, Any]] = []
    for i, rung in enumerate(("cpu", "longer")):
        rows.append({"rung": rung, "status": "done", "verdict": "inconclusive", "effects": {
            part: {"effect": values[i], "se": 0.01, "verdict": "inconclusive",
                   "interval": None if values[i] is None else [values[i] - 0.05,
                                                               values[i] + 0.05]}
            for part, values in effects.items()}})
    rows.append({"rung": "paper", "status": "not run"})
    return {"name": "exp", "rungs": rows, "effects": dict.fromkeys(effects, {})}


def test_a_rung_judged_without_a_value_is_marked_on_the_plot(tmp_path: Path) -> None:
    """A rung that judged a part without a value had no point and no word on ladder.png, as if
    not run: it is marked "no value" at its own x (the part's offset), and a rung with values
    draws no such mark."""
    fig = ladder_figure(summary({"p": [0.1, None]}))
    ax = fig.axes[0]
    marks = [t for t in ax.texts if "no value" in t.get_text()]
    assert [t.get_text() for t in marks] == ["no value"]
    assert marks[0].get_position()[0] == pytest.approx(1.0)  # rung "longer"
    # several parts: each mark names its part, at that part's offset beside the rung
    ax = ladder_figure(summary({"p": [0.1, None], "q": [math.nan, 0.2]})).axes[0]
    marks = sorted((t.get_position()[0], t.get_text()) for t in ax.texts)
    assert marks == [(pytest.approx(0.125), "q: no value"), (pytest.approx(0.875), "p: no value")]
    assert len(ladder_figure(summary({"p": [0.1, 0.2]})).axes[0].texts) == 0
    assert plot_ladder(summary({"p": [0.1, None]}), tmp_path / "l.png").stat().st_size > 0
