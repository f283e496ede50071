"""CIFAR-10 / SVHN experiments: configurations at both scales, a tiny end-to-end run on fixture
data in the real CIFAR python-tarball format, and every verdict on hand-made summaries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from senslab.experiments import get_experiment, list_experiments
from senslab.experiments.lowsens._vision import LR
from senslab.experiments.lowsens.cifar import below_verdict
from senslab.models import create_model

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


def test_whole_input_end_to_end_on_fixture_tarball(tmp_path: Path, cifar_tarball) -> None:
    cifar_tarball(tmp_path, 12)  # 60 training, 12 test images
    exp = get_experiment("cifar10_whole_input")
    sets = [f"data.root={tmp_path}", "train.epochs=1", "track.num_examples=2"]
    out = tmp_path / "exp"
    logs: list[str] = []
    summaries = exp.execute(out, "cpu", sets, False, logs.append)
    assert [s["label"] for s in summaries] == ["vit_small", "resnet18"]
    for s in summaries:
        m = json.loads((out / s["name"] / "final_measure.json").read_text())
        assert m["values"] == s["final_measure"]
        token, whole = s["final_measure"]["token"], s["final_measure"]["whole"]
        assert token["sigma"] == 0.5 and 0.0 <= token["sensitivity"] <= 1.0
        assert [w["sigma"] for w in whole] == [0.5 / 16, 0.5 / 8, 0.5 / 4, 0.5 / 2]
        # the tracked sensitivity and the final-model measurement are the same estimate
        assert token["sensitivity"] == pytest.approx(s["final"]["sens/train"])
    v = exp.verdict(summaries)
    assert v["verdict"] in {"holds", "does not hold"} and "token-wise" in v["reason"]
    assert set(v["evidence"]["table"]) == {"vit_small", "resnet18"}
    # a second execute reuses both the trained runs and the final measurements
    logs.clear()
    again = exp.execute(out, "cpu", sets, False, logs.append)
    assert again == summaries and not any("measuring" in line for line in logs)


def _summary(label: str, sens: float, se: float = 0.002, acc: float = 0.95,
             **extra: Any) -> dict[str, Any]:
    return {"label": label, "name": label,
            "final": {"sens/train": sens, "sens/train_se": se, "train/acc": acc}, **extra}


def test_below_verdict_outcomes() -> None:
    runs = [_summary("vit_small", 0.01), _summary("vit_simple", 0.02), _summary("resnet18", 0.08)]
    assert below_verdict(runs, ["vit_small", "vit_simple"], ["resnet18"])["verdict"] == "holds"
    close = runs[:2] + [_summary("resnet18", 0.021)]
    v = below_verdict(close, ["vit_small", "vit_simple"], ["resnet18"])
    assert v["verdict"] == "does not hold" and "resnet18 − vit_simple = +0.0010" in v["reason"]
    far = runs[:2] + [_summary("resnet18", 0.08, acc=0.8)]
    v = below_verdict(far, ["vit_small", "vit_simple"], ["resnet18"])
    assert v["verdict"] == "not comparable" and "0.150" in v["reason"]
    assert get_experiment("cifar10").verdict(runs)["verdict"] == "holds"


def test_optim_and_depth_heads_verdicts() -> None:
    optim = get_experiment("cifar10_optim")
    runs = [_summary("vit_small-sgd", 0.01), _summary("resnet18-sgd", 0.05),
            _summary("vit_small-adam", 0.01), _summary("resnet18-adam", 0.05)]
    assert optim.verdict(runs)["verdict"] == "holds"
    runs[3] = _summary("resnet18-adam", 0.011)
    v = optim.verdict(runs)
    assert v["verdict"] == "does not hold" and v["reason"].startswith("sgd: holds")
    dh = get_experiment("cifar10_depth_heads")
    flat = [_summary(f"vit_small-d{d}-h4", 0.010 + 0.001 * d) for d in (2, 4, 6)]
    assert dh.verdict(flat + [_summary("resnet18", 0.06)])["verdict"] == "holds"
    spread = [_summary(f"vit_small-d{d}-h4", 0.005 * d) for d in (2, 4, 6)]
    v = dh.verdict(spread + [_summary("resnet18", 0.06)])
    assert v["verdict"] == "does not hold" and v["evidence"]["spread"] == pytest.approx(0.02)


def _curve(values: list[float]) -> list[dict[str, float]]:
    return [{"sigma": s, "sensitivity": v, "stderr": 0.002}
            for s, v in zip([0.1, 0.5, 1.0], values, strict=True)]


def test_sigma_verdict_needs_a_growing_gap() -> None:
    exp = get_experiment("cifar10_sigma")
    grows = [_summary("vit_small", 0, final_measure={"sweep": _curve([0.01, 0.02, 0.03])}),
             _summary("resnet18", 0, final_measure={"sweep": _curve([0.02, 0.08, 0.15])})]
    v = exp.verdict(grows)
    assert v["verdict"] == "holds" and v["evidence"]["gaps"] == pytest.approx([0.01, 0.06, 0.12])
    constant = [grows[0], _summary("resnet18", 0,
                                   final_measure={"sweep": _curve([0.05, 0.06, 0.07])})]
    v = exp.verdict(constant)
    assert v["verdict"] == "does not hold" and "gap grows" in v["reason"]


def test_whole_input_verdict_calibrates_sigma_on_the_vit() -> None:
    exp = get_experiment("cifar10_whole_input")

    def measure(token: float, whole: list[float]) -> dict[str, Any]:
        return {"token": {"sigma": 0.5, "sensitivity": token, "stderr": 0.002},
                "whole": [{"sigma": 0.5 * f, "sensitivity": w, "stderr": 0.002}
                          for f, w in zip(exp.fractions, whole, strict=True)]}

    # Table 4's pattern: whole-input σ = 0.125 makes the ViT's two numbers match (0.005)
    runs = [_summary("vit_small", 0, final_measure=measure(0.005, [0.001, 0.002, 0.0049, 0.03])),
            _summary("resnet18", 0, final_measure=measure(0.083, [0.004, 0.008, 0.017, 0.09]))]
    v = exp.verdict(runs)
    assert v["verdict"] == "holds" and v["evidence"]["whole_sigma"] == pytest.approx(0.125)
    assert v["evidence"]["table"]["resnet18"] == {"token": 0.083, "whole": 0.017}
    runs[1] = _summary("resnet18", 0, final_measure=measure(0.02, [0.004, 0.008, 0.02, 0.09]))
    assert exp.verdict(runs)["verdict"] == "does not hold"
