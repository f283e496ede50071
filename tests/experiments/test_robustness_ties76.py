"""robustness part (a), "share of corruptions on which the ViT is more accurate − ½", on ties.

A corruption on which the ViT and the CNN were exactly as accurate (averaged over severities)
counted as the CNN's win (a strict ``>``): two models with the same accuracy on all 11
corruptions, in all 3 seeds, read "contradicted", −0.5 [−0.726, −0.274], "ViT better on 0/11",
and swapping the two would have contradicted the CNN's robustness as well. A tie now counts as
half a win (the sign test's convention), so equally accurate models sit at an effect of 0 and
are not decided, and the reason names the ties. Accuracies are float32 means: the same number
of correct images spread otherwise over the severities is a tie too, not a win by rounding.

Summaries are written by hand in the shape ``measure_final`` gives them.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from senslab.experiments import get_experiment
from senslab.experiments.lowsens.robustness import wins_ties
from senslab.verdicts import CONTRADICTED, INCONCLUSIVE, SUPPORTED

CORRUPTIONS = ("gauss", "shot", "impulse", "speckle", "blur1", "blur2", "blur3", "bright",
               "contrast", "pixel", "jpeg")
SEVERITIES = [0.9, 0.8, 0.7, 0.6, 0.5]


def summary(label: str, seed: int, acc: dict[str, list[float]]) -> dict[str, Any]:
    """A finished run of ``label`` with per-severity accuracies ``acc`` on each corruption."""
    return {"label": label, "seed": seed, "name": f"{label}-s{seed}",
            "stopped": "target_train_acc", "epochs": 10,
            "final": {"train/acc": 0.86, "sens/train": 0.1, "sens/train_se": 0.01},
            "final_measure": {"clean_acc": 0.9,
                              "corrupted_acc": {k: list(v) for k, v in acc.items()},
                              "noise_blur_per_image": [0.5] * 10,
                              "sensitivity": {"estimate": 0.1, "stderr": 0.01,
                                              "per_sample": [0.1] * 10}}}


def judge(vit: dict[str, list[float]], cnn: dict[str, list[float]]) -> dict[str, Any]:
    sums = [summary(label, seed, acc) for seed in range(3)
            for label, acc in (("vit_small", vit), ("cnn", cnn))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_experiment("robustness").verdict(sums)


def test_identical_models_are_not_decided_either_way() -> None:
    same = dict.fromkeys(CORRUPTIONS, SEVERITIES)
    v = judge(same, same)
    part = v["effects"]["a: vit_small vs cnn"]
    # before: contradicted, −0.5 [−0.726, −0.274], "ViT better on 0/11" without a word of ties
    assert v["verdict"] == INCONCLUSIVE and part["verdict"] == INCONCLUSIVE
    assert part["verdict"] not in (CONTRADICTED, SUPPORTED)
    assert part["effect"] == pytest.approx(0.0, abs=1e-12)
    assert part["se"] > 0  # the share's measurement s.e. (accuracy_se), not a zero spread
    lo, hi = part["interval"]
    assert lo < 0 < hi
    assert "ViT better on 0/11 (11 ties), 0/11 (11 ties), 0/11 (11 ties)" in v["reason"]
    assert "a tie counts as half a win" in v["reason"]
    assert v["evidence"]["a"]["ties"]["vit_small vs cnn"] == {"0": 11, "1": 11, "2": 11}
    assert v["evidence"]["a"]["wins"]["vit_small vs cnn"]["0"] == [0, 11]


def test_a_tie_is_half_a_win_and_named_in_the_reason() -> None:
    # the ViT better on 5 corruptions, worse on 5 and tied on 1: a share of exactly ½
    better = [a + 0.05 for a in SEVERITIES]
    worse = [a - 0.05 for a in SEVERITIES]
    vit = {k: (better if i < 5 else worse if i < 10 else SEVERITIES)
           for i, k in enumerate(CORRUPTIONS)}
    v = judge(vit, dict.fromkeys(CORRUPTIONS, SEVERITIES))
    part = v["effects"]["a: vit_small vs cnn"]
    # before: 5/11 − ½ = −0.0455, the tie on the CNN's side
    assert part["effect"] == pytest.approx((5 + 0.5) / 11 - 0.5, abs=1e-12)
    assert part["effect"] == pytest.approx(0.0, abs=1e-12)
    assert part["verdict"] == INCONCLUSIVE
    assert "ViT better on 5/11 (1 tie), 5/11 (1 tie), 5/11 (1 tie)" in v["reason"]
    assert v["evidence"]["a"]["ties"]["vit_small vs cnn"] == {"0": 1, "1": 1, "2": 1}


def test_without_ties_the_share_and_reason_are_as_before() -> None:
    """No tie: the share is wins/n and the reason has no word of ties (the committed records
    have none to change); the evidence says there were none."""
    vit = {k: [a + (0.05 if i < 8 else -0.05) for a in SEVERITIES]
           for i, k in enumerate(CORRUPTIONS)}
    v = judge(vit, dict.fromkeys(CORRUPTIONS, SEVERITIES))
    assert v["effects"]["a: vit_small vs cnn"]["effect"] == pytest.approx(8 / 11 - 0.5)
    assert "ViT better on 8/11, 8/11, 8/11 (seeds 0, 1, 2)" in v["reason"]
    assert "tie" not in v["reason"]
    assert v["evidence"]["a"]["ties"]["vit_small vs cnn"] == {"0": 0, "1": 0, "2": 0}


def f32(k: int, n: int = 1000) -> float:
    """An accuracy as ``measure_final`` stores it: a float32 mean of ``n`` correctness flags."""
    return float((torch.arange(n) < k).float().mean())


def test_the_same_count_spread_otherwise_over_severities_is_a_tie() -> None:
    # 901 + 800 correct images against 900 + 801: the same mean accuracy, different float32
    # roundings (before: a win or a loss by rounding, whichever way the floats fell)
    vit = [f32(k) for k in (901, 800, 700, 600, 500)]
    cnn = [f32(k) for k in (900, 801, 700, 600, 500)]
    assert sum(vit) / 5 != sum(cnn) / 5  # the floats do differ
    assert wins_ties({"c": sum(vit) / 5}, {"c": sum(cnn) / 5}) == (0, 1, 1)
    # one image more is a win, however small
    assert wins_ties({"c": f32(701)}, {"c": f32(700)}) == (1, 0, 1)
    assert wins_ties({"c": f32(700)}, {"c": f32(701)}) == (0, 0, 1)
    acc = {k: vit for k in CORRUPTIONS}
    v = judge(acc, {k: cnn for k in CORRUPTIONS})
    assert v["effects"]["a: vit_small vs cnn"]["effect"] == pytest.approx(0.0, abs=1e-12)
    assert "(11 ties)" in v["reason"]
