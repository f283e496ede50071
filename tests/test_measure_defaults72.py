"""``senslab measure --checkpoint RUN`` takes the seed, example count, sigma and draws it is not
given from the run (its seed and ``track.*``), and says so on stderr.

With measure's own defaults (seed 0, 512 examples, sigma 0.1, one draw) a plain ``measure
--checkpoint RUN`` drew other examples and other noise than the run's tracker, and printed
another number than the run's logged ``sens/train`` for the same weights, without a word."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from runrecords import tracked_record

from senslab.cli import MEASURE_DEFAULTS, main
from senslab.measure._stats import fixed

SEED = 3
#: a tiny binary run tracked with settings that all differ from measure's own defaults
TRACK = {"track.sigma": "1.0", "track.repeats": "4", "track.num_examples": "32",
         "track.val": "true"}


def _train(out: Path, **track: str) -> Path:
    settings = [arg for key, value in {**TRACK, **track}.items()
                for arg in ("--set", f"{key}={value}")]
    assert main(["train", "--model", "mlp", "--data", "digits", "--seed", str(SEED),
                 "--threads", "1", "--out", str(out), "--set", "data.options.digits=[3, 8]",
                 "--set", "train.epochs=2", "--set", "device=cpu", *settings]) == 0
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("defaults") / "run")


def _measure(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[list[str], str]:
    """The command's printed sensitivities (one per sigma) and its stderr."""
    capsys.readouterr()
    assert main(["measure", "--threads", "1", *argv]) == 0
    captured = capsys.readouterr()
    rows = [line.split() for line in captured.out.splitlines() if re.match(r"\s+\d", line)]
    assert rows, captured.out
    return [row[1] for row in rows], captured.err


def test_plain_measure_checkpoint_prints_the_runs_logged_sensitivity(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = tracked_record(run)
    for split, key in (("train", "sens/train"), ("test", "sens/val")):
        assert record[key] > 0  # some copies flipped: another draw could give another number
        (estimate,), err = _measure(capsys, "--checkpoint", str(run), "--split", split)
        assert estimate == fixed(record[key]), (split, err)
        assert ("seed 3, 32 examples, sigma 1, 4 draws per token: the run's track settings "
                "(config.json seed, track.num_examples, track.sigma, track.repeats)") in err, err
        assert f"the examples and noise of the run's logged {key}" in err, err
        assert "sigma 1; 4 noise draw(s) per token" in err, err
    # not vacuous: measure's own defaults, given, measure another number on the same weights
    assert MEASURE_DEFAULTS == {"seed": 0, "num_examples": 512, "sigma": [0.1], "repeats": 1}
    (estimate,), err = _measure(capsys, "--checkpoint", str(run), "--seed", "0",
                                "--num-examples", "512", "--sigma", "0.1", "--repeats", "1")
    assert estimate != fixed(record["sens/train"]), err
    assert "the run's track settings" not in err
    assert ("given unlike the run's tracker: --seed 0 (the run's: seed 3), --num-examples 512 "
            "(the run's: 32 examples), --sigma 0.1 (the run's: sigma 1), --repeats 1 (the "
            "run's: 4 draws per token), so these are not the run's logged sens/train") in err, err


def test_an_option_given_wins_over_the_runs_and_is_said(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = tracked_record(run)
    (estimate,), err = _measure(capsys, "--checkpoint", str(run), "--seed", "5")
    assert "32 examples, sigma 1, 4 draws per token: the run's track settings" in err, err
    assert "--seed 5 (the run's: seed 3), so these are not the run's logged sens/train" in err
    # the seed given is the one measured with: all four given alike print the same number
    (same,), _ = _measure(capsys, "--checkpoint", str(run), "--seed", "5", "--num-examples",
                          "32", "--sigma", "1", "--repeats", "4")
    assert estimate == same != fixed(record["sens/train"])
    # a value given equal to the run's is the run's measurement, and said to be
    (_, estimate), err = _measure(capsys, "--checkpoint", str(run), "--sigma", "0.5", "1")
    assert estimate == fixed(record["sens/train"])  # the second row, sigma 1's
    assert "(the row at sigma 1)" in err and "not the run's" not in err, err


def test_without_checkpoint_the_defaults_are_measures_own(
        capsys: pytest.CaptureFixture[str]) -> None:
    data = ["--model", "mlp", "--data", "digits", "--set", "data.options.digits=[3, 8]",
            "--set", "device=cpu"]
    plain, err = _measure(capsys, *data)
    given, _ = _measure(capsys, *data, "--seed", "0", "--num-examples", "512", "--sigma", "0.1",
                        "--repeats", "1")
    assert plain == given
    assert "untrained (seed 0)" in err and "sigma 0.1; 1 noise draw(s) per token" in err, err
    assert "the run's" not in err


def test_a_run_that_tracked_no_sensitivity_gets_measures_sigma_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _train(tmp_path / "run", **{"track.sigma": "0", "track.val": "false"})
    assert "sens/train" not in tracked_record(run)
    _, err = _measure(capsys, "--checkpoint", str(run))
    assert ("seed 3, 32 examples, 4 draws per token: the run's track settings (config.json "
            "seed, track.num_examples, track.repeats)") in err, err
    assert (f"sigma {MEASURE_DEFAULTS['sigma'][0]:g} is measure's default: the run tracked no "
            "sensitivity (track.sigma=0)") in err, err


def test_split_test_of_a_run_without_val_says_it_tracked_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _train(tmp_path / "run", **{"track.val": "false"})
    assert "sens/val" not in tracked_record(run)
    _, err = _measure(capsys, "--checkpoint", str(run), "--split", "test")
    assert "had it tracked one (it tracked none: track.val=false)" in err, err


@pytest.mark.parametrize("option", ["--num-examples", "--repeats"])
def test_a_bad_count_given_is_still_refused(option: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["measure", option, "0"]) == 2
    assert f"{option} must be ≥ 1, got 0" in capsys.readouterr().err


def test_measure_help_names_the_runs_settings(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["measure", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for setting in ("the run's seed", "the run's track.sigma", "the run's track.repeats",
                    "the run's track.num_examples"):
        assert setting in text
