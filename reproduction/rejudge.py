"""Judge the committed records again under the current verdict rule, from their stored numbers.

    python reproduction/rejudge.py [--date YYYY-MM-DD]

The run directories behind a record are not kept in the repository, so a record written before a
rule changed keeps the old rule's verdict until it is judged again from what it stores. Two
steps, each idempotent (a record already judged under the current rule is left as it is):

1. Every record and every ladder rung with a part whose standard error is below its own
   measurement error (:func:`senslab.reproduction.refloor`): that part's standard error becomes
   the measurement error, every part is judged again, and a ``rejudged`` entry says what moved.
2. A ladder rung run with the same settings as the experiment's CPU record and whose parts
   have the record's effect values to the last digit (the same runs) but were judged under an
   earlier rule (a correlation's bootstrap on ρ itself, not on Fisher's z) takes the record's
   parts, verdict and reason, so one document does not give the same runs two intervals. A rung
   that cannot be re-derived (its runs are not here) is left as it is, and said to be.

Each ladder's trends and summary sentence are then computed again from its rungs, its plot
drawn again, and REPRODUCTION.md rendered from all records.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any

from senslab.experiments import get_experiment
from senslab.experiments.ladder import ladder_effects, ladder_sentence, plot_ladder
from senslab.reproduction import load_ladders, load_records, refloor, render

ROOT = Path(__file__).resolve().parent


def _write(path: Path, rec: dict[str, Any]) -> None:
    path.write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")


def _note(entry: dict[str, Any], date: str, before: str, what: str) -> None:
    entry.setdefault("rejudged", []).append(
        {"date": date, "verdict_before": before, "what": what})


def _same_runs(rung: dict[str, Any], rec: dict[str, Any]) -> bool:
    """Whether ``rung`` holds the runs of CPU record ``rec`` judged under an earlier rule: the
    same scale and settings, the same parts with equal effect values, other methods."""
    if rung.get("scale") != rec.get("scale") or rung.get("overrides") \
            or rung.get("extra_overrides") or list(rec.get("overrides") or []):
        return False
    mine, theirs = rung.get("effects") or {}, rec.get("effects") or {}
    return (bool(mine) and mine.keys() == theirs.keys()
            and all(mine[k].get("effect") == theirs[k].get("effect")
                    and mine[k].get("seeds") == theirs[k].get("seeds") for k in mine)
            and any(mine[k].get("method") != theirs[k].get("method") for k in mine))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    args = ap.parse_args(argv)
    records = {p.stem: p for p in sorted(ROOT.glob("*.json"))}
    loaded = {name: json.loads(p.read_text()) for name, p in records.items()}
    for name, rec in loaded.items():
        before = rec.get("verdict", "")
        what = refloor(rec)
        if what:
            _note(rec, args.date, before, what)
            _write(records[name], rec)
            print(f"{name}: {what}")
    for path in sorted((ROOT / "ladders").glob("*.json")):
        lad = json.loads(path.read_text())
        changed = False
        cpu = loaded.get(lad["name"])
        for rung in lad["rungs"]:
            if rung.get("status") != "done":
                continue
            before = rung.get("verdict", "")
            if cpu is not None and _same_runs(rung, cpu):
                methods = sorted({e.get("method") for e in rung["effects"].values()})
                for key in ("effects", "verdict", "reason"):
                    rung[key] = json.loads(json.dumps(cpu[key]))
                _note(rung, args.date, before,
                      f"the runs of the CPU record (equal effect values), judged there under "
                      f"the current rule; this rung kept an earlier one ({'; '.join(methods)}): "
                      "its parts, verdict and reason replaced by the record's")
                changed = True
                print(f"ladder {lad['name']} rung {rung['rung']}: the CPU record's judgement")
                continue
            what = refloor(rung)
            if what:
                _note(rung, args.date, before, what)
                changed = True
                print(f"ladder {lad['name']} rung {rung['rung']}: {what}")
        if not changed:
            continue
        lad["effects"] = ladder_effects(lad["rungs"], get_experiment(lad["name"]).ladder_effects)
        lad["summary"] = ladder_sentence(lad["rungs"], lad["effects"])
        _write(path, lad)
        plot_ladder(lad, path.with_suffix(".png"))
    out = ROOT.parent / "REPRODUCTION.md"
    out.write_text(render(load_records(ROOT), load_ladders(ROOT)))


if __name__ == "__main__":
    main()
