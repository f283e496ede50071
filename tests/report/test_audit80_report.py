"""Audit 80 of the report: files that are not UTF-8, error bars that cannot be drawn, and
figures of another report embedded in report.html.

* a summary.json or config.json saved in another encoding (a label edited by hand as latin-1),
  or a metrics.jsonl line that is not UTF-8, failed as a bare ``UnicodeDecodeError`` naming
  no file; a torn last line that is not UTF-8 made the whole run unreadable.
* ``plot_final_bars`` drew a label whose spread is NaN or inf (a standard error over a single
  example) as a bar without an error bar, as if it were known exactly, without a word.
* ``make_report`` read its figures back from the folder after drawing them all: a report
  written into the same folder at the same time replaced them in between, and report.html
  showed the other report's figures (or a torn one) beside its own table.

Run directories are written by hand in the format of docs/run-directory.md.
"""

from __future__ import annotations

import base64
import json
import warnings
from pathlib import Path

import pytest

from senslab.report import RunFormatError, load_run, load_runs, make_report, plot_curves
from senslab.report.plots import plot_final_bars


def write_run(path: Path, label: str, seed: int, rows: list[dict], *, finished: bool = True,
              final: dict | None = None) -> Path:
    """A run of ``label`` that logged ``rows``; finished: with summary.json (final = last row,
    plus ``final``)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"name": path.name, "label": label,
                                                  "seed": seed}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (path / "summary.json").write_text(json.dumps({"label": label,
                                                       "final": {**rows[-1], **(final or {})}}))
    return path


ROWS = [{"step": 1, "epoch": 1.0, "train/loss": 1.0}, {"step": 2, "epoch": 2.0, "train/loss": 0.5}]


@pytest.mark.parametrize("name", ["summary.json", "config.json"])
def test_a_file_saved_in_another_encoding_is_an_error_naming_it(tmp_path: Path,
                                                                  name: str) -> None:
    """A label edited by hand and saved as latin-1 failed as "'utf-8' codec can't decode byte
    0xe8", naming no file."""
    run = write_run(tmp_path / "r", "mlp", 0, ROWS)
    data = json.loads((run / name).read_text())
    data["label"] = "modèle"
    (run / name).write_bytes(json.dumps(data, ensure_ascii=False).encode("latin-1"))
    with pytest.raises(RunFormatError, match=rf"{name} is not UTF-8 text .*save it as UTF-8"):
        load_run(run)


def test_a_metrics_line_that_is_not_utf8_is_a_bad_line(tmp_path: Path) -> None:
    """Not UTF-8 in the middle: an error naming the line; as a torn last line of a run that was
    killed: skipped with the warning any torn line gets, the records before it kept (the
    whole run was unreadable)."""
    run = write_run(tmp_path / "mid", "mlp", 0, ROWS, finished=False)
    text = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").write_bytes(text.replace(b'"train/loss": 1.0', b'"tr\xe8in": 1.0'))
    with pytest.raises(RunFormatError, match=r"line 1 is not valid JSON \(not UTF-8 text\)"):
        load_run(run)

    run = write_run(tmp_path / "torn", "mlp", 0, ROWS, finished=False)
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 3, "la\xe8')
    with pytest.warns(UserWarning, match=r"skipping truncated last line 3"):
        loaded = load_run(run)
    assert loaded.series("train/loss") == ([1, 2], [1.0, 2.0], [1.0, 0.5])
    assert loaded.status == "unfinished, step 2"


@pytest.mark.parametrize("se", [float("nan"), float("inf")])
def test_a_bar_whose_spread_cannot_be_drawn_says_so(tmp_path: Path, se: float) -> None:
    """A single run's s.e. of NaN (one example tracked) drew its bar with no error bar, like a
    number known exactly, and said nothing; the bar with a finite s.e. is not named."""
    runs = load_runs([
        write_run(tmp_path / f"m{i}", f"m{i}", 0,
                  [{"step": 1, "epoch": 1.0, "sens/train": 0.3, "sens/train_se": s,
                    "train/acc": 0.9}])
        for i, s in enumerate([se, 0.01])])
    text = "nan" if se != se else "inf"
    with pytest.warns(UserWarning, match=rf"'m0' is 0.3 ± {text} \(se\): a NaN or inf spread "
                                         r"draws no error bar") as record:
        assert plot_final_bars(runs, tmp_path / "bars.png").is_file()
    assert not any("'m1'" in str(w.message) for w in record)


def test_a_report_embeds_its_own_figures_when_another_writes_the_same_folder(
        tmp_path: Path) -> None:
    """report.html read its figures back from the folder after drawing them all: a report
    written into the same folder at the same time (a second `senslab report`, or `senslab run`
    finishing beside a report refreshed in a loop) had replaced them by then, and the page
    showed its curves beside this one's table (8 of 36 figures in 12 rounds of two processes,
    2 of them torn). Here the other report writes curves.png while this one draws its scatter
    (the moment its warning is shown)."""
    paths = [write_run(tmp_path / f"s{s}", "mlp", s,
                       [{"step": 1, "epoch": 1.0, "train/loss": 1.0 - 0.1 * s,
                         **({"test/acc": 0.5} if s else {})}]) for s in range(2)]
    out = tmp_path / "out"
    other = b"\x89PNG\r\n\x1a\n the other report's curves"

    def other_report_writes(*args: object, **kwargs: object) -> None:
        (out / "curves.png").write_bytes(other)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = other_report_writes
        page = make_report(paths, out_dir=out, scatter=[("train/loss", "test/acc")]).read_text()
        own = plot_curves(load_runs(paths), tmp_path / "own.png").read_bytes()
    assert base64.b64encode(other).decode() not in page
    assert base64.b64encode(own).decode() in page
    assert sorted(p.name for p in out.iterdir()) == ["curves.png", "report.html", "scatter_0.png"]
