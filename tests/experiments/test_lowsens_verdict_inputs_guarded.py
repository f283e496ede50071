"""Verdict inputs of the low-sensitivity experiments that used to be judged silently wrong: a σ
sweep listed in descending order, a depth/heads ablation with a single ViT variant, and sparse
parity runs listed twice under two names. Each test feeds the real experiment code the case."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from senslab.experiments import get_experiment
from senslab.verdicts import NOT_COMPARABLE, SUPPORTED


# --------------------------------------------------------------------------- cifar10_sigma
def _sigma_runs(order: list[int]) -> list[dict[str, Any]]:
    """ViT-small and ResNet-18, 3 seeds, swept at σ = 0.1, 0.5, 1.0 (listed in ``order``): the
    ResNet's sensitivity rises much faster with σ than the ViT's, so the gap grows with σ."""
    sigmas = (0.1, 0.5, 1.0)
    vit = (0.010, 0.020, 0.030)
    cnn = (0.020, 0.100, 0.300)
    runs = []
    for seed in range(3):
        for label, curve in (("vit_small", vit), ("resnet18", cnn)):
            # the seeds differ: the ResNet by 0.002·seed·(i + 1), the ViT by 0.001·seed
            jitter = [0.002 * seed * (i + 1) if label == "resnet18" else 0.001 * seed
                      for i in range(3)]
            sweep = [{"sigma": sigmas[i], "sensitivity": curve[i] + jitter[i],
                      "stderr": 0.001} for i in order]
            runs.append({"label": label, "name": f"{label}-s{seed}", "seed": seed,
                         "final": {"train/acc": 0.9, "sens/train": curve[0],
                                   "sens/train_se": 0.001},
                         "final_measure": {"sweep": sweep}})
    return runs


def test_cifar10_sigma_descending_sweep_is_judged_at_the_largest_sigma() -> None:
    exp = get_experiment("cifar10_sigma")
    up = exp.verdict(_sigma_runs([0, 1, 2]))
    down = exp.verdict(_sigma_runs([2, 1, 0]))  # --set sigmas=[1.0, 0.5, 0.1]
    # the gap (ResNet − ViT) of seed k: at σ = 1, 0.27 + 0.006k − 0.001k = 0.27 + 0.005k; at
    # σ = 0.1, 0.01 + 0.002k − 0.001k = 0.01 + 0.001k. Means over k = 0, 1, 2: 0.275 and 0.011,
    # so the gap grows by 0.264 from the smallest σ to the largest, in whatever order the sweep is
    for v in (up, down):
        assert v["verdict"] == SUPPORTED
        assert v["effects"]["lowest"]["effect"] == pytest.approx(0.275)
        assert v["effects"]["grows"]["effect"] == pytest.approx(0.264)
        assert v["effects"]["lowest"]["what"] == "gap at σ=1"
    # before the fix the descending sweep read "lowest" at σ = 0.1 and "grows" reversed:
    # contradicted
    assert down["effects"] == up["effects"]


# --------------------------------------------------------------------------- depth/heads
def _depth_runs(variants: list[str]) -> list[dict[str, Any]]:
    runs = []
    for seed in range(3):
        # the variants 0.001·(1 + seed) apart: a spread that differs between the seeds
        for label, sens in [*((v, 0.010 + 0.001 * i * (1 + seed)) for i, v in enumerate(variants)),
                            ("resnet18", 0.080 + 0.004 * seed)]:
            runs.append({"label": label, "name": f"{label}-s{seed}", "seed": seed,
                         "final": {"train/acc": 0.9, "sens/train": sens + 0.003 * seed,
                                   "sens/train_se": 0.001}})
    return runs


def test_depth_heads_with_one_variant_is_not_comparable() -> None:
    exp = get_experiment("cifar10_depth_heads")
    # --set depths=[8] heads=[32]: one ViT shape; its "spread" is 0 by construction, and the
    # old verdict read "spread under half the gap" as supported with nothing varied
    # refused before anything trains (every run trained, then "not comparable")
    with pytest.raises(ValueError, match=r"give one ViT shape, \(8, 32\).*at least two"):
        exp.settings("paper", ["depths=[8]", "heads=[32]"])
    two_shapes = exp.settings("paper", ["depths=[8]", "heads=[16,32]"])
    assert len({r.config.label for r in exp.runs(two_shapes)} - {"resnet18"}) == 2
    # the verdict of one shape's runs (runs recorded before): not comparable
    v = exp.verdict(_depth_runs(["vit_small-d8-h32"]))
    assert v["verdict"] == NOT_COMPARABLE and "at least two" in v["reason"]
    # two variants or more: judged as before
    two = exp.verdict(_depth_runs(["vit_small-d4-h32", "vit_small-d8-h32"]))
    assert two["verdict"] == SUPPORTED and "spread" in two["effects"]


# --------------------------------------------------------------------------- sparse parity
def _trainings(overrides: list[str]) -> list[tuple[Any, ...]]:
    """Every run's configuration without its name (what the training depends on)."""
    exp = get_experiment("sparse_parity")
    return [tuple(sorted((k, repr(v)) for k, v in asdict(c).items() if k != "name"))
            for c in exp.configs("cpu", overrides)]


@pytest.mark.parametrize("overrides, runs", [
    # setting 1 is setting 0 at seed 1: replicate 1 of setting 0 is replicate 0 of setting 1
    (["seeds=2"], 11),
    (["seeds=3"], 16),
    # every training-set size replaced: setting 2 (4,000 strings) becomes setting 0
    (["train_size=64"], 5),
    (["only=0,1", "seeds=2"], 3),
])
def test_sparse_parity_trains_no_run_twice(overrides: list[str], runs: int) -> None:
    trained = _trainings(overrides)
    assert len(set(trained)) == len(trained) == runs
    names = [c.name for c in get_experiment("sparse_parity").configs("cpu", overrides)]
    assert len(set(names)) == len(names)


def test_sparse_parity_default_runs_unchanged() -> None:
    from senslab.experiments.lowsens.sparse_parity import SETTINGS, run_name

    names = [c.name for c in get_experiment("sparse_parity").configs("cpu", [])]
    assert names == [run_name(i, s) for i, s in enumerate(SETTINGS)]
