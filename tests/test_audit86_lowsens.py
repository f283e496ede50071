"""Audit 86, the 'Transformers Learn Low Sensitivity Functions' experiments: settings that
measure no sensitivity, or leave the verdict nothing to compare, are refused before any run
trains (they trained every run, or the first, for a verdict of "not comparable" or a failed
final measurement)."""

from __future__ import annotations

from pathlib import Path

import pytest

from senslab.experiments import get_experiment
from senslab.experiments.base import run_experiment

#: robustness at the CPU scale's shape on 8×8 digits (always installed): tiny, one seed
DIGITS = ["dataset=digits", "patch=2", "test_images=30", "sens_examples=200", "seeds=1",
          "train.epochs=1", "data.train_subset=200", "track.num_examples=4",
          "track.eval_examples=50"]


@pytest.mark.parametrize("name", ["mnist_binary", "fashion_mnist"])
def test_vision_comparison_refuses_track_sigma_zero(name: str, tmp_path: Path) -> None:
    exp = get_experiment(name)
    # σ = 0 measures no sens/train: every run (and its σ sweep) trained, then the verdict said
    # "a run has no finite final number (σ = 0?)"
    with pytest.raises(ValueError, match=r"track\.sigma=0: .*measures none"):
        exp.resolve("cpu", ["track.sigma=0"])
    with pytest.raises(ValueError, match="track.sigma=0.1"):
        run_experiment(name, tmp_path / "out", overrides=["track.sigma=0"],
                       log=lambda _: None)
    assert not (tmp_path / "out").exists()  # refused before anything was written
    # a noise level above 0 is still the user's to choose, and reaches every run
    _, runs = exp.resolve("cpu", ["track.sigma=0.3"])
    assert runs and {r.config.track.sigma for r in runs} == {0.3}
    assert {r.config.track.sigma for r in exp.resolve("cpu")[1]} == {0.1}


@pytest.mark.parametrize("override", ["sigma=0", "track.sigma=0"])
def test_robustness_refuses_sigma_zero_before_training(override: str, tmp_path: Path) -> None:
    exp = get_experiment("robustness")
    with pytest.raises(ValueError, match=r"sigma=0: robustness compares the final models"):
        exp.resolve("cpu", [override])
    # end to end: refused before the first run trained (it trained, then the final-model
    # measurement failed with "sigma (noise standard deviation) must be positive")
    with pytest.raises(ValueError, match="measures none"):
        run_experiment("robustness", tmp_path / "out", overrides=[*DIGITS, override],
                       log=lambda _: None)
    assert not (tmp_path / "out").exists()
    settings, runs = exp.resolve("cpu", ["sigma=0.3"])
    assert settings.sigma == 0.3 and {r.config.track.sigma for r in runs} == {0.3}


@pytest.mark.parametrize("others", ["others=[]", "others=[vit_simple]"])
def test_robustness_refuses_others_without_a_cnn(others: str) -> None:
    exp = get_experiment("robustness")
    # part (a) compares the ViTs with the models whose names do not start with "vit": without
    # one, every run trained for "need vit_small, a CNN and the regularized runs"
    with pytest.raises(ValueError, match=r"others=\[.*\]: part \(a\) compares the ViTs with CNNs"):
        exp.resolve("cpu", [others])
    labels = {r.config.label for r in exp.resolve("cpu", ["others=[vit_simple,cnn]"])[1]}
    assert {"vit_simple", "cnn", "vit_small"} <= labels
    assert {r.config.label for r in exp.resolve("paper")[1]} >= {"resnet18", "densenet121"}
