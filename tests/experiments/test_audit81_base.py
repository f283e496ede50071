"""Audit 81 of the experiments' shared shape: a record made from runs an earlier spec trained, a
setting a run-configuration override undid, a damaged verdict.json read when recording, and the
demo's train_subset ignored on the digits."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from senslab.experiments import demo, get_experiment, run_experiment
from senslab.experiments.hahn_rofin import sharpness_vs_length
from senslab.reproduction import record

TINY = ["dim=8", "steps=6", "eval_every=3", "batch=32", "eval_size=32", "n_values=[3]",
        "seeds=1", "functions=['parity']"]


def test_a_record_of_runs_an_earlier_spec_trained_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU scale's sharp_draws changed (10 → 3) after the runs trained: `senslab run`
    refused to reuse them, but `senslab reproduction` recorded their verdict as the current
    experiment's (its row, its cpu_scale_note)."""
    out = tmp_path / "len"
    run_experiment("hr_sharpness_vs_length", out, overrides=TINY, log=lambda _: None)
    assert record(out, tmp_path / "ok").is_file()  # the spec they trained under: recorded
    cpu = sharpness_vs_length.SCALES["cpu"]
    monkeypatch.setitem(sharpness_vs_length.SCALES, "cpu",
                        dataclasses.replace(cpu, sharp_draws=cpu.sharp_draws - 7))
    with pytest.raises(ValueError, match=r"verdict.json is stale: `senslab run` would not reuse "
                                         r"its run parity-n3-s0.*differs in sharp_draws"):
        record(out, tmp_path / "rec")
    assert not (tmp_path / "rec").exists()
    with pytest.raises(ValueError, match="differs in sharp_draws"):  # as run refuses them
        run_experiment("hr_sharpness_vs_length", out, overrides=TINY, log=lambda _: None)


@pytest.mark.parametrize(("name", "overrides", "field"), [
    ("cifar10", ["epochs=10", "train.epochs=3"], "train.epochs"),
    ("cifar10", ["sigma=0.3", "track.sigma=2.0"], "track.sigma"),
    ("mnist_binary", ["epochs=10", "train.epochs=3"], "train.epochs"),
])
def test_a_setting_a_run_override_undoes_is_refused(name: str, overrides: list[str],
                                                    field: str) -> None:
    """``--set epochs=10 --set train.epochs=3``: the runs trained 3 epochs while experiment.json,
    the verdict and the record said epochs=10 as well."""
    exp = get_experiment(name)
    with pytest.raises(ValueError, match=rf"--set {overrides[0]}: it sets {field} .* but --set "
                                         rf"{overrides[1]} sets it to .*Give one of the two"):
        exp.check("cpu", overrides)
    # either alone, or both agreeing, is taken
    for given in ([overrides[0]], [overrides[1]],
                  [overrides[0], overrides[1].split("=")[0] + "=" + overrides[0].split("=")[1]]):
        exp.check("cpu", given)


def test_a_setting_a_run_override_undoes_is_refused_before_anything_is_written(
        tmp_path: Path) -> None:
    out = tmp_path / "mb"
    with pytest.raises(ValueError, match=r"--set train_subset=100: it sets data.train_subset"):
        run_experiment("mnist_binary", out, overrides=["train_subset=100",
                                                       "data.train_subset=300"],
                       log=lambda _: None)
    assert not out.exists()


def _exp_dir(root: Path, verdict: str, experiment: str | None = None) -> Path:
    d = root / "joint"
    d.mkdir()
    (d / "experiment.json").write_text(experiment or json.dumps(
        {"name": "ib_joint", "scale": "cpu", "runs": []}))
    (d / "verdict.json").write_text(verdict)
    return d


@pytest.mark.parametrize(("text", "why"), [('{"verdict": "supp', "is not valid JSON"),
                                           ("[1]", "is a JSON list, not an object")])
def test_a_damaged_verdict_json_is_named_when_recording(tmp_path: Path, text: str,
                                                        why: str) -> None:
    """A verdict.json cut short failed as a JSONDecodeError naming no file (the CLI: "a JSON file
    is truncated or damaged"), a list as an AttributeError ("probably a bug")."""
    d = _exp_dir(tmp_path, text)
    with pytest.raises(ValueError, match=rf"{d / 'verdict.json'} {why}.*senslab run ib_joint "
                                         rf"--out {d}"):
        record(d, tmp_path / "rec")
    assert not (tmp_path / "rec").exists()


def test_a_damaged_experiment_json_is_named_when_recording(tmp_path: Path) -> None:
    d = _exp_dir(tmp_path, "{}", experiment='{"name": "ib_jo')
    with pytest.raises(ValueError, match=rf"{d / 'experiment.json'} is not valid JSON.*restore"):
        record(d, tmp_path / "rec")


def test_demo_on_the_digits_takes_a_smaller_train_subset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the MNIST wheel the demo trains on scikit-learn's digits, and ``--set
    train_subset=500`` was accepted, recorded and ignored (all 1,438 training images)."""
    monkeypatch.setattr(demo, "mnist_available", lambda: False)  # a machine without the wheel
    exp = get_experiment("demo")
    runs = exp.resolve("cpu", ["train_subset=500"])[1]
    assert {r.config.data.name for r in runs} == {"digits"}
    assert {r.config.data.train_subset for r in runs} == {500}
    # the CPU scale's 5,000 exceed the digits: all of them, as before
    assert {r.config.data.train_subset for r in exp.resolve("cpu")[1]} == {None}
