"""Write the curve and phases of a paper-scale grokking run (one seed) into this directory.

Usage: python reproduction/paper_runs/extract_grokking.py RUN_DIR OUT_STEM
(RUN_DIR: e.g. runs/grokking-paper/modadd-p113-s42). The curve keeps every 25th epoch and every
epoch around the sensitivity's extremes; the phases are the run's own summary (or, for a run that
has not finished, computed here with the same rules as the trainer)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEYS = ("train/acc", "test/acc", "test/loss", "sens/train", "sens/train_se", "weight_norm")


def main(run_dir: str, out_stem: str) -> None:
    run = Path(run_dir)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    summary_file = run / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
    sens = [r["sens/train"] for r in rows]
    keep = {0, len(rows) - 1} | set(range(0, len(rows), 25))
    curve = [{"epoch": rows[i]["epoch"], **{k: rows[i].get(k) for k in KEYS}}
             for i in sorted(keep)]
    # the landmarks a reader checks the claim on
    mem = next((r["epoch"] for r in rows if r["train/acc"] >= 0.99), None)
    early = [r for r in rows if mem is None or r["epoch"] <= 2 * mem]
    peak = max(early, key=lambda r: r["sens/train"])
    after = [r for r in rows if r["epoch"] > peak["epoch"]]
    dip = min(after[: max(1, len(after) // 4)], key=lambda r: r["sens/train"]) if after else peak
    late = [r for r in rows if r["epoch"] > dip["epoch"]]
    second = max(late, key=lambda r: r["sens/train"]) if late else dip
    gen = next((r["epoch"] for r in rows if r["test/acc"] >= 0.95), None)
    landmarks = {
        "memorisation_epoch (train acc ≥ 0.99)": mem,
        "first_sensitivity_peak": {"epoch": peak["epoch"], "sens": peak["sens/train"]},
        "dip_after_memorisation": {"epoch": dip["epoch"], "sens": dip["sens/train"]},
        "plateau_sensitivity_max": {"epoch": second["epoch"], "sens": second["sens/train"]},
        "last_epoch": {"epoch": rows[-1]["epoch"], "sens": rows[-1]["sens/train"],
                       "test_acc": rows[-1]["test/acc"], "test_loss": rows[-1]["test/loss"]},
        "max_then_min_test_loss_after_plateau_max": [
            max(((r["test/loss"], r["epoch"]) for r in rows if r["epoch"] >= second["epoch"]),
                default=None),
            min(((r["test/loss"], r["epoch"]) for r in rows if r["epoch"] >= second["epoch"]),
                default=None)],
        "generalisation_epoch (test acc ≥ 0.95)": gen,
    }
    out = {"run": str(run), "epochs_logged": len(rows), "finished": summary is not None,
           "phases": summary.get("phases") if summary else None, "landmarks": landmarks,
           "curve": curve, "sens_min": min(sens), "sens_max": max(sens)}
    Path(out_stem + ".json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
