"""Audit 83: the implicit-bias verdicts on summaries read back from disk (a non-finite number is
null there) and on runs that cannot be paired by seed."""

from __future__ import annotations

import math
from typing import Any

import pytest

from senslab.experiments.implicit_bias._common import loss_race_verdict
from senslab.experiments.implicit_bias.fixed_v import fixed_v_verdict
from senslab.experiments.implicit_bias.joint import joint_verdict
from senslab.experiments.implicit_bias.text import steps_to, text_race_verdict
from senslab.verdicts import NOT_COMPARABLE, SUPPORTED

RACE = {"sgd": (1.0, 0.0), "sngd": (0.3, 0.01), "sps": (0.35, 0.02), "adam": (0.2, 0.005)}


def _race(seeds: int = 3, with_seed: bool = True) -> list[dict[str, Any]]:
    """Four runs per seed: final loss = base + k·step (a clear win of SNGD and SPS over SGD)."""
    out = []
    for k in range(seeds):
        for o, (base, step) in RACE.items():
            run = {"label": o, "name": f"{o}-s{k}", "steps": 200,
                   "final": {"train/loss": base + k * step}}
            out.append({**run, "seed": k} if with_seed else run)
    return out


def test_race_refuses_two_runs_of_an_optimiser_with_one_seed() -> None:
    """Summaries without ``seed`` are all seed 0: the race kept the last run of each optimiser
    and judged one seed of three without a word (here: "inconclusive, 1 seed")."""
    v = loss_race_verdict(_race())
    assert v["verdict"] == SUPPORTED
    assert v["effects"]["sngd below sgd"]["effect"] == pytest.approx(1.0 - (0.3 + 0.01))
    v = loss_race_verdict(_race(with_seed=False))
    assert v["verdict"] == NOT_COMPARABLE
    assert "sgd seed 0: sgd-s0, sgd-s1, sgd-s2" in v["reason"] and "'seed'" in v["reason"]


def _curve(final: float, mid: float | None) -> list[list[float | None]]:
    return [[0, 0.69], [300, mid], [600, final]]


def test_text_race_reads_a_null_loss_in_a_curve() -> None:
    """metrics.jsonl writes a NaN loss as null: steps_to raised TypeError (None <= 0.347)."""
    assert steps_to([[0, 0.69], [300, None], [600, 0.2]], 0.347) == 600
    assert steps_to([[0, None]], 0.347) == math.inf
    runs = [{"label": o, "seed": k, "steps": 600, "final": {"train/loss": final + 0.01 * k},
             "curve": _curve(final + 0.01 * k, None if o == "sngd" else 0.5)}
            for k in range(3) for o, final in (("sgd", 0.6), ("sngd", 0.2), ("sps", 0.25),
                                               ("adam", 0.1))]
    v = text_race_verdict(runs)
    assert v["evidence"]["sngd"]["steps_to_threshold"] == 600
    assert v["evidence"]["sgd"]["steps_to_threshold"] is None  # never at 0.347


def _joint(label: str, seed: int, loss: float | None, align: float,
           name: bool = True) -> dict[str, Any]:
    run = {"label": label, "final": {"train/loss": loss, "attn/alignment": align,
                                     "attn/v_alignment": align, "attn/sparsity": align}}
    return {**run, "seed": seed, **({"name": f"{label}-s{seed}"} if name else {})}


JOINT = {"sgd": (0.5, 0.5), "sngd": (0.1, 0.9), "sps": (0.1, 0.85), "adam": (0.05, 0.92)}


def _joint_runs() -> list[dict[str, Any]]:
    """Three seeds; seed k adds 0.001·k to the contenders' values (SGD and Adam fixed)."""
    return [_joint(o, k, loss + d, a + d) for k in range(3)
            for o, (loss, a) in JOINT.items() for d in [0.001 * k * (o in ("sngd", "sps"))]]


def test_joint_null_final_metric_is_named_not_a_type_error() -> None:
    """summary.json holds a non-finite final loss as null: the mean over seeds raised TypeError;
    it is now "not comparable", naming the run."""
    runs = _joint_runs()
    assert joint_verdict(runs)["verdict"] == SUPPORTED
    runs[4] = _joint("sgd", 1, None, 0.5)
    v = joint_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE
    assert "sgd-s1 (train/loss = nan" in v["reason"]


def test_joint_refuses_two_runs_of_an_optimiser_with_one_seed() -> None:
    """Two sngd runs of seed 0 (one far behind SGD): one was dropped without a word."""
    runs = [*_joint_runs(), {**_joint("sngd", 0, 0.9, 0.1), "name": "sngd-again"}]
    v = joint_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE
    assert "sngd seed 0: sngd-s0, sngd-again" in v["reason"]


def _fv(label: str, seed: int, r2_lin: float, r2_log: float, reach: float,
        alignment: float | None = 0.9) -> dict[str, Any]:
    return {"label": label, "seed": seed, "name": f"{label}-s{seed}", "steps": 20000,
            "final": {"attn/alignment": alignment, "attn/sparsity": 0.9, "attn/W_norm": 10.0},
            "fit": {"r2_lin": r2_lin, "r2_log": r2_log, "slope_lin": 1.0, "slope_log": 1.0},
            "reach": {"alignment": reach, "sparsity": reach}}


def _fixed_v() -> list[dict[str, Any]]:
    out = []
    for k in range(3):
        j = 0.01 * k
        out += [_fv("gd", k, 0.8 + j, 0.95, 100 + 10 * k), _fv("ngd", k, 0.99, 0.7 + j, 50 + k),
                _fv("polyak", k, 0.99, 0.8 + j, 30 + k)]
    return out


def test_fixed_v_null_final_metric_and_duplicate_seeds() -> None:
    runs = _fixed_v()
    v = fixed_v_verdict(runs)
    assert v["verdict"] == SUPPORTED
    assert v["effects"]["ngd aligns faster"]["effect"] == pytest.approx(110 - 51)
    # a final alignment that was not finite (null in summary.json): evidence NaN, no TypeError
    runs[1] = _fv("ngd", 0, 0.99, 0.7, 50, alignment=None)
    v = fixed_v_verdict(runs)
    assert v["verdict"] == SUPPORTED and math.isnan(v["evidence"]["ngd"]["final_alignment"])
    # a second GD run of seed 2 (that never aligned) was dropped from the paired parts silently
    runs = [*_fixed_v(), {**_fv("gd", 2, 0.8, 0.95, math.inf), "name": "gd-rerun"}]
    v = fixed_v_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and "gd seed 2: gd-s2, gd-rerun" in v["reason"]
