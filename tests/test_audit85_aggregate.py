"""Audit 85 of the report's tables and run loading (senslab.report.aggregate, .runs).

* a metric logged as null at every step of every run (NaN or inf from its first measurement:
  a sharpness of inf at each) had no column and no word, as if never measured; a run with a
  number before its null final had one (audit 83).
* a mean was written to 4 digits whatever its spread: 1234.52 ± 0.014 read ``1235 ± 0.014``,
  34 spreads from the mean, and two labels 2 spreads apart (0.98764, 0.98761) read alike.
* a summary.json whose ``final`` is not an object failed as a bare TypeError naming no file.

Run directories are written by hand in the format of docs/run-directory.md.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from senslab.report import final_table, format_table, load_runs
from senslab.report.aggregate import Stat, format_number, summarize
from senslab.report.runs import RunFormatError


def write_run(path: Path, label: str, seed: int, rows: list[dict],
              summary: dict | None = None) -> Path:
    """A finished run of ``label`` that logged ``rows`` (final = the last row)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"name": path.name, "label": label,
                                                  "seed": seed}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps(
        summary if summary is not None else {"label": label, "final": rows[-1]}))
    return path


def test_a_metric_null_at_every_step_of_every_run_has_its_column(tmp_path: Path) -> None:
    dirs = [write_run(tmp_path / f"{label}{s}", label, s, [
        {"step": 0, "train/loss": 1.0, "sharpness/shop": None},
        {"step": 10, "train/loss": 0.5 + s / 10, "sharpness/shop": None}])
        for label in "ab" for s in range(2)]
    runs = load_runs(dirs)
    rows = final_table(runs)
    for row in rows:  # the column was gone: no number in any run's log to read it by
        stat = row["sharpness/shop"]
        assert str(stat) == "null" and (stat.n, stat.null) == (0, 2)
    table = format_table(rows)
    assert "sharpness/shop" in table.splitlines()[0]
    assert all(line.rstrip().endswith("null") for line in table.splitlines()[2:])
    per_run = final_table(runs, per_run=True)
    assert [str(r["sharpness/shop"]) for r in per_run] == ["null"] * 4


def test_a_metric_of_numbers_has_no_null_column(tmp_path: Path) -> None:
    runs = load_runs([write_run(tmp_path / "a", "a", 0, [{"step": 0, "train/loss": 1.0},
                                                         {"step": 10, "train/loss": 0.5}])])
    assert "null" not in format_table(final_table(runs))


def shown_mean(stat: Stat) -> float:
    return float(re.match(r"\S+", str(stat)).group())


@pytest.mark.parametrize("values", [[1234.51, 1234.53], [0.98763, 0.98765], [0.98760, 0.98762],
                                    [-52.3417, -52.3419], [12345.4, 12345.9, 12346.3],
                                    [3.1e-7, 3.2e-7], [0.5, 0.5000001]])
def test_a_mean_is_written_to_the_digits_of_its_spread(values: list[float]) -> None:
    stat = summarize(values)
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    assert stat.spread == pytest.approx(sd)
    # the written mean is within a fifth of the written spread of the mean (4 digits wrote
    # 1234.52 ± 0.014 as 1235, 34 spreads off)
    assert abs(shown_mean(stat) - mean) <= sd / 5


def test_labels_apart_by_two_spreads_read_apart(tmp_path: Path) -> None:
    dirs = [write_run(tmp_path / f"{label}{s}", label, s, [{"step": 1, "val/acc": v}])
            for label, pair in (("a", (0.98763, 0.98765)), ("b", (0.98760, 0.98762)))
            for s, v in enumerate(pair)]
    rows = final_table(load_runs(dirs))
    a, b = (str(r["val/acc"]) for r in rows)
    assert a.split()[0] != b.split()[0]  # both read 0.9876
    assert a.startswith("0.98764 ± ") and b.startswith("0.98761 ± ")


@pytest.mark.parametrize(("stat", "text"), [
    (Stat(0.123456), "0.1235"), (Stat(0.123456, 0.05, 2, "std"), "0.1235 ± 0.05"),
    (Stat(0.5, 0.0, 2, "std"), "0.5 ± 0"), (Stat(12.0, 0.0, 2, "std"), "12 ± 0"),
    (Stat(0.99996, 1e-7, 2, "std"), "0.99996 ± 1e-07"),
    (Stat(0.3, math.nan, 1, "se"), "0.3 ± nan (se)")])
def test_a_mean_without_a_finer_spread_reads_as_before(stat: Stat, text: str) -> None:
    assert str(stat) == text
    assert format_number(0.123456) == "0.1235"


@pytest.mark.parametrize("final", [[1, 2], "0.5", 3])
def test_a_summary_whose_final_is_not_an_object_is_refused_naming_it(tmp_path: Path,
                                                                    final: object) -> None:
    d = write_run(tmp_path / "r", "a", 0, [{"step": 1, "train/loss": 0.5}],
                  summary={"label": "a", "final": final})
    with pytest.raises(RunFormatError, match=r"summary.json: 'final' must be a JSON object"):
        final_table(load_runs([d]))  # was a bare TypeError/ValueError naming no file
