"""``senslab measure --set seed=N`` without ``--seed`` seeds the examples and the noise as well
as the untrained weights, as ``--seed N`` does: it seeded the weights only, and the line said
"untrained (seed 4)" over a measurement whose examples and noise were seed 0's."""

from __future__ import annotations

import pytest

from senslab.cli import main

MEASURE = ["measure", "--model", "mlp", "--data", "digits", "--num-examples", "16", "--sigma",
           "1", "--repeats", "2", "--precision", "float32"]


def _row(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    return out[-1]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_set_seed_alone_seeds_what_seed_does(capsys: pytest.CaptureFixture[str]) -> None:
    given = _row(capsys, MEASURE + ["--seed", "4"])
    assert _row(capsys, MEASURE + ["--set", "seed=4"]) == given
    # and the seed matters: seed 0's row differs (the check above could not pass by accident)
    assert _row(capsys, MEASURE) != given


@pytest.mark.parametrize(("argv", "said"), [
    (["train", "--model", "vit", "--data", "digits"], "unknown model 'vit'. Did you mean"),
    (["measure", "--model", "mlp", "--data", "digitz"], "unknown dataset 'digitz'. Did you mean"),
])
def test_an_unknown_name_is_refused_before_anything_is_said_or_written(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], said: str) -> None:
    """`senslab train --model vit` said "training vit on digits ... into runs/..." and then
    refused the name: the one line of a refusal is the refusal, and nothing is written."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "training" not in err
    assert list(tmp_path.iterdir()) == []
