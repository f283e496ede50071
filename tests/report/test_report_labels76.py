"""Labels in reports that did not say what a number is.

* ``senslab report``'s terminal table printed a single run's logged standard error
  (``Stat.kind == "se"``) exactly like a std over seeds (``0.1 ± 0.01`` beside
  ``0.12 ± 0.03``), although ``senslab.report.aggregate`` promised it marked "se": it now
  reads ``0.1 ± 0.01 (se)``.
* report.html's effects table headed its count column "seeds" and put every part's count
  there, whatever it counts: hr_sharpness_vs_length's 18 runs and sparse_parity's settings read
  as seeds, while the same parts in words said "18 runs". The column now says the count in the
  part's own unit ("18 runs", "4 settings", "3 seeds").

Run directories are written by hand in the format of docs/run-directory.md.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

from senslab.report import Stat, final_table, format_table, load_runs
from senslab.report.html import _effects_html


def write_run(path: Path, label: str, seed: int, sens: float, se: float) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"name": path.name, "label": label,
                                                  "seed": seed}))
    row = {"step": 10, "epoch": 1.0, "sens/train": sens, "sens/train_se": se}
    (path / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    (path / "summary.json").write_text(json.dumps({"label": label, "seed": seed, "final": row}))
    return path


def test_a_single_runs_standard_error_is_marked_se() -> None:
    assert str(Stat(0.1, 0.01, 1, "se")) == "0.1 ± 0.01 (se)"
    assert str(Stat(0.12, 0.03, 3, "std")) == "0.12 ± 0.03"  # a std over seeds: as before
    assert str(Stat(0.5)) == "0.5"
    assert str(Stat(0.1, 0.01, 1, "se", of=3)) == "0.1 ± 0.01 (se) (1 of 3 runs)"


def test_the_terminal_table_tells_se_from_std(tmp_path: Path) -> None:
    paths = [write_run(tmp_path / "a", "one_run", 0, 0.10, 0.01)] + [
        write_run(tmp_path / f"b{s}", "three_runs", s, v, 0.001)
        for s, v in enumerate((0.09, 0.12, 0.15))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = final_table(load_runs(paths))
    text = format_table(rows)
    lines = {line.split()[0]: line for line in text.splitlines()[2:]}
    assert lines["one_run"].endswith("0.1 ± 0.01 (se)")
    assert lines["three_runs"].endswith("0.12 ± 0.03")
    assert "(se)" not in lines["three_runs"]


def part(seeds: int, unit: str | None, method: str = "mean over (t)") -> dict:
    p = {"effect": 0.1, "interval": [0.05, 0.15], "level": 0.95, "se": 0.02,
         "se_measure": 0.01, "se_seed": 0.017, "verdict": "supported", "seeds": seeds,
         "method": method, "what": f"w{seeds}{unit}"}
    if unit is not None:
        p["unit"] = unit
    return p


def counts(html: str) -> list[str]:
    rows = re.findall(r"<tr><th>[^<]*</th>(<td.*?)</tr>", html)
    return [re.findall(r"<td[^>]*>(.*?)</td>", row)[2] for row in rows]


def test_the_effects_table_counts_in_each_parts_unit() -> None:
    effects = {"flat": part(18, "run"), "slope": part(9, "run"), "parity": part(4, "setting"),
               "gap": part(3, "seed"), "one": part(1, "seed"),
               "old": part(3, None),  # a record written before parts had a unit: seeds
               "boot": part(12, None, "bootstrap over 12 runs")}  # ... or a bootstrap's runs
    html = _effects_html(effects, "Holm over 7 parts")
    assert counts(html) == ["18 runs", "9 runs", "4 settings", "3 seeds", "1 seed", "3 seeds",
                            "12 runs"]
    head = re.findall(r"<tr><th>part</th>.*?</tr>", html)[0]
    assert "<th>seeds</th>" not in head and "seeds" not in head
    assert "<th>replicates</th>" in head
