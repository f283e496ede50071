"""Trust checks of the implicit-bias experiments: run overrides that would test
another claim or change nothing are refused before anything is written, a fit window that
includes step 0 is refused, and the joint verdict says what it leaves out."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from senslab.experiments import get_experiment, run_experiment
from senslab.experiments.implicit_bias.fixed_v import norm_growth
from senslab.experiments.implicit_bias.joint import joint_verdict
from senslab.verdicts import NOT_COMPARABLE, SUPPORTED

TINY = ["steps=20", "seeds=2", "data.num_samples=8", "data.seq_len=4", "data.dim=8"]


@pytest.mark.parametrize(("name", "item", "match"), [
    # ib_joint's verdict reads cos(v, v_mm): a fixed head trained every run, then a KeyError
    ("ib_joint", "head=fixed", "ib_joint tests a claim about W and v trained jointly"),
    # ib_fixed_v with v trained, or on minibatches, judged the fixed-v, full-batch claim
    ("ib_fixed_v", "head=joint", "ib_fixed_v tests a claim about a fixed decoder v"),
    ("ib_fixed_v", "batch_size=4", "full-batch GD, NGD and Polyak"),
    # no run of ib_fixed_v is SPS: the setting was recorded and changed nothing
    ("ib_fixed_v", "sps_c=0.1", "no run of ib_fixed_v reads sps_c"),
])
def test_claim_changing_or_unread_run_overrides_are_refused(tmp_path: Path, name: str, item: str,
                                                            match: str) -> None:
    out = tmp_path / name
    with pytest.raises(ValueError, match=match):
        run_experiment(name, out, overrides=[*TINY, item], log=lambda _: None)
    assert not out.exists()  # refused before anything is written


def test_run_overrides_some_run_reads_still_reach_the_runs() -> None:
    configs = get_experiment("ib_fixed_v").configs("cpu", ["eta_max=0.5", "init_scale=0.1"])
    assert {c.optimizer: c.eta_max for c in configs}["ngd"] == 0.5  # NGD reads its cap
    assert all(c.init_scale == 0.1 and c.head == "fixed" for c in configs)
    configs = get_experiment("ib_joint").configs("cpu", ["sps_c=0.25"])
    assert {c.sps_c for c in configs} == {0.25}


def test_fit_from_zero_is_refused_before_training(tmp_path: Path) -> None:
    # step 0 in the log t fit: a LinAlgError after every run had trained
    with pytest.raises(ValueError, match="fit_from must be ≥ 1, got 0"):
        run_experiment("ib_fixed_v", tmp_path / "fv", overrides=[*TINY, "fit_from=0"],
                       log=lambda _: None)
    assert not (tmp_path / "fv").exists()
    records = [{"step": s, "attn/W_norm": float(s)} for s in (0, 1, 2, 5)]
    with pytest.raises(ValueError, match="needs steps ≥ 1"):
        norm_growth(records, 0)
    assert norm_growth(records, 1)["fit_points"] == 3


def _joint(label: str, seed: int, loss: float, align: float) -> dict[str, Any]:
    return {"label": label, "seed": seed,
            "final": {"train/loss": loss, "attn/alignment": align, "attn/v_alignment": align,
                      "attn/sparsity": align}}


def _runs() -> list[dict[str, Any]]:
    values = {"sgd": (0.5, 0.5), "sngd": (0.1, 0.9), "sps": (0.1, 0.85), "adam": (0.05, 0.92)}
    return [_joint(o, k, loss + (0.001 * k if o in ("sngd", "sps") else 0),
                   align + (0.001 * k if o in ("sngd", "sps") else 0))
            for k in range(3) for o, (loss, align) in values.items()]


def test_joint_verdict_means_and_parts_rest_on_the_same_seeds() -> None:
    """A fourth SGD seed with a far higher loss entered SGD's mean in the note and evidence
    ("Means over 3 seeds") while the parts used three seeds, without a word."""
    v = joint_verdict([*_runs(), _joint("sgd", 3, 5.0, 0.1)])
    assert v["verdict"] == SUPPORTED
    assert v["evidence"]["sgd"]["train/loss"] == pytest.approx(0.5)
    assert v["evidence"]["unpaired_seeds"] == {"sgd": [3]}
    assert "Left out, for want of a run of every optimiser: sgd seed 3" in v["reason"]
    assert "unpaired_seeds" not in joint_verdict(_runs())["evidence"]


def test_joint_verdict_names_a_missing_metric() -> None:
    runs = _runs()
    del runs[0]["final"]["attn/v_alignment"]  # a run whose v was not trained
    v = joint_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE
    assert "final metrics missing: sgd (seed 0): attn/v_alignment" in v["reason"]
    runs = _runs()
    runs[3]["final"]["train/loss"] = math.nan
    assert joint_verdict(runs)["verdict"] == NOT_COMPARABLE


def test_vit_epochs_setting_shadowed_by_a_run_override_is_refused() -> None:
    # the settings recorded epochs=5 while every run trained 3
    exp = get_experiment("ib_vit_mnist")
    with pytest.raises(ValueError, match="runs would train 3 epochs while the settings record 5"):
        exp.resolve("cpu", ["epochs=5", "train.epochs=3"])
    assert {c.train.epochs for c in exp.configs("cpu", ["train.epochs=3"])} == {3}
    assert {c.train.epochs for c in exp.configs("cpu", ["epochs=5", "train.epochs=5"])} == {5}


def test_joint_minibatch_as_large_as_the_data_is_refused() -> None:
    # batch 8 of 8 sequences: every "stochastic" step was a full-batch one, without a word
    with pytest.raises(ValueError, match="every step would take the whole set"):
        get_experiment("ib_joint").check("cpu", [*TINY, "batch_size=8"])
    get_experiment("ib_joint").check("cpu", [*TINY, "batch_size=4"])
