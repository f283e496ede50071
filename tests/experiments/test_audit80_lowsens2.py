"""Audit 80 (lowsens2): robustness's final measurement says when a count it was given is cut to
the split it draws from, instead of recording the count asked for beside numbers on fewer
images."""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab.data import create_dataset
from senslab.experiments.lowsens.robustness import Robustness, RobustnessSettings
from senslab.train.config import RunConfig
from senslab.train.loop import build_model


def _measure(test_images: int, sens_examples: int) -> tuple[dict, list[str]]:
    """The final measurement of an untrained MLP on 20 training and 12 test digits."""
    cfg = RunConfig()
    cfg.data.name, cfg.model.name, cfg.track.sigma = "digits", "mlp", 1.0
    train = create_dataset("digits", "train").first(20)
    test = create_dataset("digits", "test").first(12)
    torch.manual_seed(0)
    model = build_model(cfg, train).eval()
    s = RobustnessSettings(test_images=test_images, sens_examples=sens_examples)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = Robustness().measure_final(cfg, model, train, test, s)
    return out, [str(w.message) for w in caught if str(w.message).startswith("robustness: ")]


def test_counts_larger_than_the_splits_are_said() -> None:
    # before: 12 test and 20 training images measured while final_measure.json recorded
    # test_images=50 and sens_examples=100, without a word
    out, said = _measure(50, 100)
    assert len(out["noise_blur_per_image"]) == 12
    assert len(out["sensitivity"]["per_sample"]) == 20
    assert len(said) == 2
    assert "test_images=50, but the test split has 12 images" in said[0]
    assert "measured on all 12, not on 50" in said[0] and "test_images=12 or less" in said[0]
    assert "sens_examples=100, but the training set has 20 images" in said[1]
    assert "sens_examples=20 or less" in said[1]


@pytest.mark.parametrize(("test_images", "sens_examples"), [(12, 20), (5, 7)])
def test_counts_the_splits_hold_are_measured_as_asked_without_a_word(
        test_images: int, sens_examples: int) -> None:
    out, said = _measure(test_images, sens_examples)
    assert said == []
    assert len(out["noise_blur_per_image"]) == test_images
    assert len(out["sensitivity"]["per_sample"]) == sens_examples
