"""Compare two sets of experiment directories number by number (old code vs new code).

    python reproduction/side_by_side.py OLD_ROOT NEW_ROOT --out reproduction/side_by_side/NAME

OLD_ROOT/<experiment> and NEW_ROOT/<experiment> are directories written by ``senslab run`` on
the same machine at the same thread count. For every experiment present in both it compares
the verdict (verdict and reason), and for every run: each metrics.jsonl record, the summary's
``final`` record and the numbers of the measurement files written after training
(``final_measure.json`` values, ``sigma_sweep.json`` results), wall-clock entries (``time``,
``seconds``, ``elapsed``) left out. Writes ``NAME.json`` (every difference) and ``NAME.md``
(one row per experiment).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

CLOCK = {"time", "seconds", "elapsed"}
#: measurement files written after training → the key holding the numbers (the rest is the
#: cache key: the settings that produced them)
MEASURED = {"final_measure.json": "values", "sigma_sweep.json": "results"}


def untimed(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: untimed(v) for k, v in node.items() if k not in CLOCK}
    if isinstance(node, list):
        return [untimed(v) for v in node]
    return node


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ (NaN equals NaN), as 'path: a → b'."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{where}/{k}: {'missing' if k not in a else 'present'} → "
                           f"{'missing' if k not in b else 'present'}")
            else:
                out += differences(a[k], b[k], f"{where}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items → {len(b)}"]
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in differences(x, y, f"{where}/{i}")]
    same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                      and math.isnan(b))
    return [] if same else [f"{where}: {a!r} → {b!r}"]


def read(path: Path) -> Any:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def compare(old: Path, new: Path) -> dict[str, Any]:
    vo, vn = read(old / "verdict.json"), read(new / "verdict.json")
    out: dict[str, Any] = {
        "verdict": [vo["verdict"], vn["verdict"]],
        "same_reason": vo.get("reason") == vn.get("reason"),
        "runtime_s": [vo.get("runtime_s"), vn.get("runtime_s")],
        "threads": [vo.get("threads"), vn.get("threads")],
        "runs": {},
    }
    runs_o, runs_n = read(old / "experiment.json")["runs"], read(new / "experiment.json")["runs"]
    if runs_o != runs_n:
        out["run_names"] = [runs_o, runs_n]
    for name in [r for r in runs_o if r in runs_n]:
        diffs: list[str] = []
        for file in ("metrics.jsonl", "summary.json", *MEASURED):
            a, b = old / name / file, new / name / file
            if not a.exists() and not b.exists():
                continue
            if not (a.exists() and b.exists()):
                diffs.append(f"{file}: only in {'old' if a.exists() else 'new'}")
                continue
            x, y = untimed(read(a)), untimed(read(b))
            if file == "summary.json":  # the numbers; a summary's other keys may be new
                x, y = x.get("final"), y.get("final")
                file = "summary.json final"
            elif file in MEASURED:
                key = MEASURED[file]
                x, y = x.get(key), y.get(key)
                file = f"{file} {key}"
            diffs += [f"{file}{d}" for d in differences(x, y)]
        out["runs"][name] = diffs
    out["equal"] = (out["same_reason"] and "run_names" not in out
                    and not any(out["runs"].values()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="path without suffix")
    ap.add_argument("--records", type=Path, default=Path(__file__).parent,
                    help="the committed records (NAME.json) the re-runs are also set against")
    args = ap.parse_args()
    results = {}
    for exp in sorted(p.name for p in args.old.iterdir() if (p / "verdict.json").exists()):
        if (args.new / exp / "verdict.json").exists():
            results[exp] = compare(args.old / exp, args.new / exp)
            record = args.records / f"{exp}.json"
            if record.exists():
                rec = read(record)
                results[exp]["record"] = {
                    "verdict": rec.get("verdict"), "commit": rec.get("commit"),
                    "same_reason_as_new": rec.get("reason") == read(
                        args.new / exp / "verdict.json").get("reason")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["| experiment | old verdict | new verdict | every number equal | differences "
             "| committed record: verdict, same reason as the re-run |",
             "|---|---|---|---|---|---|"]
    for exp, r in results.items():
        n = sum(len(v) for v in r["runs"].values())
        first = next((f"{k}: {v[0]}" for k, v in r["runs"].items() if v), "")
        rec = r.get("record")
        recorded = (f"{rec['verdict']}, {'yes' if rec['same_reason_as_new'] else 'no'}"
                    if rec else "none")
        lines.append(f"| `{exp}` | {r['verdict'][0]} | {r['verdict'][1]} | "
                     f"{'yes' if r['equal'] else 'no'} | {n}{' — ' + first if first else ''} "
                     f"| {recorded} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
