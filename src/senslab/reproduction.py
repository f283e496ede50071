"""REPRODUCTION.md: one row per registered experiment, generated from recorded results.

Two steps, both done by ``senslab reproduction``:

1. **record** — for every experiment directory given (default: ``runs/<name>`` for every
   registered experiment), read ``experiment.json`` and ``verdict.json`` and write a small record
   ``reproduction/<name>.json`` (claim, scale, verdict, reason, runtime, overrides, commit). The
   records are committed, so the table survives without the (git-ignored) run directories.
2. **render** — write REPRODUCTION.md from all records plus the experiment registry: an
   experiment without a record gets a row that says it was not run here and why (``requires``),
   with its :attr:`~senslab.experiments.base.Experiment.runtime_estimate` if it has one.

Nothing is typed by hand: the result column is the verdict's ``reason`` sentence, which every
experiment computes from its measured numbers, and the runtime column is the record's
``runtime_s`` (:func:`format_runtime`).

A record carries ``"schema"``, the version of its format (:data:`RECORD_SCHEMA`). A record
without it was written before the field existed and has the same fields (schema 1); a record of
a newer schema than this code knows is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .experiments import get_experiment, list_experiments

RECORD_KEYS = ("verdict", "reason", "runtime_s", "overrides", "finished", "commit", "threads")
#: the format of ``reproduction/<name>.json`` this code writes and reads
RECORD_SCHEMA = 1


def record(exp_dir: str | Path, records: str | Path = "reproduction") -> Path:
    """Write ``records/<name>.json`` from one finished experiment directory and return its path.

    Only CPU-scale results are recorded (the table is about what ran on this kind of machine);
    a paper-scale directory, an unfinished one (no verdict.json) or an unregistered name is an
    error that says which.
    """
    exp_dir = Path(exp_dir)
    exp_file, verdict_file = exp_dir / "experiment.json", exp_dir / "verdict.json"
    if not exp_file.is_file():
        raise FileNotFoundError(f"{exp_dir} is not an experiment directory (no experiment.json); "
                                "create one with `senslab run NAME --out DIR`")
    if not verdict_file.is_file():
        raise FileNotFoundError(f"{exp_dir} has no verdict.json: the experiment did not finish; "
                                f"re-run `senslab run NAME --out {exp_dir}` (finished runs are "
                                "reused)")
    exp, verdict = json.loads(exp_file.read_text()), json.loads(verdict_file.read_text())
    name = exp["name"]
    if name not in list_experiments():
        raise KeyError(f"{exp_dir}: experiment {name!r} is not registered "
                       f"(known: {', '.join(list_experiments())})")
    scale = verdict.get("scale", exp.get("scale", "cpu"))
    if scale != "cpu":
        raise ValueError(f"{exp_dir} was run at scale {scale!r}; REPRODUCTION.md records the "
                         "CPU-scale runs only")
    rec: dict[str, Any] = {"name": name, "scale": scale, "runs": len(exp.get("runs", [])),
                           "schema": RECORD_SCHEMA}
    rec.update({k: verdict[k] for k in RECORD_KEYS if k in verdict})
    out = Path(records) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out)
    return out


def load_records(records: str | Path = "reproduction") -> dict[str, dict[str, Any]]:
    """All records in ``records``, keyed by experiment name, in the current format (a record
    without ``schema`` is one of schema 1); a damaged record or one of a newer schema is an
    error that names the file."""
    out = {}
    for path in sorted(Path(records).glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON ({err.msg}, line {err.lineno}); restore "
                             "it from git, or re-record it with `senslab reproduction DIR`"
                             ) from None
        if not isinstance(rec, dict) or "name" not in rec:
            raise ValueError(f"{path} is not a reproduction record (no 'name'); restore it from "
                             "git, or delete it")
        schema = rec.setdefault("schema", 1)
        if not isinstance(schema, int) or schema > RECORD_SCHEMA:
            raise ValueError(f"{path} was written by a newer senslab (record schema {schema}; "
                             f"this one reads up to {RECORD_SCHEMA}); upgrade senslab")
        out[rec["name"]] = rec
    return out


def format_runtime(seconds: float | None) -> str:
    """A record's ``runtime_s`` as REPRODUCTION.md shows it ("84 s", "6.9 min"; "—" for a
    record written before runtimes were recorded)."""
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _paper_and_section(paper: str) -> tuple[str, str]:
    """'Title (venue), §5 / A.1' → ('Title (venue)', '§5 / A.1')."""
    head, sep, section = paper.rpartition("), ")
    return (head + ")", section) if sep else (paper, "")


def render(records: dict[str, dict[str, Any]]) -> str:
    """The markdown of REPRODUCTION.md: one section per paper, one row per experiment."""
    by_paper: dict[str, list[tuple[str, str]]] = {}
    for name in list_experiments():
        paper, section = _paper_and_section(get_experiment(name).paper)
        by_paper.setdefault(paper, []).append((name, section))
    counts: dict[str, int] = {}
    for rec in records.values():
        counts[rec["verdict"]] = counts.get(rec["verdict"], 0) + 1
    lines = [
        "# Reproduction status",
        "",
        "Generated by `senslab reproduction` from the records in `reproduction/` (one JSON file "
        "per experiment, written from a finished `senslab run NAME` directory); do not edit by "
        "hand.",
        "Every row is the CPU-scale run on a 2-core machine; the result column is the verdict's "
        "own sentence, computed from the measured numbers. Paper-scale settings: "
        "`senslab run NAME --scale paper` (GPU); how each one compares with the authors' own "
        "code, setting by setting: [docs/fidelity.md](docs/fidelity.md).",
        "",
        "Summary: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
        + f", {sum(1 for n in list_experiments() if n not in records)} not run here.",
    ]
    for paper, items in by_paper.items():
        lines += ["", f"## {paper}", "",
                  "| experiment | claim | CPU-scale result | runtime | verdict |",
                  "|---|---|---|---|---|"]
        for name, section in items:
            exp = get_experiment(name)
            label = f"`{name}`" + (f" ({section})" if section else "")
            rec = records.get(name)
            if rec is None:
                why = exp.requires or "no CPU-scale result recorded yet"
                lines.append(f"| {label} | {_cell(exp.claim)} | not run here: {_cell(why)} | "
                             f"{_cell(exp.runtime_estimate) or '—'} | not run |")
                continue
            result = rec.get("reason", "")
            if exp.cpu_scale_note:
                result += f" *CPU scale: {exp.cpu_scale_note}*"
            if rec.get("overrides"):
                result += " (run with " + " ".join(f"`--set {o}`" for o in rec["overrides"]) + ")"
            runtime = format_runtime(rec.get("runtime_s"))
            lines.append(f"| {label} | {_cell(exp.claim)} | {_cell(result)} | {runtime} | "
                         f"**{rec['verdict']}** |")
    return "\n".join(lines) + "\n"


def reproduction(exp_dirs: list[str | Path] | None = None, records: str | Path = "reproduction",
                 out: str | Path = "REPRODUCTION.md", runs_root: str | Path = "runs",
                 log: Any = print) -> Path:
    """Record the given experiment directories (default: ``runs_root/<name>`` for every
    registered experiment that has a verdict.json), then render ``out`` from all records."""
    if exp_dirs is None:
        exp_dirs = [Path(runs_root) / n for n in list_experiments()
                    if (Path(runs_root) / n / "verdict.json").is_file()]
    for d in exp_dirs:
        log(f"recorded {record(d, records)}")
    path = Path(out)
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(render(load_records(records)))
    os.replace(tmp, path)
    return path
