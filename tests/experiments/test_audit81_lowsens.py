"""Audit 81 (lowsens): grokking's claim phases cached by an older rule, ImageNet's accuracy
check skipped without a word, and ImageNet's σ = 0 accepted until after a model's clean pass."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from senslab.experiments import get_experiment
from senslab.experiments.base import Run
from senslab.experiments.lowsens.imagenet import imagenet_verdict
from senslab.verdicts import NOT_COMPARABLE, SUPPORTED


def _quiet(_: str) -> None:
    pass


# --------------------------------------------------------------------------- grokking
def _grok_history(k: int) -> list[dict[str, Any]]:
    """Memorised at epoch 20, the jump (test acc 0.6) at 80, generalised at 100; sensitivity
    falls from its peak at 20 and is NaN at epoch 40, on the plateau."""
    sens = [0.1, 0.1, 0.09 + 0.01 * k, 0.08, math.nan, 0.06, 0.05, 0.03, 0.02, 0.01, 0.01, 0.01]
    return [{"epoch": 10 * e, "train/acc": 1.0 if e >= 2 else 0.5,
             "test/acc": 0.1 if e < 8 else 0.6 if e < 10 else 0.97, "sens/train": s,
             "weight_norm": 1.0} for e, s in enumerate(sens)]


def test_grokking_claim_phases_of_an_older_rule_are_computed_again(tmp_path: Path) -> None:
    from senslab.train.loops.grokking import GrokkingRun, grokking_phases

    exp = get_experiment("grokking")
    summaries = []
    for k in range(3):
        h = _grok_history(k)
        # claim_phases as the rule of 2026-11-30 stored them: no sens_not_finite_epochs, the
        # NaN at epoch 40 skipped by max()
        old = {"memorisation_epoch": 20, "generalisation_epoch": 100, "jump_epoch": 80,
               "before_jump_epoch": 70, "sens_before_jump": 0.03, "peak_epoch": 20,
               "sens_peak": h[2]["sens/train"], "sens_at_generalisation": 0.01,
               "plateau": True}
        name = f"g{k}"
        path = tmp_path / name
        path.mkdir()
        (path / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i, "time": 0.0, **r}) + "\n" for i, r in enumerate(h)))
        summary = {"name": name, "epochs": 110, "final": h[-1], "phases": grokking_phases(h),
                   "claim_phases": old}
        (path / "summary.json").write_text(json.dumps(summary))
        summaries.append(exp.after_run(Run(name, GrokkingRun(name=name), trainer="grokking"),
                                       path, summary, None, _quiet))
    # the stored phases were judged "supported" on the finite values around the NaN
    v = exp.verdict(summaries)
    assert v["verdict"] == NOT_COMPARABLE
    assert "g1 (sens/train not finite at epoch(s) [40])" in v["reason"]
    stored = json.loads((tmp_path / "g1" / "summary.json").read_text())
    assert stored["claim_phases"]["sens_not_finite_epochs"] == [40]
    # phases that match the curve are not written again
    stamp = (tmp_path / "g1" / "summary.json").stat().st_mtime_ns
    again = exp.after_run(Run("g1", GrokkingRun(name="g1"), trainer="grokking"),
                          tmp_path / "g1", stored, None, _quiet)
    assert again is stored
    assert (tmp_path / "g1" / "summary.json").stat().st_mtime_ns == stamp


# --------------------------------------------------------------------------- imagenet
def _imagenet_runs(acc: dict[str, float | None]) -> list[dict[str, Any]]:
    rng = random.Random(0)
    out = []
    for seed in range(3):
        vit = [rng.uniform(0.0, 0.1) for _ in range(20)]
        conv = [x + 0.05 + rng.uniform(0.0, 0.02) for x in vit]
        for label, ps in (("vit", vit), ("convnext", conv)):
            out.append({"name": label if seed == 0 else f"{label}-s{seed}", "label": label,
                        "seed": seed, "per_sample": ps, "num_images": len(ps),
                        "pretrained": True,
                        "final": {"sens/train": sum(ps) / len(ps), "sens/train_se": 0.01,
                                  "train/acc": acc[label]}})
    return out


@pytest.mark.parametrize(("acc", "unknown"), [
    ({"vit": None, "convnext": None}, "vit and convnext"),
    ({"vit": 0.85, "convnext": None}, "convnext"),
])
def test_imagenet_unknown_accuracy_is_said(acc: dict[str, float | None], unknown: str) -> None:
    v = imagenet_verdict(_imagenet_runs(acc))
    assert v["verdict"] == SUPPORTED
    assert f"accuracy unknown for {unknown} " in v["reason"]
    assert "comparable accuracy was not checked" in v["reason"]


def test_imagenet_known_accuracies_are_checked_and_given() -> None:
    v = imagenet_verdict(_imagenet_runs({"vit": 0.85, "convnext": 0.83}))
    assert v["verdict"] == SUPPORTED and "at accuracies 0.850 vs 0.830" in v["reason"]
    assert "unknown" not in v["reason"]
    far = imagenet_verdict(_imagenet_runs({"vit": 0.85, "convnext": 0.70}))
    assert far["verdict"] == NOT_COMPARABLE and "differ by 0.150" in far["reason"]


def test_imagenet_sigma_zero_is_refused_before_any_run() -> None:
    exp = get_experiment("imagenet")
    with pytest.raises(ValueError, match="sigma"):
        exp.resolve("cpu", ["sigma=0"])
    assert exp.resolve("cpu", ["sigma=0.25"])[1][0].config.sigma == 0.25
