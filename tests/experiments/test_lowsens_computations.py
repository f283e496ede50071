"""The numbers behind the lowsens verdicts (synthetic, grokking, sparse parity, sharpness,
ImageNet, the vision comparisons' σ sweep), recomputed by hand with numpy from small summaries
built the way the modules read them; and what the verdicts say when a run's number is NaN or
its measurements cannot be paired (audit lowsens3): the run, the measure and the epoch are
named, never a number computed from them."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from senslab.experiments import get_experiment
from senslab.experiments.lowsens._comparison import sweep_verdicts
from senslab.experiments.lowsens.grokking import grokking_verdict, phases_before_jump
from senslab.experiments.lowsens.imagenet import imagenet_verdict
from senslab.experiments.lowsens.sharpness import flatter
from senslab.experiments.lowsens.sparse_parity import parity_verdict
from senslab.experiments.lowsens.synthetic import sparse_frequent_verdict
from senslab.train.loops.grokking import grokking_phases
from senslab.verdicts import NOT_COMPARABLE

NAN = math.nan


def _mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and s/√n with numpy (ddof = 1)."""
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1) / math.sqrt(len(a)))


# --------------------------------------------------------------------------- grokking
def _grok_history(k: int, nan_at: int | None = None) -> list[dict[str, Any]]:
    """Memorised at epoch 10, test acc 0.1 up to epoch 39, 0.6 from 40 (the jump), 0.97 from 50
    (generalisation); sensitivity 0.10 + 0.01k at epoch 12 (the peak), 0.08 elsewhere on the
    plateau, 0.05 + 0.004k at epoch 39, 0.01 + 0.002k from the jump on."""
    h = []
    for e in range(60):
        s = 0.08 if e < 39 else 0.05 + 0.004 * k if e == 39 else 0.01 + 0.002 * k
        if e == 12:
            s = 0.10 + 0.01 * k
        if e == nan_at:
            s = NAN
        h.append({"epoch": e, "train/acc": 1.0 if e >= 10 else 0.5,
                  "test/acc": 0.1 if e < 40 else 0.6 if e < 50 else 0.97, "sens/train": s,
                  "weight_norm": 1.0})
    return h


def _grok_runs(nan_at: int | None = None) -> list[dict[str, Any]]:
    out = []
    for k in range(3):
        h = _grok_history(k, nan_at if k == 1 else None)
        out.append({"name": f"g{k}", "epochs": 60, "final": h[-1],
                    "phases": grokking_phases(h), "claim_phases": phases_before_jump(h)})
    return out


def test_grokking_ratios_recomputed_by_hand() -> None:
    v = grokking_verdict(_grok_runs())
    gen, before = [], []
    for k in range(3):
        sens = np.array([r["sens/train"] for r in _grok_history(k)])
        peak = sens[10:40].max()  # memorisation (10) to the last evaluation before the jump (39)
        gen.append(0.5 - sens[50] / peak)
        before.append(0.8 - sens[39] / peak)
    for name, vals in (("low at generalisation", gen), ("fallen before the jump", before)):
        m, se = _mean_se(vals)
        assert v["effects"][name]["effect"] == pytest.approx(m)
        assert v["effects"][name]["se"] == pytest.approx(se)
        assert v["effects"][name]["df"] == 2
    assert v["evidence"]["g2"]["peak_epoch"] == 12


@pytest.mark.parametrize(("nan_at", "words"), [
    (10, "sens/train not finite at epoch(s) [10]"),  # was the "peak": "peak 0" in the reason
    (20, "sens/train not finite at epoch(s) [20]"),  # was skipped: "supported" on the rest
    (39, "sens_before_jump not finite"),  # was a part "not finite", the run unnamed
    (50, "sens_at_generalisation not finite"),
])
def test_grokking_a_nan_sensitivity_is_named_not_ranked(nan_at: int, words: str) -> None:
    assert _grok_runs()[1]["claim_phases"]["sens_not_finite_epochs"] == []
    runs = _grok_runs(nan_at)
    ph = runs[1]["claim_phases"]
    assert ph["sens_not_finite_epochs"] == [nan_at]
    assert ph["peak_epoch"] == 12 and ph["sens_peak"] == pytest.approx(0.11)  # finite values
    v = grokking_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE
    assert "g1 (" in v["reason"] and words in v["reason"] and "g0" not in v["reason"]
    assert "peak 0" not in v["reason"]


def test_grokking_a_nan_outside_the_read_evaluations_changes_nothing() -> None:
    # epoch 45 lies between the jump and generalisation: the rule reads no value there
    assert grokking_verdict(_grok_runs(45)) == grokking_verdict(_grok_runs())


# --------------------------------------------------------------------------- synthetic
def _sf(name: str, case: int, ood: float, a_s: float, a_f: float, **final: float
        ) -> dict[str, Any]:
    sol = (0.05, 0.3) if case == 1 else (0.06, 0.0)
    f = {"train/acc": 1.0, "ood/acc": ood, "align/sparse": a_s, "align/frequent": a_f,
         "attn/sparse": 0.1, "attn/frequent": 0.5, "sens/train": 0.05,
         "solution/sparse": sol[0], "solution/frequent": sol[1], **final}
    return {"name": name, "label": name, "case": case, "ood_size": 500, "final": f}


SF_RUNS = [_sf("case1-s0", 1, 0.02, 0.9, 0.3), _sf("case1-s1", 1, 0.10, 0.8, 0.35),
           _sf("case1-s2", 1, 0.05, 0.85, 0.2), _sf("case2-s0", 2, 0.97, 0.2, 0.9),
           _sf("case2-s1", 2, 0.99, 0.1, 0.8), _sf("case2-s2", 2, 0.93, 0.3, 0.95)]


def test_synthetic_parts_recomputed_by_hand() -> None:
    v = sparse_frequent_verdict(SF_RUNS)
    f1 = [s["final"] for s in SF_RUNS if s["case"] == 1]
    f2 = [s["final"] for s in SF_RUNS if s["case"] == 2]

    def floor(ps: list[float]) -> float:  # √Σ se² / n, se = √((p(1 − p) + 1/n)/n), n = 500
        return math.sqrt(sum((p * (1 - p) + 1 / 500) / 500 for p in ps)) / len(ps)

    for name, vals, fl in (
            ("case 1 OOD collapses", [0.5 - f["ood/acc"] for f in f1],
             floor([f["ood/acc"] for f in f1])),
            ("case 1 aligns with sparse", [f["align/sparse"] - f["align/frequent"] for f in f1],
             0.0),
            ("case 2 OOD kept", [f["ood/acc"] - 0.9 for f in f2],
             floor([f["ood/acc"] for f in f2])),
            ("case 2 aligns with frequent", [f["align/frequent"] - f["align/sparse"] for f in f2],
             0.0)):
        m, se = _mean_se(vals)
        assert v["effects"][name]["effect"] == pytest.approx(m)
        assert v["effects"][name]["se"] == pytest.approx(max(se, fl))
    assert "mean over 3 and 3 runs" in v["reason"]


@pytest.mark.parametrize("key", ["train/acc", "solution/sparse", "solution/frequent"])
@pytest.mark.parametrize("run", [0, 3])
def test_synthetic_a_nan_final_number_is_named(key: str, run: int) -> None:
    # before: a NaN train acc passed "< 0.95" and the run was judged; a NaN solution
    # sensitivity made "frequent" the less sensitive feature (case 2 passed its design check,
    # case 1 was refused with words that blamed the design)
    runs = copy.deepcopy(SF_RUNS)
    runs[run]["final"][key] = NAN
    v = sparse_frequent_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE
    assert v["reason"] == f"{runs[run]['name']}: {key} not a finite number"


def test_synthetic_an_ood_accuracy_outside_0_1_is_named_not_a_math_error() -> None:
    runs = copy.deepcopy(SF_RUNS)
    runs[0]["final"]["ood/acc"] = 1.5  # was "ValueError: math domain error"
    v = sparse_frequent_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and "case1-s0: OOD accuracy 1.5" in v["reason"]


# --------------------------------------------------------------------------- sparse parity
def _parity(name: str, sens: list[float], se: float = 0.05, final: float = 3.0,
            test_acc: float = 1.0, final_se: float = 0.02) -> dict[str, Any]:
    return {"name": name, "k": 3, "n_bits": 10, "progress": {
        "plateau_evals": len(sens), "test_acc_final": test_acc, "sens_start": sens[0],
        "sens_plateau_max": max(sens), "sens_final": final},
        "plateau": {"epochs": list(range(len(sens))), "sens": sens, "se": [se] * len(sens),
                    "sens_final_se": final_se, "bool_samples": 200}}


PARITY = [_parity("r0", [0.2, 0.6, 1.1, 1.7, 2.1, 2.4], final=3.1),
          _parity("r1", [0.1, 0.3, 0.9, 1.2, 1.5], se=0.08, final=2.8),
          _parity("r2", [0.0, 0.2, 0.4, 1.9, 2.6, 2.2, 2.5], final=3.05),
          _parity("r3", [0.3, 0.2, 0.25, 0.3], final=2.5)]


def test_sparse_parity_parts_recomputed_by_hand() -> None:
    v = parity_verdict(PARITY)
    rise, close, close_se = [], [], []
    for s in PARITY:
        sens = np.array(s["plateau"]["sens"])
        later = sens[len(sens) - (len(sens) - 1 + 1) // 2:]  # ⌈(m − 1)/2⌉ last evaluations
        rise.append(later.mean() - sens[0])
        close.append(0.15 * 3 - abs(s["progress"]["sens_final"] - 3))
        close_se.append(math.sqrt(0.02 ** 2 + (10 / 200) ** 2))
    m, se = _mean_se(rise)
    assert v["effects"]["rises on the plateau"]["effect"] == pytest.approx(m)
    assert v["effects"]["rises on the plateau"]["se"] == pytest.approx(se)
    m, se = _mean_se(close)
    floor = math.sqrt(sum(x * x for x in close_se)) / 4
    assert v["effects"]["converges to k"]["effect"] == pytest.approx(m)
    assert v["effects"]["converges to k"]["se"] == pytest.approx(max(se, floor))


def test_sparse_parity_a_nan_evaluation_the_rise_does_not_average_is_named() -> None:
    runs = copy.deepcopy(PARITY)
    runs[2]["plateau"]["sens"][1] = NAN  # epoch 1: before the later half, was skipped unseen
    v = parity_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and "r2 (bool_sens at epoch(s) [1])" in v["reason"]
    runs = copy.deepcopy(PARITY)
    runs[0]["plateau"]["sens_final_se"] = NAN
    v = parity_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and "r0 (final bool_sens_se)" in v["reason"]


def test_sparse_parity_a_nan_final_test_accuracy_is_not_counted_as_not_learned() -> None:
    runs = [*copy.deepcopy(PARITY), _parity("r4", [0.1, 0.2, 0.3], test_acc=NAN)]
    v = parity_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and "['r4']" in v["reason"]
    # a run that did not learn is left out, by name
    runs[-1]["progress"]["test_acc_final"] = 0.55
    v = parity_verdict(runs)
    assert v["verdict"] != NOT_COMPARABLE
    assert "1 run(s) without a plateau-then-learning curve not judged (r4)" in v["reason"]
    assert v["effects"] == parity_verdict(PARITY)["effects"]


# --------------------------------------------------------------------------- sharpness
def _sharp(label: str, seed: int, shop: list[float], shpred: list[float],
           acc: float = 0.85) -> dict[str, Any]:
    return {"label": label, "name": f"{label}-s{seed}", "seed": seed,
            "final": {"train/acc": acc},
            "final_measure": {"shop": float(np.mean(shop)), "shop_per_draw": shop,
                              "shpred": float(np.mean(shpred)), "shpred_per_draw": shpred}}


RNG = np.random.default_rng(7)
BASE_DRAWS = {k: (list(10 + RNG.normal(0, 1, 5)), list(0.3 + RNG.normal(0, 0.05, 5)))
              for k in range(3)}
REG_DRAWS = {k: ([v - 0.8 + RNG.normal(0, 0.3) for v in BASE_DRAWS[k][0]],
                 [v - 0.04 + RNG.normal(0, 0.01) for v in BASE_DRAWS[k][1]]) for k in range(3)}


def _sharp_groups() -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    base = {k: _sharp("vit_small", k, *BASE_DRAWS[k]) for k in range(3)}
    reg = {k: _sharp("vit_small-patch_mse", k, *REG_DRAWS[k]) for k in range(3)}
    return copy.deepcopy(reg), copy.deepcopy(base)


def test_sharpness_parts_recomputed_by_hand() -> None:
    reg, base = _sharp_groups()
    v = flatter(reg, base)
    for i, key in enumerate(("shop", "shpred")):
        per_seed, se_seed = [], []
        for k in range(3):
            d = np.array(BASE_DRAWS[k][i]) - np.array(REG_DRAWS[k][i])  # vanilla − regularized
            per_seed.append(d.mean())
            se_seed.append(d.std(ddof=1) / math.sqrt(5))
        m, se = _mean_se(per_seed)
        floor = math.sqrt(sum(x * x for x in se_seed)) / 3
        assert v["effects"][key]["effect"] == pytest.approx(m)
        assert v["effects"][key]["se"] == pytest.approx(max(se, floor))
        assert v["evidence"][key]["diff"] == pytest.approx(-m)


def test_sharpness_a_nan_draw_is_named() -> None:
    reg, base = _sharp_groups()
    reg[1]["final_measure"]["shop_per_draw"][3] = NAN  # was: shop "cannot be judged", unnamed
    v = flatter(reg, base)
    assert v["verdict"] == NOT_COMPARABLE
    assert "vit_small-patch_mse-s1: shop_per_draw is not a non-empty list of finite" in \
        v["reason"]
    # through the experiment's verdict too, with every run handed to it
    v = get_experiment("sharpness").verdict([*base.values(), *reg.values()])
    assert v["verdict"] == NOT_COMPARABLE and "vit_small-patch_mse-s1" in v["reason"]


def test_sharpness_draws_that_cannot_be_paired_are_refused() -> None:
    reg, base = _sharp_groups()
    # one draw against five: torch broadcast it, five "paired" differences from one draw
    reg[0]["final_measure"]["shpred_per_draw"] = [0.2]
    v = flatter(reg, base)
    assert v["verdict"] == NOT_COMPARABLE
    assert "seed 0: shpred over 1 draws (vit_small-patch_mse-s0) vs 5 draws (vit_small-s0)" in \
        v["reason"]


# --------------------------------------------------------------------------- imagenet
def _im(label: str, seed: int, ps: list[float], acc: float | None = 0.8) -> dict[str, Any]:
    return {"label": label, "name": f"{label}-s{seed}", "seed": seed, "per_sample": ps,
            "final": {"sens/train": float(np.mean(ps)), "sens/train_se": 0.01,
                      "train/acc": acc}}


IM_VIT = {k: list(np.round(RNG.uniform(0, 0.3, 6), 3)) for k in range(3)}
IM_CNX = {k: [v + d for v, d in zip(IM_VIT[k], np.round(RNG.uniform(-0.05, 0.2, 6), 3),
                                    strict=True)] for k in range(3)}


def _im_runs() -> list[dict[str, Any]]:
    return copy.deepcopy([_im(lab, k, src[k]) for k in range(3)
                          for lab, src in (("vit", IM_VIT), ("convnext", IM_CNX))])


def test_imagenet_part_recomputed_by_hand() -> None:
    v = imagenet_verdict(_im_runs())
    means, ses = [], []
    for k in range(3):
        d = np.array(IM_CNX[k]) - np.array(IM_VIT[k])
        means.append(d.mean())
        ses.append(d.std(ddof=1) / math.sqrt(len(d)))
    m, se = _mean_se(means)
    part = v["effects"]["convnext − vit"]
    assert part["effect"] == pytest.approx(m)
    assert part["se"] == pytest.approx(max(se, math.sqrt(sum(x * x for x in ses)) / 3))
    half = stats.t.ppf(0.975, 2) * part["se"]
    assert part["interval"] == pytest.approx([m - half, m + half])
    assert "paired over 18 images in 3 samples" in v["reason"]


def test_imagenet_flip_rates_of_different_images_are_not_paired() -> None:
    runs = _im_runs()
    runs[0]["per_sample"] = runs[0]["per_sample"][:1]  # was broadcast against six images
    v = imagenet_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and "seed 0: vit 1, convnext 6 images" in v["reason"]
    runs = _im_runs()
    runs[2]["per_sample"] = runs[2]["per_sample"][:4]  # was a RuntimeError from torch
    assert "seed 1: vit 4, convnext 6 images" in imagenet_verdict(runs)["reason"]


def test_imagenet_a_nan_flip_rate_or_accuracy_is_named() -> None:
    runs = _im_runs()
    runs[3]["per_sample"][2] = NAN  # convnext-s1; was "convnext − vit = ? … not finite"
    v = imagenet_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and v["reason"].startswith(
        "convnext-s1: per_sample is not a non-empty list of finite flip rates")
    runs = _im_runs()
    runs[0]["final"]["train/acc"] = NAN  # was "seed-mean accuracies differ by nan"
    v = imagenet_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and "vit-s0: train/acc nan" in v["reason"]
    # accuracy unknown (class folders not WordNet IDs) is not an error
    runs = [{**s, "final": {**s["final"], "train/acc": None}} for s in _im_runs()]
    assert imagenet_verdict(runs)["verdict"] != NOT_COMPARABLE


# --------------------------------------------------------------------------- σ sweep
def test_sigma_sweep_parts_recomputed_by_hand() -> None:
    est = {("vit_small", 0): (0.010, 0.001), ("vit_small", 1): (0.012, 0.002),
           ("vit_small", 2): (0.011, 0.001), ("mlp", 0): (0.05, 0.004),
           ("mlp", 1): (0.03, 0.003), ("mlp", 2): (0.06, 0.002)}
    groups: dict[str, dict[int, dict[str, Any]]] = {}
    for (label, seed), (e, se) in est.items():
        sweep = {"0.25": {"estimate": e, "stderr": se},
                 "0.5": {"estimate": 2 * e, "stderr": se}}
        groups.setdefault(label, {})[seed] = {"label": label, "sigma_sweep": sweep}
    out = sweep_verdicts(groups, "vit_small")
    for sigma, scale in (("0.25", 1), ("0.5", 2)):
        d = [scale * (est["mlp", k][0] - est["vit_small", k][0]) for k in range(3)]
        floor = math.sqrt(sum(est["mlp", k][1] ** 2 + est["vit_small", k][1] ** 2
                              for k in range(3))) / 3
        m, se = _mean_se(d)
        part = out[sigma]["parts"]["mlp − vit_small"]
        assert part["effect"] == pytest.approx(m)
        assert part["se"] == pytest.approx(max(se, floor))
