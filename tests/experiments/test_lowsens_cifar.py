"""CIFAR-10 / SVHN experiments: configurations at both scales, a tiny end-to-end run on fixture
data in the real CIFAR python-tarball format, and every verdict on hand-made summaries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from senslab.experiments import get_experiment, list_experiments
from senslab.experiments.base import seeded_name
from senslab.experiments.lowsens._vision import LR
from senslab.experiments.lowsens.cifar import below_verdict
from senslab.models import create_model
from senslab.verdicts import CONTRADICTED, INCONCLUSIVE, NOT_COMPARABLE, SUPPORTED, WORDS

NAMES = ["cifar10", "svhn", "cifar10_optim", "cifar10_depth_heads", "cifar10_sigma",
         "cifar10_whole_input"]


def test_registered_with_claims_and_requirements() -> None:
    assert set(NAMES) <= set(list_experiments())
    for name in NAMES:
        exp = get_experiment(name)
        assert exp.claim and exp.paper and exp.cpu_scale_note
        assert "data.root" in exp.requires


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_configs_follow_the_spec_and_build(scale: str) -> None:
    built: set[str] = set()
    for name in NAMES:
        configs = get_experiment(name).configs(scale)
        assert len({c.name for c in configs}) == len(configs)
        for cfg in configs:
            assert cfg.train.batch_size == 100 and cfg.data.name in ("cifar10", "svhn")
            if cfg.optim.name == "sgd":
                assert cfg.optim.lr == LR[cfg.model.name] and cfg.optim.schedule == "constant"
            else:  # A.3: Adam lr 0.01, halved every 8 epochs
                assert (cfg.optim.name, cfg.optim.lr, cfg.optim.schedule, cfg.optim.step_epochs,
                        cfg.optim.gamma) == ("adam", 0.01, "step", 8, 0.5)
            key = json.dumps([cfg.model.name, cfg.model.overrides], sort_keys=True)
            if scale == "cpu" and key not in built:  # paper-size models take long to build
                built.add(key)
                model = create_model(cfg.model.name, image_size=32, in_channels=3,
                                     num_classes=10, **cfg.model.overrides)
                assert model.default_tokens().size == 4
    if scale == "paper":
        cfg = get_experiment("cifar10").configs("paper")[0]
        assert cfg.model.overrides == {} and cfg.data.train_subset is None
        assert cfg.track.sigma == 0.1 and cfg.track.repeats == 5


def test_cifar_unavailable_is_a_clear_error(tmp_path: Path) -> None:
    exp = get_experiment("cifar10")
    with pytest.raises(FileNotFoundError, match="cifar-10-python.tar.gz"):
        exp.execute(tmp_path / "out", "cpu", [f"data.root={tmp_path}"], False, lambda _: None)


@pytest.mark.heavy
def test_whole_input_end_to_end_on_fixture_tarball(tmp_path: Path, cifar_tarball) -> None:
    cifar_tarball(tmp_path, 12)  # 60 training, 12 test images
    exp = get_experiment("cifar10_whole_input")
    sets = [f"data.root={tmp_path}", "train.epochs=1", "track.num_examples=2", "seeds=2"]
    out = tmp_path / "exp"
    logs: list[str] = []
    summaries = exp.execute(out, "cpu", sets, False, logs.append)
    assert [(s["name"], s["seed"]) for s in summaries] == [
        ("vit_small", 0), ("resnet18", 0), ("vit_small-s1", 1), ("resnet18-s1", 1)]
    for s in summaries:
        m = json.loads((out / s["name"] / "final_measure.json").read_text())
        assert m["values"] == s["final_measure"]
        token, whole = s["final_measure"]["token"], s["final_measure"]["whole"]
        assert token["sigma"] == 0.5 and 0.0 <= token["sensitivity"] <= 1.0
        assert [w["sigma"] for w in whole] == [0.5 / 16, 0.5 / 8, 0.5 / 4, 0.5 / 2]
        # the tracked sensitivity and the final-model measurement are the same estimate
        assert token["sensitivity"] == pytest.approx(s["final"]["sens/train"])
    v = exp.verdict(summaries)
    assert v["verdict"] in set(WORDS) - {NOT_COMPARABLE} and "token-wise" in v["reason"]
    assert set(v["evidence"]["table"]) == {"vit_small", "resnet18"}
    assert v["effects"]["token − whole"]["seeds"] == 2
    # a second execute reuses both the trained runs and the final measurements
    logs.clear()
    again = exp.execute(out, "cpu", sets, False, logs.append)
    assert again == summaries and not any("measuring" in line for line in logs)


def _summary(label: str, sens: float, se: float = 0.002, acc: float = 0.95, seed: int = 0,
             **extra: Any) -> dict[str, Any]:
    return {"label": label, "name": seeded_name(label, seed), "seed": seed,
            "final": {"sens/train": sens, "sens/train_se": se, "train/acc": acc}, **extra}


def _seeds(label: str, sens: list[float], acc: float = 0.95,
           measures: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One summary per seed 0, 1, 2 ... (``measures``: each seed's final_measure)."""
    extra = [{"final_measure": m} for m in measures] if measures else [{}] * len(sens)
    return [_summary(label, v, acc=acc, seed=k, **e)
            for k, (v, e) in enumerate(zip(sens, extra, strict=True))]


def test_three_seeds_at_both_scales() -> None:
    for name in NAMES:
        exp = get_experiment(name)
        assert exp.seed_aware
        for scale in ("cpu", "paper"):
            settings, runs = exp.resolve(scale)
            assert settings.seeds == 3 and {r.config.seed for r in runs} == {0, 1, 2}
            seed0 = [r.name for r in runs if r.config.seed == 0]
            assert seed0 == [r.config.label for r in runs if r.config.seed == 0]


def test_below_verdict_outcomes() -> None:
    vits = _seeds("vit_small", [0.010, 0.012, 0.011]) + _seeds("vit_simple", [0.020, 0.021, 0.019])
    runs = vits + _seeds("resnet18", [0.080, 0.085, 0.079])
    v = below_verdict(runs, ["vit_small", "vit_simple"], ["resnet18"])
    assert v["verdict"] == SUPPORTED and v["correction"] == "Holm over 2 parts"
    assert set(v["effects"]) == {"resnet18 − vit_small", "resnet18 − vit_simple"}
    assert v["effects"]["resnet18 − vit_simple"]["effect"] == pytest.approx(0.184 / 3)
    # above vit_small on every seed, around vit_simple: the second part is inconclusive
    close = vits + _seeds("resnet18", [0.030, 0.012, 0.022])
    v = below_verdict(close, ["vit_small", "vit_simple"], ["resnet18"])
    assert v["verdict"] == INCONCLUSIVE
    assert v["effects"]["resnet18 − vit_simple"]["verdict"] == INCONCLUSIVE
    assert "resnet18 − vit_simple = +0.00133" in v["reason"]
    below = vits + _seeds("resnet18", [0.002, 0.003, 0.001])
    assert below_verdict(below, ["vit_small", "vit_simple"], ["resnet18"])["verdict"] == \
        CONTRADICTED
    far = vits + _seeds("resnet18", [0.080, 0.085, 0.079], acc=0.8)
    v = below_verdict(far, ["vit_small", "vit_simple"], ["resnet18"])
    assert v["verdict"] == NOT_COMPARABLE and "0.150" in v["reason"]
    assert v["evidence"]["resnet18"]["train_acc"] == pytest.approx(0.8)
    assert get_experiment("cifar10").verdict(runs)["verdict"] == SUPPORTED
    assert get_experiment("svhn").verdict(runs[:3] + runs[6:])["verdict"] == SUPPORTED


def test_optim_verdict_judges_both_optimizers_together() -> None:
    optim = get_experiment("cifar10_optim")
    runs = (_seeds("vit_small-sgd", [0.010, 0.012, 0.011])
            + _seeds("resnet18-sgd", [0.050, 0.055, 0.049])
            + _seeds("vit_small-adam", [0.010, 0.012, 0.011])
            + _seeds("resnet18-adam", [0.050, 0.055, 0.049]))
    v = optim.verdict(runs)
    assert v["verdict"] == SUPPORTED and v["correction"] == "Holm over 2 parts"
    assert set(v["effects"]) == {"resnet18-sgd − vit_small-sgd", "resnet18-adam − vit_small-adam"}
    mixed = runs[:9] + _seeds("resnet18-adam", [0.020, 0.005, 0.012])
    v = optim.verdict(mixed)
    assert v["verdict"] == INCONCLUSIVE
    assert v["effects"]["resnet18-sgd − vit_small-sgd"]["verdict"] == SUPPORTED
    far = runs[:9] + _seeds("resnet18-adam", [0.05] * 3, acc=0.85)
    v = optim.verdict(far)
    assert v["verdict"] == NOT_COMPARABLE and v["reason"].startswith("adam: ")
    assert v["evidence"]["train_acc_gap"] == pytest.approx({"sgd": 0.0, "adam": 0.1})


def test_depth_heads_verdict_has_a_spread_part() -> None:
    dh = get_experiment("cifar10_depth_heads")
    ref = _seeds("resnet18", [0.060, 0.062, 0.058])

    def variants(step: float) -> list[dict[str, Any]]:
        return [s for d in (2, 4, 6) for s in _seeds(
            f"vit_small-d{d}-h4", [0.010 + step * d + 0.001 * k for k in range(3)])]

    v = dh.verdict(variants(0.0005) + ref)  # spread 0.002, half the gap ≈ 0.025
    assert v["verdict"] == SUPPORTED and v["correction"] == "Holm over 4 parts"
    assert v["evidence"]["spread"] == pytest.approx(0.002)
    v = dh.verdict(variants(0.005) + ref)  # spread 0.02 ≥ half the gap ≈ 0.014: reversed
    assert v["effects"]["spread"]["verdict"] == CONTRADICTED and v["verdict"] == CONTRADICTED
    assert v["evidence"]["spread"] == pytest.approx(0.02)
    one = [s for s in variants(0.0005) + ref if s["seed"] == 0]
    v = dh.verdict(one)  # one seed: the spread has no measurement error and cannot be decided
    assert v["effects"]["spread"]["verdict"] == INCONCLUSIVE and v["verdict"] == INCONCLUSIVE


def _curve(values: list[float]) -> dict[str, Any]:
    return {"sweep": [{"sigma": s, "sensitivity": v, "stderr": 0.002}
                      for s, v in zip([0.1, 0.5, 1.0], values, strict=True)]}


def test_sigma_verdict_needs_a_growing_gap() -> None:
    exp = get_experiment("cifar10_sigma")
    vit = _seeds("vit_small", [0] * 3, measures=[
        _curve([0.01, 0.02, 0.03]), _curve([0.012, 0.021, 0.03]), _curve([0.011, 0.02, 0.032])])
    grows = vit + _seeds("resnet18", [0] * 3, measures=[
        _curve([0.02, 0.08, 0.15]), _curve([0.022, 0.085, 0.16]), _curve([0.021, 0.08, 0.152])])
    v = exp.verdict(grows)
    assert v["verdict"] == SUPPORTED and set(v["effects"]) == {"lowest", "grows"}
    assert v["evidence"]["gaps"][0] == pytest.approx(0.01)
    assert v["evidence"]["gaps_per_seed"]["1"] == pytest.approx([0.01, 0.064, 0.13])
    constant = vit + _seeds("resnet18", [0] * 3, measures=[
        _curve([0.05, 0.058, 0.073]), _curve([0.05, 0.062, 0.068]), _curve([0.053, 0.06, 0.07])])
    v = exp.verdict(constant)  # the gap is ≈ 0.04 at every σ: lowest yes, grows no
    assert v["effects"]["lowest"]["verdict"] == SUPPORTED
    assert v["effects"]["grows"]["verdict"] != SUPPORTED and v["verdict"] != SUPPORTED
    shrinks = vit + _seeds("resnet18", [0] * 3, measures=[
        _curve([0.10, 0.06, 0.04]), _curve([0.11, 0.062, 0.04]), _curve([0.10, 0.06, 0.041])])
    assert exp.verdict(shrinks)["verdict"] == CONTRADICTED


def test_whole_input_verdict_calibrates_sigma_on_the_vit() -> None:
    exp = get_experiment("cifar10_whole_input")

    def measure(token: float, whole: list[float]) -> dict[str, Any]:
        return {"token": {"sigma": 0.5, "sensitivity": token, "stderr": 0.002},
                "whole": [{"sigma": 0.5 * f, "sensitivity": w, "stderr": 0.002}
                          for f, w in zip(exp.fractions, whole, strict=True)]}

    # Table 4's pattern: whole-input σ = 0.125 makes the ViT's two numbers match (0.005)
    vit = _seeds("vit_small", [0] * 3, measures=[
        measure(0.005, [0.001, 0.002, 0.0049, 0.03]), measure(0.006, [0.001, 0.002, 0.006, 0.03]),
        measure(0.004, [0.001, 0.002, 0.0042, 0.03])])
    runs = vit + _seeds("resnet18", [0] * 3, measures=[
        measure(0.083, [0.004, 0.008, 0.017, 0.09]), measure(0.081, [0.004, 0.008, 0.018, 0.09]),
        measure(0.085, [0.004, 0.008, 0.016, 0.09])])
    v = exp.verdict(runs)
    assert v["verdict"] == SUPPORTED and v["evidence"]["whole_sigma"] == pytest.approx(0.125)
    assert v["evidence"]["table"]["resnet18"] == pytest.approx({"token": 0.083, "whole": 0.017})
    assert v["effects"]["token − whole"]["df"] == 2
    same = vit + _seeds("resnet18", [0] * 3, measures=[
        measure(0.02, [0.004, 0.008, 0.02, 0.09]), measure(0.021, [0.004, 0.008, 0.02, 0.09]),
        measure(0.017, [0.004, 0.008, 0.015, 0.09])])
    assert exp.verdict(same)["verdict"] == INCONCLUSIVE  # token gap ≈ whole gap on every seed
