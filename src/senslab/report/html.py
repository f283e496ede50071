"""One self-contained HTML report for runs and experiments.

``report.html`` embeds its plots as base64 ``data:`` URIs and its CSS inline, with no scripts and
no network references, so it can be mailed or archived as a single file. Every string that comes
from a run directory is HTML-escaped: labels and claims are user text.
"""

from __future__ import annotations

import base64
import json
import warnings
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

from senslab.report.aggregate import Stat, final_table, format_number, is_number
from senslab.report.plots import (
    curve_panels,
    has_positions,
    patch_grid,
    plot_curves,
    plot_final_bars,
    plot_position_heatmaps,
    plot_position_profiles,
    plot_scatter,
    position_alignment,
    position_profile,
    written_png,
)
from senslab.report.runs import (
    Experiment,
    PathLike,
    Run,
    RunFormatError,
    as_paths,
    load_all,
)
from senslab.train.rundir import atomic_write_text

# Which final metric the bar chart shows: the first one any run has.
BAR_KEYS = ("sens/train", "sens/val", "bool_sens")
VERDICT_CLASSES = {"supported": "holds", "contradicted": "fails", "inconclusive": "na",
                   "not comparable": "na",
                   # the words of verdicts written before senslab 0.2
                   "holds": "holds", "does not hold": "fails"}

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1100px;
       margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: .2em; } h2 { font-size: 1.25em; margin-top: 1.6em; }
.claim { border-left: 4px solid #888; margin: .6em 0; padding: .3em .9em; background: #f6f6f6; }
.verdict { padding: .6em 1em; border-radius: 6px; margin: .8em 0; border: 1px solid; }
.verdict .word { font-weight: 700; text-transform: uppercase; letter-spacing: .04em; }
.holds { background: #e6f4ea; border-color: #2e7d32; } .holds .word { color: #2e7d32; }
.fails { background: #fdecea; border-color: #c62828; } .fails .word { color: #c62828; }
.na { background: #fff8e1; border-color: #b58900; } .na .word { color: #8a6d00; }
table { border-collapse: collapse; margin: .6em 0; font-size: .9em; }
th, td { padding: .25em .7em; border-bottom: 1px solid #ddd; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th { background: #f0f0f0; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: .85em; color: #555; }
footer { margin-top: 2.5em; font-size: .8em; color: #555; border-top: 1px solid #ddd; }
.note { font-size: .85em; color: #555; }
"""


def _e(value: Any) -> str:
    """HTML-escape any value (quotes too, so it is safe in attributes)."""
    return escape(str(value), quote=True)


def _value_text(value: Any) -> str:
    if isinstance(value, Stat):
        return str(value)
    if is_number(value):
        return format_number(value)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def make_report(
    paths: PathLike | Iterable[PathLike],
    out_dir: PathLike | None = None,
    title: str | None = None,
    *,
    x: str = "epoch",
    logx: bool = False,
    logy: bool | Sequence[str] = False,
    scatter: Sequence[tuple[str, str]] = (),
) -> Path:
    """Write the plots and ``report.html`` for run and/or experiment directories.

    ``out_dir`` defaults to the experiment directory when reporting one experiment, else to the
    first run's directory. Plots: training curves, final sensitivity bars (when a sensitivity was
    logged), per-position profiles (when positions were logged) and one scatter per
    ``(x_key, y_key)`` in ``scatter``; ``x``/``logx``/``logy`` go to
    :func:`~senslab.report.plots.plot_curves`. Returns the path of ``report.html``.
    """
    path_list = as_paths(paths)
    # read as load_runs reads them: runs of other settings apart, a run given twice refused
    experiments, runs = load_all(path_list)
    if not runs:
        raise RunFormatError(
            f"no runs found in {', '.join(map(str, path_list))}; run the experiment first "
            "(an experiment directory lists its runs in experiment.json)"
        )
    if out_dir is None:
        single = len(path_list) == 1 and len(experiments) == 1
        out_dir = experiments[0].path if single else runs[0].path
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    # (png, caption, its bytes), in page order: each figure as this call drew it, as a report
    # writing into the same folder at the same time replaces the files (report.html showed
    # its curves beside this one's table)
    figures: list[tuple[Path, str, bytes]] = []
    if curve_panels(runs):
        png = plot_curves(runs, out / "curves.png", x=x, logx=logx, logy=logy)
        figures.append(
            (
                png,
                "Metrics over training: mean over seeds, band ± std (a single run: "
                "95% interval of its sensitivity estimate). A faded stretch is the mean of "
                "only some of a label's runs (the others stopped earlier).",
                written_png(png),
            )
        )
    bar_key = next((k for k in BAR_KEYS if any(is_number(r.final.get(k)) for r in runs)), None)
    if bar_key is not None:
        png = plot_final_bars(runs, out / "final_sensitivity.png", key=bar_key)
        figures.append((png, f"Final {bar_key} per label, annotated with train accuracy.",
                        written_png(png)))
    if has_positions(runs):
        grid = patch_grid(runs)
        if grid is not None:
            png = plot_position_heatmaps(runs, out / "positions.png")
            figures.append((png, f"Sensitivity per image patch on the {grid[0]}×{grid[1]} "
                                 "patch grid, one panel per model (mean over seeds).",
                            written_png(png)))
        else:
            png = plot_position_profiles(runs, out / "positions.png")
            figures.append((png, f"Sensitivity per token position, {position_alignment(runs)}.",
                            written_png(png)))
    elif any(position_profile(r) is not None for r in runs):
        # every profile null at every position: nothing to draw, but a report without the
        # figure reads as runs that never measured per position
        warnings.warn(f"{out / 'report.html'}: no per-position figure, as every run's "
                      "sens/train_per_position is null at every position (no example reached "
                      "one); track more examples to measure per position", stacklevel=2)
    for i, (xk, yk) in enumerate(scatter):
        png = plot_scatter(runs, xk, yk, out / f"scatter_{i}.png")
        figures.append((png, f"{yk} against {xk}, one point per run.", written_png(png)))

    if title is None:
        title = (
            experiments[0].name if len(experiments) == 1 else f"senslab report: {len(runs)} run(s)"
        )
    page = _render(title, experiments, runs, figures)
    report = out / "report.html"
    # atomic, through a temporary file of this process and thread: a reader never sees half a
    # report, and two reports written at once never share one
    atomic_write_text(report, page)
    return report


def render_html(
    title: str,
    experiments: Sequence[Experiment],
    runs: Sequence[Run],
    figures: Sequence[tuple[Path, str]],
) -> str:
    """The report page as a string (see :func:`make_report`)."""
    return _render(title, experiments, runs,
                   [(path, caption, path.read_bytes()) for path, caption in figures])


def _render(
    title: str,
    experiments: Sequence[Experiment],
    runs: Sequence[Run],
    figures: Sequence[tuple[Path, str, bytes]],
) -> str:
    """:func:`render_html`, with each figure's PNG given as ``(path, caption, bytes)``."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
    ]
    # two experiment directories of one name (dirA/fashion_mnist, dirB/fashion_mnist) had two
    # identical headings: the directory tells their verdicts apart
    names = [exp.name for exp in experiments]
    parts += [_experiment_html(exp, names.count(exp.name) > 1) for exp in experiments]
    parts.append("<h2>Final numbers per label</h2>")
    unfinished = [r for r in runs if not r.finished]
    if unfinished:
        parts.append(
            f'<div class="verdict na"><span class="word">{len(unfinished)} of {len(runs)} '
            "run(s) unfinished</span> (no summary.json: stopped, or still training): "
            f"{_e(', '.join(f'{r.name} ({r.status})' for r in unfinished))}. Their numbers are "
            "the last values they logged; each is shown apart, labelled “(unfinished, step N)”, "
            "not averaged with the finished runs of its label. Re-run the command that trained "
            "them to finish them.</div>"
        )
    parts.append(_table_html(final_table(runs)))
    parts.append(
        '<p class="note">± is the standard deviation over a label\'s seeds; for a '
        "label with a single run, the standard error of its estimate (where logged), marked "
        "“(se)”. "
        "“(k of R runs)”: only k of the label's R runs have that metric, and the number is "
        "over those k; “, m null”: m of the others logged it as null (not known: a NaN or "
        "inf, such as a diverged run's loss, is written as null).</p>"
    )
    parts.append("<details><summary>Per run</summary>")
    parts.append(_table_html(_with_status(final_table(runs, per_run=True), runs)))
    parts.append("</details>")
    if figures:
        parts.append("<h2>Plots</h2>")
    for path, caption, png in figures:
        data = base64.b64encode(png).decode("ascii")
        parts.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{_e(path.stem)}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>"
        )
    parts.append(_footer_html(runs))
    parts.append("</body></html>")
    return "\n".join(parts)


def _experiment_html(exp: Experiment, with_path: bool = False) -> str:
    where = f" <small>({_e(str(exp.path))})</small>" if with_path else ""
    out = [f"<h2>Experiment: {_e(exp.name)}{where}</h2>"]
    if exp.info.get("paper"):
        out.append(f"<p>Paper: {_e(exp.info['paper'])}</p>")
    if exp.claim:
        out.append(f'<blockquote class="claim"><b>Claim.</b> {_e(exp.claim)}</blockquote>')
    v = exp.verdict
    if v is None:
        out.append(
            '<div class="verdict na"><span class="word">not judged yet</span> '
            "(no verdict.json)</div>"
        )
        return "\n".join(out)
    word = str(v.get("verdict", "unknown"))
    caveat = exp.verdict_caveat()
    if caveat is not None:  # verdict.json rests on runs this report does not have
        out.append('<div class="verdict na"><span class="word">Verdict not backed by the runs '
                   f"shown</span><p>{_e(caveat[0].upper() + caveat[1:])}.</p></div>")
    css = "na" if caveat is not None else VERDICT_CLASSES.get(word, "na")
    head = "Verdict (of runs not all here)" if caveat is not None else "Verdict"
    out.append(f'<div class="verdict {css}"><span class="word">{head}: {_e(word)}</span>')
    if v.get("reason"):
        out.append(f"<p>{_e(v['reason'])}</p>")
    effects = v.get("effects") or {}
    if effects:
        out.append(_effects_html(effects, v.get("correction")))
    evidence = v.get("evidence") or {}
    if evidence:
        rows = "".join(
            f'<tr><th>{_e(k)}</th><td class="num">{_e(_value_text(val))}</td></tr>'
            for k, val in evidence.items()
        )
        out.append(f"<details><summary>Evidence (the numbers behind the verdict)</summary>"
                   f"<table>{rows}</table></details>")
    out.append("</div>")
    return "\n".join(out)


def _unit(part: dict[str, Any]) -> str:
    """What one replicate of ``part`` is ("seed", "run", "setting"), by the rule of
    :func:`senslab.verdicts.describe`: its ``unit``, else "run" for a bootstrap over runs (a
    record written before parts had a unit) and "seed" otherwise."""
    return str(part.get("unit") or ("run" if str(part.get("method") or "").startswith("bootstrap")
                                    else "seed"))


def _effects_html(effects: dict[str, Any], correction: str | None) -> str:
    """The claim's parts: each effect (positive = the claimed direction) with its interval, the
    replicates behind it in the part's own unit (``3 seeds``, ``18 runs``, ``4 settings``, as
    the reason's words say; before 2026-12-06 a column "seeds" counted runs and settings too),
    both parts of its uncertainty and its verdict."""
    head = ("<tr><th>part</th><th>effect</th><th>interval</th><th>replicates</th>"
            "<th>s.e. (measurement / between replicates)</th><th>verdict</th></tr>")
    rows = []

    def num(x: Any, fmt: str) -> str:  # None: not known (a NaN before the JSON)
        return "–" if not is_number(x) else format(x, fmt)

    for name, p in effects.items():
        lo, hi = p.get("interval") or [None, None]
        level = p.get("level")
        interval = f"[{num(lo, '+.3g')}, {num(hi, '+.3g')}]" + (
            f" ({100 * level:.4g}%)" if level else "")
        se_parts = " / ".join(num(p.get(k), ".2g") for k in ("se_measure", "se_seed"))
        word = str(p.get("verdict", ""))
        if word == "inconclusive" and p.get("detectable") is not None:
            word += f" (could detect ≥ {abs(p['detectable']):.3g})"
        n = p.get("seeds", 1)
        replicates = f"{n} {_unit(p)}{'s' if n != 1 else ''}"
        rows.append(f"<tr><th>{_e(p.get('what') or name)}</th>"
                    f'<td class="num">{num(p.get("effect"), "+.3g")}</td>'
                    f'<td class="num">{_e(interval)}</td><td class="num">{_e(replicates)}</td>'
                    f'<td class="num">{num(p.get("se"), ".2g")} ({_e(se_parts)})</td>'
                    f"<td>{_e(word)}</td></tr>")
    note = (f'<p class="note">Positive effects are the claimed direction. Multiple parts: '
            f"{_e(correction)}.</p>" if correction else "")
    return f"<table>{head}{''.join(rows)}</table>{note}"


def _with_status(rows: Sequence[dict[str, Any]], runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per-run rows (one per run, in order) with each run's ``status`` after its seed:
    ``finished``, or ``unfinished, step N``."""
    out = []
    for row, run in zip(rows, runs, strict=True):
        head = {k: row[k] for k in ("label", "run", "seed") if k in row}
        out.append({**head, "status": run.status,
                    **{k: v for k, v in row.items() if k not in head}})
    return out


def _table_html(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "<p>(no runs)</p>"
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        for c in columns:
            val = row.get(c)
            text = "–" if val is None else _value_text(val)
            if isinstance(val, list):
                text = ", ".join(str(s) for s in val)
                if c == "seeds":  # how many, then which: "1 (seed 0)", "3 (seeds 0, 1, 2)"
                    text = f"{len(val)} (seed{'s' if len(val) != 1 else ''} {text})"
            tip = ""
            if isinstance(val, Stat) and val.kind:
                what = f"std over {val.n} runs" if val.kind == "std" else "standard error"
                tip = f' title="± is the {what}"'
            cls = ' class="num"' if isinstance(val, Stat) or is_number(val) else ""
            cells.append(f"<td{cls}{tip}>{_e(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _footer_html(runs: Sequence[Run]) -> str:
    """Environment of the runs: every env.json key with its distinct values across runs."""
    from senslab import __version__

    values: dict[str, list[str]] = {}
    for run in runs:
        for key, val in run.env.items():
            text = _value_text(val)
            if text not in values.setdefault(key, []):
                values[key].append(text)
    rows = "".join(
        f"<tr><th>{_e(k)}</th><td>{_e('; '.join(vs))}</td></tr>" for k, vs in values.items()
    )
    env = f"<table>{rows}</table>" if rows else "<p>(no env.json in these runs)</p>"
    return (
        f"<footer><p>Environment of the runs:</p>{env}"
        f"<p>Generated by senslab {_e(__version__)} from run directories only "
        "(nothing was retrained).</p></footer>"
    )
