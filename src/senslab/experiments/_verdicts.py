"""Verdicts shared by experiments of more than one paper package (and by ``demo``).

A verdict that only one paper's experiments use lives in that package's shared module
(``lowsens/_vision.py``, ``implicit_bias/_common.py`` ...); one used across packages lives here,
so that no experiment module imports another.
"""

from __future__ import annotations

import math
from typing import Any


def lowest_sensitivity_verdict(summaries: list[dict[str, Any]], winner: str,
                               max_acc_gap: float = 0.03) -> dict[str, Any]:
    """'holds' if ``winner``'s final sensitivity is below every other label's by more than two
    standard errors of the difference, at train accuracies within ``max_acc_gap``."""
    final = {s["label"]: s["final"] for s in summaries}
    accs = {k: v.get("train/acc", math.nan) for k, v in final.items()}
    evidence: dict[str, Any] = {
        k: {"train_acc": accs[k], "sensitivity": v.get("sens/train"),
            "stderr": v.get("sens/train_se")} for k, v in final.items()
    }
    gap = max(accs.values()) - min(accs.values())
    if not gap <= max_acc_gap:
        return {"verdict": "not comparable", "evidence": evidence,
                "reason": f"train accuracies differ by {gap:.3f} (> {max_acc_gap})"}
    w = final[winner]
    beaten = []
    for k, v in final.items():
        if k == winner:
            continue
        diff = v["sens/train"] - w["sens/train"]
        se = math.hypot(v["sens/train_se"], w["sens/train_se"])
        beaten.append((k, diff, se, diff > 2 * se))
    ok = all(b[3] for b in beaten)
    detail = "; ".join(f"{k} − {winner} = {d:+.4f} (±{2 * se:.4f})" for k, d, se, _ in beaten)
    values = ", ".join(f"{k} {v['sens/train']:.4f} ± {v['sens/train_se']:.4f} (train acc "
                       f"{accs[k]:.3f})" for k, v in final.items())
    return {
        "verdict": "holds" if ok else "does not hold",
        "reason": (f"{winner} has the lowest sensitivity" if ok else
                   f"{winner} is not below every other model by 2 s.e.")
        + f": {detail}. Sensitivity: {values}",
        "evidence": evidence,
    }
