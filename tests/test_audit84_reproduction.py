"""Audit 84: REPRODUCTION.md's seeds column says how many seeds the effects rest on where that
is not the ``seeds`` setting."""

from __future__ import annotations

from typing import Any

from senslab.reproduction import render, render_ladders, seeds_cell


def _part(seeds: int, unit: str | None = "seed") -> dict[str, Any]:
    part = {"what": "gap", "effect": 0.3, "interval": [0.2, 0.4], "se": 0.02, "seeds": seeds,
            "verdict": "supported"}
    return part if unit is None else {**part, "unit": unit}


def _row(rec: dict[str, Any], name: str = "cifar10_sigma") -> str:
    return next(line for line in render({name: rec}).splitlines()
                if line.startswith(f"| `{name}`"))


def test_the_seeds_column_says_what_the_effects_rest_on() -> None:
    # 5 seeds set, the verdict rests on 3 of them (two left out): the column said "5"
    rec = {"name": "cifar10_sigma", "scale": "cpu", "verdict": "supported", "reason": "r",
           "seeds": 5, "effects": {"lowest": _part(3), "grows": _part(3)}, "schema": 2}
    assert _row(rec).split(" | ")[4] == "5 (3 judged)"
    # parts on different numbers of seeds: the range
    rec["effects"]["grows"] = _part(4)
    assert _row(rec).split(" | ")[4] == "5 (3–4 judged)"
    # every part on the seeds set (a record before units: "seed"): as before
    rec["effects"] = {"lowest": _part(5, None), "grows": _part(5)}
    assert _row(rec).split(" | ")[4] == "5"
    # parts over runs (a fit, a correlation) count no seeds
    assert seeds_cell({"seeds": 1, "effects": {"rho": _part(12, "run")}}) == "1"
    # no effects (not comparable) or no setting
    assert seeds_cell({"seeds": 3, "effects": {}}) == "3"
    assert seeds_cell({}) == "—"


def test_a_ladder_rung_seeds_column_says_what_the_effects_rest_on() -> None:
    row = {"rung": "cpu", "scale": "cpu", "size": 200, "note": "n", "overrides": [],
           "cpu": True, "command": "c", "status": "done", "verdict": "supported", "reason": "r",
           "extra_overrides": [], "seeds": 3, "effects": {"gap": _part(2)}}
    lines = render_ladders({"ib_vit_mnist": {"name": "ib_vit_mnist", "summary": "s",
                                             "rungs": [row]}})
    cpu = next(line for line in lines if line.startswith("| cpu |"))
    assert cpu.split(" | ")[3] == "3 (2 judged)"
