"""README.md (and docs/*.md) say what the benchmark and reproduction records say.

Every measured number the README quotes was once copied by hand from a record under
``benchmarks/results/`` or ``reproduction/``, and some of them drifted (a ratio computed from
rounded cells, a wall time quoted as a time to precision, a table kept after a newer run). These
tests read the records and the README and fail on any cell that no longer matches, naming the
cell, the README's value and the record's. They run no benchmark.

1. README tables that reproduce one record's table (the suite, variance reduction, training,
   the H100 tables) equal that record's ``markdown`` field, compared column by column by name.
2. The real-model tables (Xeon, AMX Xeon, Zen 4 EPYC, H200): every seconds, ratio, percentage and
   ✓/✗ cell listed in ``REAL_TABLES`` equals its record's row; ratios are recomputed from the raw
   seconds to precision (``ttp``), never from rounded cells.
3. Every record named in README.md and docs/*.md exists; every ``python benchmarks/X.py …``
   command parses with that script's own argument parser, names rows its record has, and a
   command quoted right beside a record's name carries ``--out`` with that name.
4. The verdict column of the README's reproduction tables equals ``reproduction/NAME.json``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "results"
REPRODUCTION = ROOT / "reproduction"
MARKDOWN_FILES = [README, *sorted((ROOT / "docs").glob("*.md"))]

pytestmark = pytest.mark.skipif(not RESULTS.is_dir() or not README.is_file(),
                                reason="no records or README in this checkout")


# --------------------------------------------------------------------------------------------
# Reading Markdown tables and records

@dataclass
class Table:
    where: str                    # "README.md:123" of the header line
    header: tuple[str, ...]
    rows: list[tuple[int, dict[str, str]]] = field(default_factory=list)  # (line, column → cell)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str, name: str = "README.md") -> list[Table]:
    """The pipe tables of a Markdown text (outside fenced code), each with its header's
    columns and its data rows as column → cell."""
    found: list[Table] = []
    lines = text.splitlines()
    fenced = False
    i = 0
    while i < len(lines):
        if re.match(r"^\s*(```|~~~)", lines[i]):
            fenced = not fenced
        elif (not fenced and lines[i].startswith("|") and i + 1 < len(lines)
              and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip())):
            table = Table(f"{name}:{i + 1}", tuple(_cells(lines[i])))
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                table.rows.append((i + 1, dict(zip(table.header, _cells(lines[i]), strict=True))))
                i += 1
            found.append(table)
            continue
        i += 1
    return found


@functools.cache
def readme_tables() -> list[Table]:
    return tables(README.read_text(encoding="utf-8"))


def readme_table(header: tuple[str, ...]) -> Table:
    hits = [t for t in readme_tables() if t.header == header]
    assert len(hits) == 1, (
        f"README has {len(hits)} tables with the header | {' | '.join(header)} |: the table was "
        "changed or removed; update this test's mapping to the record")
    return hits[0]


@functools.cache
def record(name: str) -> Any:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def row(name: str, case: str, label: str) -> dict[str, Any]:
    """The row labelled ``label`` of case ``case`` in the real-models record ``name``."""
    cases = [c for c in record(name)["cases"] if c["case"] == case]
    assert cases, f"{name} has no case {case!r}"
    rows = [r for r in cases[0]["rows"] if r["label"] == label]
    assert rows, f"{name}, case {case}: no row {label!r}"
    return rows[0]


# --------------------------------------------------------------------------------------------
# Comparing a cell shown at fewer digits with the record's

NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _decimals(number: str) -> int:
    return len(number.partition(".")[2])


def shown_equal(readme: str, rec: str) -> bool:
    """Whether a README cell shows the record's cell, perhaps with fewer digits: the same text
    around the numbers ("1,379" and "1379" alike), and each README number a rounding of some
    value the record's number could have been rounded from (868 for 867.8, 196× for 196.3×);
    at as many digits as the record shows, the record's number itself."""
    readme, rec = (re.sub(r"(?<=\d),(?=\d{3})", "", s.strip()) for s in (readme, rec))
    if readme == rec:
        return True
    if NUMBER.split(readme) != NUMBER.split(rec):
        return False
    for r, x in zip(NUMBER.findall(readme), NUMBER.findall(rec), strict=True):
        if _decimals(r) >= _decimals(x):
            if r == x:
                continue
            return False  # at the record's digits it must be the record's number
        slack = 0.5 * 10 ** -_decimals(r) + 0.5 * 10 ** -_decimals(x)
        if abs(float(r) - float(x)) > slack + 1e-12:
            return False
    return True


def test_shown_equal_rule() -> None:
    assert shown_equal("1,379", "1379") and shown_equal("868", "867.8")
    assert shown_equal("196× (✓ ≥ 20×)", "196.3× (✓ ≥ 20×)")
    assert shown_equal("830×", "829.5×")
    assert not shown_equal("4.01×", "4.02×")
    assert not shown_equal("870", "867.8")
    assert not shown_equal("1.1× (✗ ≥ 3×)", "1.1× (✓ ≥ 3×)")
    assert not shown_equal("41.0", "41")  # a digit the record does not have


# --------------------------------------------------------------------------------------------
# 1. README tables that equal one record's markdown table

@dataclass(frozen=True)
class SameAsRecord:
    """A README table (found by its header) that shows rows of the table in a record's
    ``markdown`` field. Rows are matched on ``key`` columns; every other README column is
    compared with the record's column of the same name, or the one ``columns`` renames it to."""

    readme_header: tuple[str, ...]
    record: str
    key: tuple[str, ...]
    columns: dict[str, str] = field(default_factory=dict)
    #: README row key → the record's, where the README spells the row out
    rows: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict)
    #: README column → how its cell is read from the record's (where the README shows less)
    record_cell: dict[str, Callable[[str], str]] = field(default_factory=dict)


def _mark_only(cell: str) -> str:
    return cell.split(" (")[0]  # "✓ (Δ +0.00001)" → "✓"


SAME_AS_RECORD = {
    "suite timing, 2 idle threads": SameAsRecord(
        ("case", "tokens × draws", "chunk", "reference fwd/s", "senslab fwd/s", "ratio (target)",
         "ceiling", "GFLOP/fwd", "% of GEMM"),
        "idle-2threads-timing.json", key=("case",)),
    "forwards to a fixed standard error": SameAsRecord(
        ("case", "σ", "flip rate", "plain MC", "stratified", "antithetic", "control variate",
         "cv + antithetic", "adaptive"),
        "idle-2threads.json", key=("case",)),
    "training throughput": SameAsRecord(
        ("training config", "batch", "`fit` images/s", "bare step images/s"),
        "idle-2threads-training.json", key=("training config",),
        rows={("demo (ViT-small CPU scale, MNIST)",): ("demo",),
              ("CIFAR-10 CPU scale, ViT-small (dim 64, depth 4)",): ("cifar10 vit_small",),
              ("CIFAR-10 CPU scale, ResNet-18 (width ¼)",): ("cifar10 resnet18",)}),
    "H100 suite": SameAsRecord(
        ("case", "reference fwd/s", "senslab fwd/s", "ratio (target)",
         "% of fp32 GEMM (51 TFLOP/s)"),
        "h100-suite.json", key=("case",), columns={"% of fp32 GEMM (51 TFLOP/s)": "% of GEMM"}),
    "H100 sensitivity per precision": SameAsRecord(
        ("model", "variant", "examples/s", "forwards/s", "estimate ± s.e.", "agrees with fp32",
         "peak GiB"),
        "h100-gpu.json", key=("model", "variant"),
        columns={"agrees with fp32": "agrees with fp32 (95% CI)"},
        record_cell={"agrees with fp32": _mark_only}),
}


@pytest.mark.parametrize("name", SAME_AS_RECORD)
def test_readme_table_equals_its_records_markdown(name: str) -> None:
    spec = SAME_AS_RECORD[name]
    table = readme_table(spec.readme_header)
    wanted = {spec.columns.get(c, c) for c in spec.readme_header}
    source = [t for t in tables(record(spec.record)["markdown"], spec.record)
              if wanted <= set(t.header)]
    assert len(source) == 1, f"{spec.record}'s markdown has no table with columns {wanted}"
    by_key = {tuple(r[k] for k in spec.key): r for _, r in source[0].rows}
    problems = []
    for line, cells in table.rows:
        key = tuple(cells[k] for k in spec.key)
        rec = by_key.get(spec.rows.get(key, key))
        if rec is None:
            problems.append(f"README.md:{line}: row {key} is not in {spec.record}")
            continue
        for column in spec.readme_header:
            if column in spec.key:
                continue
            want = rec[spec.columns.get(column, column)]
            want = spec.record_cell.get(column, str)(want)
            if not shown_equal(cells[column], want):
                problems.append(f"README.md:{line}, {name} table, row {key[-1]}, column "
                                f"{column!r}: README {cells[column]!r}, {spec.record}: {want!r}")
    assert len(table.rows) >= 3, f"{table.where}: the {name} table lost its rows"
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------------------------
# 2. The real-model tables: each listed cell against its record's row

@dataclass(frozen=True)
class Value:
    text: str    # as the README must show it
    source: str  # where the record gives it


#: A quantity read from (record, case)
Quantity = Callable[[str, str], Value]

#: target text in a record → (the reference it is a speed-up over, or the row's field; threshold)
TARGETS = {"≥ 4× the naive loop": ("naive loop", 4.0), "≥ 3× the paper code": ("paper code", 3.0),
           "≥ 40% of the bf16 GEMM peak": ("fraction_bf16_gemm", 0.40)}


def _ttp(rec: str, case: str, label: str) -> float:
    return row(rec, case, label)["ttp"]


def _vs(rec: str, case: str, label: str, reference: str) -> float:
    """``label``'s speed-up over the faster row of ``reference`` ("naive loop" or "paper
    code"), from the raw seconds to precision; the record's own ``vs_*`` field must agree."""
    cases = [c for c in record(rec)["cases"] if c["case"] == case]
    faster = min(r["ttp"] for r in cases[0]["rows"] if r["method"] == reference)
    ratio = faster / _ttp(rec, case, label)
    stored = row(rec, case, label)["vs_naive" if reference == "naive loop" else "vs_paper"]
    assert math.isclose(ratio, stored, rel_tol=1e-9), (
        f"{rec}, {case}, {label!r}: its stored ratio against the {reference} {stored} is not "
        f"its seconds' {ratio}")
    return ratio


def seconds(label: str) -> Quantity:
    def q(rec: str, case: str) -> Value:
        t = _ttp(rec, case, label)
        return Value(f"{t:.1f}", f"{rec}, {case}, {label!r}: ttp {t:.3f} s")
    return q


def vs(reference: str, label: str) -> Quantity:
    """Speed-up against the reference's faster row (``reference``: "naive loop"/"paper code")."""
    def q(rec: str, case: str) -> Value:
        r = _vs(rec, case, label, reference)
        return Value(f"{r:.2f}", f"{rec}, {case}: {label!r} vs the {reference}, {r:.4f}×")
    return q


def fastest_vs(reference: str) -> Quantity:
    """The fastest senslab row's speed-up ("senslab's fastest row against each reference's
    faster row")."""
    def q(rec: str, case: str) -> Value:
        cases = [c for c in record(rec)["cases"] if c["case"] == case]
        fastest = min((r for r in cases[0]["rows"] if r["method"].startswith("senslab")),
                      key=lambda r: r["ttp"])
        return vs(reference, fastest["label"])(rec, case)
    return q


def times(slower: str, faster: str) -> Quantity:
    """A derived ratio such as "N× the fp32 row": ``slower``'s seconds over ``faster``'s."""
    def q(rec: str, case: str) -> Value:
        r = _ttp(rec, case, slower) / _ttp(rec, case, faster)
        return Value(f"{r:.2f}", f"{rec}, {case}: {slower!r} / {faster!r} = {r:.4f}")
    return q


def percent(label: str, unit: str, decimals: int = 0) -> Quantity:
    """``label``'s share of the ``unit`` ("fp32"/"bf16") GEMM peak, in %."""
    def q(rec: str, case: str) -> Value:
        p = 100 * row(rec, case, label)[f"fraction_{unit}_gemm"]
        return Value(f"{p:.{decimals}f}", f"{rec}, {case}, {label!r}: {p:.2f}% of the {unit} peak")
    return q


def rechecked(label: str) -> Quantity:
    """The share of copies re-checked in float32, as the record's precision column says it."""
    def q(rec: str, case: str) -> Value:
        precision = row(rec, case, label)["precision"]
        m = re.search(r"\(([\d.]+)% re-checked\)", precision)
        assert m, f"{rec}, {case}, {label!r}: no re-checked share in {precision!r}"
        return Value(m.group(1), f"{rec}, {case}, {label!r}: {precision!r}")
    return q


def meets(label: str, target: str) -> Quantity:
    """✓/✗ beside one row's number: whether that row meets the target; where the row is the
    record's best for the target, the record's own ``targets[].ok`` must say the same."""
    def q(rec: str, case: str) -> Value:
        what, threshold = TARGETS[target]
        value = (_vs(rec, case, label, what) if what in ("naive loop", "paper code")
                 else row(rec, case, label)[what])
        ok = value >= threshold
        for t in next(c for c in record(rec)["cases"] if c["case"] == case)["targets"]:
            if t["target"] == target and t["best"] == label:
                assert t["ok"] == ok, f"{rec}, {case}: target {target} ok={t['ok']}, value {value}"
        return Value("✓" if ok else "✗", f"{rec}, {case}, {label!r}: {value:.4f} for {target}")
    return q


def target_ok(target: str) -> Quantity:
    """✓/✗ of the case's target as the record judged it (``targets[].ok``)."""
    def q(rec: str, case: str) -> Value:
        hits = [t for c in record(rec)["cases"] if c["case"] == case
                for t in c["targets"] if t["target"] == target]
        assert hits, f"{rec}, {case}: no target {target!r}"
        return Value("✓" if hits[0]["ok"] else "✗",
                     f"{rec}, {case}: target {target} ok={hits[0]['ok']} ({hits[0]['best']})")
    return q


def in_record(rec: str, case: str, quantity: Quantity) -> Quantity:
    """A quantity from another record than the row's own."""
    return lambda _rec, _case: quantity(rec, case)


def over_median(label: str, seeds: str) -> Quantity:
    """``label``'s seconds over the median seconds of the seeds record ``seeds``."""
    def q(rec: str, case: str) -> Value:
        t, m = _ttp(rec, case, label), record(seeds)["summary"]["median_seconds"]
        return Value(f"{t / m:.2f}", f"{rec}, {label!r} ttp {t:.3f} / {seeds} median {m:.3f}")
    return q


def median_seconds(name: str) -> Quantity:
    def q(_rec: str, _case: str) -> Value:
        m = record(name)["summary"]["median_seconds"]
        return Value(f"{m:.1f}", f"{name}: summary.median_seconds {m:.3f}")
    return q


@dataclass(frozen=True)
class Cell:
    """One number (or ✓/✗) in a README cell: ``shape`` is the cell's text around it, with {}
    where it stands (a leading ^ anchors it at the cell's start); it must occur once."""

    column: str
    shape: str
    quantity: Quantity


@dataclass(frozen=True)
class Case:
    readme: str   # the README row's first cell
    record: str   # benchmarks/results/<record>
    case: str     # the case in the record
    cells: tuple[Cell, ...]


def C(readme: str, rec: str, case: str, *cells: tuple[str, str, Quantity]) -> Case:  # noqa: N802
    return Case(readme, rec, case, tuple(Cell(*c) for c in cells))


NAIVE, PAPER = "naive loop", "paper code"
FOUR_NAIVE, THREE_PAPER, BF16_PEAK = TARGETS

#: README table header → the record rows behind its cells
REAL_TABLES: dict[str, tuple[tuple[str, ...], list[Case]]] = {
    "AVX-512 Xeon, time to precision": (
        ("case (real data)", "naive loop", "paper code", "senslab", "vs naive loop",
         "vs paper code", "target"), [
        C("MiniLM (HF BERT), Rotten Tomatoes sentences", "real-minilm-2threads-topup.json",
          "minilm",
          ("naive loop", "^{} s", seconds("naive loop float32")),
          ("paper code", "^{} s", seconds("paper code float32")),
          ("senslab", "^{} s (adaptive", seconds("senslab adaptive allocation")),
          ("senslab", "a median of {} s", median_seconds("allocation-seeds-minilm-topup.json")),
          ("senslab", " s, {}×", over_median("naive loop float32",
                                             "allocation-seeds-minilm-topup.json")),
          ("senslab", "defaults {} s", seconds("senslab defaults")),
          ("vs naive loop", "^{}×", vs(NAIVE, "senslab adaptive allocation")),
          ("vs paper code", "^{}×", vs(PAPER, "senslab adaptive allocation")),
          ("target", "loop {}", target_ok(FOUR_NAIVE))),
        C("GPT-2 (zoo, random body), the same sentences", "real-gpt2-2threads-sized-rounds.json",
          "gpt2",
          ("naive loop", "^{} s", seconds("naive loop float32")),
          ("paper code", "^{} s", seconds("paper code float32")),
          ("senslab", "^{} s (adaptive", seconds("senslab adaptive allocation")),
          ("senslab", "defaults {} s", seconds("senslab defaults")),
          ("vs naive loop", "^{}×", vs(NAIVE, "senslab adaptive allocation")),
          ("vs paper code", "^{}×", vs(PAPER, "senslab adaptive allocation"))),
        C("ResNet-18, MNIST", "real-resnet18-256-2threads-gathered-rechecks-split.json",
          "resnet18",
          ("naive loop", "^{} s", seconds("naive loop float32")),
          ("paper code", "^{} s", seconds("paper code float32")),
          ("senslab", "^{} s (defaults", seconds("senslab defaults")),
          ("senslab", '`"int8-checked"` {} s', seconds("senslab precision=int8-checked")),
          ("vs naive loop", "^{}×", vs(NAIVE, "senslab defaults")),
          ("vs paper code", "^{}×", vs(PAPER, "senslab defaults")),
          ("target", "code {}", target_ok(THREE_PAPER))),
        C("ViT-small, MNIST", "real-vit_small-256-2threads-sixth-session.json", "vit_small",
          ("naive loop", "^{} s", seconds("naive loop float32")),
          ("paper code", "^{} s", seconds("paper code float32")),
          ("senslab", "^{} s (defaults)", seconds("senslab defaults")),
          ("vs naive loop", "^{}×", vs(NAIVE, "senslab defaults")),
          ("vs paper code", "^{}×", vs(PAPER, "senslab defaults")),
          ("target", "code {}", target_ok(THREE_PAPER))),
    ]),
    "AMX Xeon": (
        ("case", "naive loop fp32 / bf16", "paper code fp32 / bf16", "senslab defaults",
         "fastest senslab, float32's decisions", "vs naive", "vs paper code"), [
        C("MiniLM", "real-minilm-2threads-amx.json", "minilm",
          ("naive loop fp32 / bf16", "^{} / ", seconds("naive loop float32")),
          ("naive loop fp32 / bf16", "/ {} s", seconds("naive loop bf16")),
          ("paper code fp32 / bf16", "^{} / — s", seconds("paper code float32")),
          ("senslab defaults", "^{} s (checked bf16", seconds("senslab defaults")),
          ("senslab defaults", "{}% re-checked", rechecked("senslab defaults")),
          ("vs naive", "^{}×", vs(NAIVE, "senslab defaults")),
          ("vs naive", "× {} (", meets("senslab defaults", FOUR_NAIVE)),
          ("vs naive", "({}× the fp32 row)", times("naive loop float32", "senslab defaults"))),
        C("GPT-2", "real-gpt2-2threads-amx.json", "gpt2",
          ("naive loop fp32 / bf16", "^{} / ", seconds("naive loop float32")),
          ("naive loop fp32 / bf16", "/ {} s", seconds("naive loop bf16")),
          ("paper code fp32 / bf16", "^{} / ", seconds("paper code float32")),
          ("paper code fp32 / bf16", "/ {} s", seconds("paper code bf16")),
          ("senslab defaults", "^{} s (float32", seconds("senslab defaults")),
          ("fastest senslab, float32's decisions", "the allocation, {} s",
           seconds("senslab adaptive allocation")),
          ("vs naive", "^{}×", vs(NAIVE, "senslab adaptive allocation"))),
        C("ResNet-18", "real-resnet18-256-2threads-amx.json", "resnet18",
          ("naive loop fp32 / bf16", "^{} / ", seconds("naive loop float32")),
          ("naive loop fp32 / bf16", "/ {} s", seconds("naive loop bf16")),
          ("paper code fp32 / bf16", "^{} / ", seconds("paper code float32")),
          ("paper code fp32 / bf16", "/ {} s", seconds("paper code bf16")),
          ("senslab defaults", "^{} s (checked bf16", seconds("senslab defaults")),
          ("senslab defaults", ", {}%)", rechecked("senslab defaults")),
          ("fastest senslab, float32's decisions", '`"int8-checked"`, {} s',
           seconds("senslab precision=int8-checked")),
          ("fastest senslab, float32's decisions", "({}%)",
           rechecked("senslab precision=int8-checked")),
          ("vs paper code", "^{}×", vs(PAPER, "senslab precision=int8-checked")),
          ("vs paper code", "× {} (", meets("senslab precision=int8-checked", THREE_PAPER)),
          ("vs paper code", "({}× the fp32 row)",
           times("paper code float32", "senslab precision=int8-checked"))),
        C("ViT-small", "real-vit_small-256-2threads-amx.json", "vit_small",
          ("naive loop fp32 / bf16", "^{} / ", seconds("naive loop float32")),
          ("naive loop fp32 / bf16", "/ {} s", seconds("naive loop bf16")),
          ("paper code fp32 / bf16", "^{} / ", seconds("paper code float32")),
          ("paper code fp32 / bf16", "/ {} s", seconds("paper code bf16")),
          ("senslab defaults", "^{} s (float32", seconds("senslab defaults")),
          ("senslab defaults", "re-checked {}%)", rechecked("senslab precision=bf16-checked")),
          ("fastest senslab, float32's decisions", '`"float32"`, {} s',
           seconds("senslab precision=float32")),
          ("vs paper code", "^{}×", vs(PAPER, "senslab precision=float32")),
          ("vs paper code", "× {} (", meets("senslab precision=float32", THREE_PAPER)),
          ("vs paper code", "({}× the fp32 row)",
           times("paper code float32", "senslab precision=float32"))),
    ]),
    "Zen 4 EPYC": (
        ("case", "naive loop fp32 / bf16", "paper code fp32 / bf16", "senslab defaults",
         "fastest, float32's decisions", "fastest, bf16's own decisions"), [
        C("MiniLM", "real-minilm-2threads-zen4.json", "minilm",
          ("naive loop fp32 / bf16", "^{} / ", seconds("naive loop float32")),
          ("naive loop fp32 / bf16", "/ {} s", seconds("naive loop bf16")),
          ("paper code fp32 / bf16", "^{} / ", seconds("paper code float32")),
          ("paper code fp32 / bf16", "/ {} s", seconds("paper code bf16")),
          ("senslab defaults", "^{} s (checked bf16)", seconds("senslab defaults")),
          ("senslab defaults", "{}% of the bf16 peak", percent("senslab defaults", "bf16")),
          ("senslab defaults", "peak {}", meets("senslab defaults", BF16_PEAK)),
          ("fastest, float32's decisions", "checked bf16 {} s", in_record(
              "real-minilm-2threads-zen4-allocation-checked.json", "minilm",
              seconds("senslab adaptive allocation bf16-checked"))),
          ("fastest, float32's decisions", "s: {}× the naive loop", in_record(
              "real-minilm-2threads-zen4-allocation-checked.json", "minilm",
              vs(NAIVE, "senslab adaptive allocation bf16-checked"))),
          ("fastest, float32's decisions", "(its own run) {}", in_record(
              "real-minilm-2threads-zen4-allocation-checked.json", "minilm",
              meets("senslab adaptive allocation bf16-checked", FOUR_NAIVE))),
          ("fastest, bf16's own decisions", "autocast {} s",
           seconds("senslab adaptive allocation autocast=bf16")),
          ("fastest, bf16's own decisions", "s: {}×",
           vs(NAIVE, "senslab adaptive allocation autocast=bf16")),
          ("fastest, bf16's own decisions", "× {}",
           meets("senslab adaptive allocation autocast=bf16", FOUR_NAIVE))),
        C("GPT-2", "real-gpt2-2threads-zen4.json", "gpt2",
          ("naive loop fp32 / bf16", "^{} / ", seconds("naive loop float32")),
          ("naive loop fp32 / bf16", "/ {} s", seconds("naive loop bf16")),
          ("paper code fp32 / bf16", "^{} / ", seconds("paper code float32")),
          ("paper code fp32 / bf16", "/ {} s", seconds("paper code bf16")),
          ("senslab defaults", "^{} s (float32)", seconds("senslab defaults")),
          ("fastest, float32's decisions", "the allocation {} s",
           seconds("senslab adaptive allocation")),
          ("fastest, bf16's own decisions", "autocast {} s;",
           seconds("senslab adaptive allocation autocast=bf16")),
          ("fastest, bf16's own decisions", "autocast at {}%",
           percent("senslab autocast=bf16", "bf16")),
          ("fastest, bf16's own decisions", "peak {} (", meets("senslab autocast=bf16", BF16_PEAK)),
          ("fastest, bf16's own decisions", "({}% with packed", in_record(
              "real-gpt2-2threads-zen4-packed.json", "gpt2",
              percent("senslab autocast=bf16", "bf16")))),
        C("ResNet-18", "real-resnet18-256-2threads-zen4.json", "resnet18",
          ("naive loop fp32 / bf16", "^{} / ", seconds("naive loop float32")),
          ("naive loop fp32 / bf16", "/ {} s", seconds("naive loop bf16")),
          ("paper code fp32 / bf16", "^{} / ", seconds("paper code float32")),
          ("paper code fp32 / bf16", "/ {} s", seconds("paper code bf16")),
          ("senslab defaults", "^{} s (checked bf16)", seconds("senslab defaults")),
          ("senslab defaults", "): {}×", vs(PAPER, "senslab defaults")),
          ("fastest, float32's decisions", '`"bf16-checked"` {} s',
           seconds("senslab precision=bf16-checked")),
          ("fastest, float32's decisions", "s: {}×", vs(PAPER, "senslab precision=bf16-checked")),
          ("fastest, float32's decisions", "× {}",
           meets("senslab precision=bf16-checked", THREE_PAPER)),
          ("fastest, bf16's own decisions", "`autocast=bf16` {} s",
           seconds("senslab autocast=bf16")),
          ("fastest, bf16's own decisions", "s: {}×", vs(PAPER, "senslab autocast=bf16")),
          ("fastest, bf16's own decisions", "× {}", meets("senslab autocast=bf16", THREE_PAPER))),
        C("ViT-small", "real-vit_small-256-2threads-zen4.json", "vit_small",
          ("naive loop fp32 / bf16", "^{} / — s", seconds("naive loop float32")),
          ("paper code fp32 / bf16", "^{} / ", seconds("paper code float32")),
          ("paper code fp32 / bf16", "/ {} s", seconds("paper code bf16")),
          ("senslab defaults", "^{} s (float32)", seconds("senslab defaults")),
          ("senslab defaults", "): {}×", vs(PAPER, "senslab defaults")),
          ("senslab defaults", "× {}", meets("senslab defaults", THREE_PAPER)),
          ("fastest, bf16's own decisions", "`autocast=bf16` {} s",
           seconds("senslab autocast=bf16")),
          ("fastest, bf16's own decisions", "s: {}×", vs(PAPER, "senslab autocast=bf16")),
          ("fastest, bf16's own decisions", "× {},", meets("senslab autocast=bf16", THREE_PAPER)),
          ("fastest, bf16's own decisions", "at {}% of",
           percent("senslab autocast=bf16", "bf16", decimals=1)),
          ("fastest, bf16's own decisions", "peak {}",
           meets("senslab autocast=bf16", BF16_PEAK))),
    ]),
    "Zen 4 EPYC, timed directly": (
        ("case", "naive loop fp32 / bf16", "paper code fp32 / bf16", "senslab defaults",
         "`autocast=torch.bfloat16`", "target"), [
        C(name, "real-images-256-2threads-zen4-direct.json", case,
          ("naive loop fp32 / bf16", "^{} / ", seconds("naive loop float32")),
          ("naive loop fp32 / bf16", "/ {} s", seconds("naive loop bf16")),
          ("paper code fp32 / bf16", "^{} / ", seconds("paper code float32")),
          ("paper code fp32 / bf16", "/ {} s", seconds("paper code bf16")),
          ("senslab defaults", "^{} s (float32", seconds("senslab defaults")),
          ("senslab defaults", "): {}×", vs(PAPER, "senslab defaults")),
          ("senslab defaults", "({}× the fp32 row)",
           times("paper code float32", "senslab defaults")),
          ("`autocast=torch.bfloat16`", "^{} s:", seconds("senslab autocast=bf16")),
          ("`autocast=torch.bfloat16`", autocast_shape, vs(PAPER, "senslab autocast=bf16")),
          ("target", "code {}", target_ok(THREE_PAPER)))
        for name, case, autocast_shape in [("ResNet-18", "resnet18", ": {}×"),
                                           ("ViT-small", "vit_small", ": **{}×")]
    ] + [
        C(name, "real-text-2threads-zen4-direct.json", case,
          ("naive loop fp32 / bf16", "^{} / ", seconds("naive loop float32")),
          ("naive loop fp32 / bf16", "/ {} s", seconds("naive loop bf16")),
          ("paper code fp32 / bf16", "^{} / — s", seconds("paper code float32")),
          ("senslab defaults", "^{} s (", seconds("senslab defaults")),
          ("senslab defaults", "): {}× the naive loop", vs(NAIVE, "senslab defaults")),
          ("`autocast=torch.bfloat16`", "^{} s:", seconds("senslab autocast=bf16")),
          ("`autocast=torch.bfloat16`", ": {}×;", vs(NAIVE, "senslab autocast=bf16")),
          ("`autocast=torch.bfloat16`", "allocation: {} s",
           seconds("senslab adaptive allocation autocast=bf16")),
          ("`autocast=torch.bfloat16`", "s, {}×",
           vs(NAIVE, "senslab adaptive allocation autocast=bf16")),
          *cells)
        for name, case, cells in [
            ("MiniLM", "minilm", (
                ("senslab defaults", "{}% re-checked", rechecked("senslab defaults")),
                ("target", "loop {} (", target_ok(FOUR_NAIVE)),
                ("target", "best {}×", vs(NAIVE, "senslab adaptive allocation bf16-checked")))),
            ("GPT-2", "gpt2", (
                ("target", "peak {} (", target_ok(BF16_PEAK)),
                ("target", "autocast {}%)", percent("senslab autocast=bf16", "bf16"))))]
    ]),
    "H200": (
        ("case", "naive loop fp32 / bf16", "paper code fp32 / bf16", "senslab defaults",
         "bf16-checked (re-checked)", "float32", "vs naive", "vs paper code"), [
        C(name, rec, name,
          ("naive loop fp32 / bf16", "^{} / ", seconds("naive loop float32")),
          ("naive loop fp32 / bf16", "/ {}", seconds("naive loop bf16")),
          ("paper code fp32 / bf16", "^{} / ", seconds("paper code float32")),
          ("paper code fp32 / bf16", "/ {}", seconds("paper code bf16")),
          ("senslab defaults", "^{}", seconds("senslab defaults")),
          ("bf16-checked (re-checked)", "^{} (", seconds("senslab precision=bf16-checked")),
          ("bf16-checked (re-checked)", "({}%)", rechecked("senslab precision=bf16-checked")),
          ("float32", "^{}", seconds("senslab precision=float32")),
          ("vs naive", "^{}×", fastest_vs(NAIVE)),
          ("vs paper code", "^{}×", fastest_vs(PAPER)))
        for name, rec in [("minilm", "h200-real-minilm-vit.json"), ("gpt2", "h200-real-gpt2.json"),
                          ("vit_small", "h200-real-minilm-vit.json"),
                          ("resnet18", "h200-real-resnet18.json")]
    ]),
}

SLOT = r"(\d[\d,]*(?:\.\d+)?|[✓✗])"


def check_cell(text: str, cell: Cell, rec: str, case: str) -> str | None:
    """None if the README cell ``text`` shows the record's value where ``cell.shape`` says,
    else what differs."""
    anchored = cell.shape.startswith("^")
    pattern = ("^" if anchored else "") + re.escape(cell.shape.lstrip("^")).replace(
        re.escape("{}"), SLOT)
    hits = list(re.finditer(pattern, text))
    want = cell.quantity(rec, case)
    if len(hits) != 1:
        return (f"the cell {text!r} has {len(hits)} places of the form {cell.shape!r} "
                f"(record: {want.text}, {want.source}); update the README or this test's mapping")
    got = hits[0].group(1).replace(",", "")
    if got != want.text:
        return f"README {got}, record {want.text} ({want.source}); the cell: {text!r}"
    return None


def _real_cases() -> Iterator[Any]:
    for table, (_, cases) in REAL_TABLES.items():
        for case in cases:
            yield pytest.param(table, case, id=f"{table}-{case.case}")


@pytest.mark.parametrize(("table", "case"), list(_real_cases()))
def test_real_model_table_cells_equal_their_records(table: str, case: Case) -> None:
    header, _ = REAL_TABLES[table]
    readme = readme_table(header)
    rows = [(line, cells) for line, cells in readme.rows if cells[header[0]] == case.readme]
    assert len(rows) == 1, f"{readme.where}: no single row {case.readme!r} in the {table} table"
    line, cells = rows[0]
    problems = [f"README.md:{line}, {table} table, {case.readme} / {cell.column!r}: {problem}"
                for cell in case.cells
                if (problem := check_cell(cells[cell.column], cell, case.record, case.case))]
    assert not problems, "\n".join(problems)


def test_every_real_table_row_is_checked() -> None:
    """A row added to one of these README tables gets its record here too."""
    for table, (header, cases) in REAL_TABLES.items():
        shown = {cells[header[0]] for _, cells in readme_table(header).rows}
        assert shown == {c.readme for c in cases}, f"{table}: README rows {shown}"


def test_check_cell_names_both_values() -> None:
    """A drifted cell (the 4.01× once computed from rounded cells) fails with both numbers."""
    cell = Cell("vs paper code", "({}× the fp32 row)",
                times("paper code float32", "senslab precision=int8-checked"))
    args = ("real-resnet18-256-2threads-amx.json", "resnet18")
    assert check_cell("1.36× ✗ (4.02× the fp32 row)", cell, *args) is None
    problem = check_cell("1.36× ✗ (4.01× the fp32 row)", cell, *args)
    assert problem is not None and "README 4.01, record 4.02" in problem
    assert "form" in (check_cell("1.36× ✗", cell, *args) or "")


# --------------------------------------------------------------------------------------------
# 3. Record names and benchmark commands in README.md and docs/*.md

RECORD_PATH = re.compile(r"(?:benchmarks/results|reproduction)/[\w.*{},/-]*")
#: a record named without its folder (`real-gpt2-2threads-amx.json`): the prefixes records have
BARE_RECORD = re.compile(
    r"`((?:real|allocation|idle|h100|h200|noise|surrogate|ceiling|make-test|checked-precision)"
    r"-[\w.*-]*\.(?:json|log|md))`")


def _expand(name: str) -> list[str]:
    """``a.{json,png}`` → ``a.json``, ``a.png``."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m.group(1).split(",")
            for x in _expand(name[:m.start()] + alt + name[m.end():])]


def named_records() -> Iterator[tuple[str, str]]:
    """(where, path) of every record path written in README.md and docs/*.md."""
    for md in MARKDOWN_FILES:
        for number, line in enumerate(md.read_text(encoding="utf-8").splitlines(), start=1):
            where = f"{md.relative_to(ROOT)}:{number}"
            for m in RECORD_PATH.finditer(line):
                name = m.group(0).rstrip(".,")
                if re.search(r"\b[A-Z]{3,}\b", name):  # reproduction/NAME.json: a placeholder
                    continue
                yield from ((where, n) for n in _expand(name))
            for m in BARE_RECORD.finditer(line):
                yield where, f"benchmarks/results/{m.group(1)}"


def test_every_named_record_exists() -> None:
    found = list(named_records())
    assert len(found) >= 100, f"only {len(found)} record names found: is the scan broken?"
    missing = [f"{where}: {name}" for where, name in found
               if not (list(ROOT.glob(name)) if "*" in name else (ROOT / name).exists())]
    assert not missing, "records named but absent:\n" + "\n".join(missing)


@dataclass(frozen=True)
class Command:
    where: str
    script: str          # benchmarks/X.py
    args: tuple[str, ...]
    after: str           # the prose right after an inline command, up to the next code span


def _shell_words(text: str) -> list[str]:
    words = shlex.split(text, comments=True)
    for i, w in enumerate(words):  # the command ends at a shell operator
        if w in {"&", "&&", ";", "|", "||"}:
            return words[:i]
    return words


def _command(where: str, text: str, after: str = "") -> Command | None:
    m = re.search(r"\bpython (benchmarks/\w+\.py)(.*)", text, re.S)
    if not m:
        return None
    return Command(where, m.group(1), tuple(_shell_words(m.group(2))), after)


def benchmark_commands() -> Iterator[Command]:
    """Every ``python benchmarks/X.py …`` of README.md and docs/*.md: the fenced ones (lines
    joined at a trailing backslash, shell comments dropped) and the inline code spans (which
    may run over a line end), each inline one with the prose after it."""
    for md in MARKDOWN_FILES:
        lines = md.read_text(encoding="utf-8").splitlines()
        fenced, prose = False, []
        i = 0
        while i < len(lines):
            line = lines[i]
            if re.match(r"^\s*(```|~~~)", line):
                fenced = not fenced
                prose.append("")
            elif fenced:
                start = i
                text = line.split(" #")[0]
                while text.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text.rstrip()[:-1] + " " + lines[i].split(" #")[0]
                    prose.append("")
                if cmd := _command(f"{md.relative_to(ROOT)}:{start + 1}", text):
                    yield cmd
                prose.append("")
            else:
                prose.append(line)
            i += 1
        text = "\n".join(prose)
        spans = list(re.finditer(r"`([^`]+)`", text))
        for k, span in enumerate(spans):
            end = spans[k + 1].start() if k + 1 < len(spans) else len(text)
            where = f"{md.relative_to(ROOT)}:{text.count(chr(10), 0, span.start()) + 1}"
            after = text[span.end():end] + (spans[k + 1].group(0) if k + 1 < len(spans) else "")
            if cmd := _command(where, " ".join(span.group(1).split()), " ".join(after.split())):
                yield cmd


class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


@functools.cache
def _script(path: str) -> Any:
    """``benchmarks/X.py`` imported as a module (its ``main`` not called)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    name = "readme_records_" + Path(path).stem
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def parse(command: Command, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """The command's options as the script's own parser reads them. ``main`` builds the parser
    and parses first; parsing is stopped right after, so the benchmark never runs."""
    module = _script(command.script)
    assert hasattr(module, "main"), f"{command.script} has no main(argv) to parse with"
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, args: Any = None, ns: Any = None) -> Any:
        raise _Parsed(real(self, args, ns))

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        try:
            module.main(list(command.args))
        except _Parsed as parsed:
            return parsed.namespace
        except SystemExit as e:
            pytest.fail(f"{command.where}: `python {command.script} {' '.join(command.args)}` "
                        f"is refused by its parser (exit {e.code})")
    pytest.fail(f"{command.script}'s main() returned without parsing its arguments")


#: a record's name right after an inline command: "`python …`, in `benchmarks/results/X`"
BESIDE = re.compile(r"^[\s,;:)(]*(?:in|into)?\s*`(benchmarks/results/[\w.-]+)`")

#: (command, the record quoted beside it) that do not match today: each a mismatch for the
#: README to fix (found by this test, left to the README's owner), not a rule of this test
KNOWN_MISMATCHES: dict[tuple[str, str | None], str] = {}


def _command_params() -> Iterator[Any]:
    for cmd in benchmark_commands():
        text = f"python {cmd.script} {' '.join(cmd.args)}".strip()
        beside = BESIDE.match(cmd.after)
        reason = KNOWN_MISMATCHES.get((text, beside.group(1) if beside else None))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        yield pytest.param(cmd, id=f"{cmd.where} {text[7:60]}", marks=marks)


@pytest.mark.parametrize("command", list(_command_params()))
def test_benchmark_command_parses_and_names_its_record(
        command: Command, monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse(command, monkeypatch)
    out = getattr(args, "out", None)
    beside = BESIDE.match(command.after)
    if beside:
        assert out is not None and Path(out) == Path(beside.group(1)), (
            f"{command.where}: `python {command.script} {' '.join(command.args)}` is quoted as "
            f"writing {beside.group(1)}, but its --out is {out}")
    if out is not None and (ROOT / out).suffix == ".json" and (ROOT / out).exists():
        rec = json.loads((ROOT / out).read_text(encoding="utf-8"))
        methods = getattr(args, "methods", None)
        if methods and isinstance(rec, dict) and "cases" in rec:
            labels = {r["label"] for c in rec["cases"] for r in c.get("rows", [])}
            assert set(methods) <= labels, (
                f"{command.where}: --methods {sorted(set(methods) - labels)} are not rows of "
                f"{out} ({sorted(labels)})")


def test_commands_are_found() -> None:
    found = list(benchmark_commands())
    assert len(found) >= 50, f"only {len(found)} benchmark commands found: is the scan broken?"
    multi_line = [c for c in found if "benchmarks/results/idle-2threads-reuse.json" in c.args]
    assert multi_line, "the inline command that runs over a line end was not joined"


# --------------------------------------------------------------------------------------------
# 4. The reproduction tables' verdicts

def _verdict_cells() -> list[tuple[str, list[str], str]]:
    """(where, experiment names, verdict cell) of every README table with a "verdict here"
    column."""
    out = []
    for table in readme_tables():
        if "verdict here" in table.header:
            for line, cells in table.rows:
                names = [n.strip().strip("`") for n in cells[table.header[0]].split(",")]
                out.append((f"README.md:{line}", names, cells["verdict here"]))
    return out


def test_readme_verdicts_match_the_records() -> None:
    records = {p.stem: json.loads(p.read_text(encoding="utf-8"))
               for p in REPRODUCTION.glob("*.json") if "." not in p.stem}
    rows = _verdict_cells()
    assert len(rows) >= 15, "README's experiment tables were not found"
    problems, checked = [], set()
    for where, names, cell in rows:
        shown = re.sub(r"\s*\(.*\)$", "", cell)  # "(supported before …)": history, not verdict
        if not any(n in records for n in names):
            if not shown.startswith("not run"):
                problems.append(f"{where}: {', '.join(names)} shows {cell!r} with no record")
            continue
        parts = [p.strip() for p in shown.split(" / ")]
        want = [records[n]["verdict"] if n in records else "not run" for n in names]
        if parts != want:
            problems.append(f"{where}: verdict of {', '.join(names)}: README {' / '.join(parts)!r}"
                            f", reproduction/*.json {' / '.join(want)!r}")
        checked.update(n for n in names if n in records)
    assert not problems, "\n".join(problems)
    assert checked == set(records) - {"grokking.paper"}, (
        f"recorded experiments missing from README: {sorted(set(records) - checked)}")


def test_resnet18_token_sampling_prose_equals_its_record() -> None:
    """The README's paragraph on ResNet-18 with token sampling timed directly on a Zen 4 EPYC
    quotes its record's seconds and ratios (recomputed from the raw times to precision)."""
    rec = "real-resnet18-256-2threads-zen4-sampling.json"
    text = README.read_text()
    paper = "paper code"  # its faster row, the bf16 one
    for label, shown in (("paper code bf16", "bf16 row ({s} s at one draw per patch)"),
                         ("senslab autocast=bf16", "autocast=torch.bfloat16` {s} s ({r}×)"),
                         ("senslab adaptive uniform sampling autocast=bf16",
                          "under autocast {s} s\n(**{r}× ✗**)"),
                         ("senslab adaptive uniform sampling", "{s} s\n({r}×)")):
        s = f"{_ttp(rec, 'resnet18', label):.1f}"
        r = f"{_vs(rec, 'resnet18', label, paper):.2f}"
        assert shown.format(s=s, r=r) in text, (label, s, r)
