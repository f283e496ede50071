"""Scale ladders: one experiment run at several scales, its effect followed from rung to rung
(docs/definitions.md#scale-ladders).

An experiment's ladder is data (:attr:`~senslab.experiments.base.Experiment.ladder`, a tuple of
:class:`~senslab.experiments.base.Rung`): each rung is a base scale plus settings overrides,
committed before any of its runs. :func:`run_ladder` trains every CPU rung into
``OUT/<rung name>`` with :func:`~senslab.experiments.base.run_experiment` (so a rung directory is
an ordinary experiment directory: finished runs are reused, interrupted ones resume, and a rung
trained on another machine can be copied in), then :func:`summarize_ladder` reads the rungs'
``verdict.json`` and writes

* ``OUT/ladder.json`` — per rung: its verdict, seeds, runtime, device and every effect with its
  interval, and the command that trains it (with the extra overrides its runs were made
  with); per effect: the verdict at each rung (``no_estimate``: the rungs that judged it without
  a value) and the *trend*, the change of the effect from the lowest to the highest rung that
  measured it, with its own interval (a trend whose two rungs differ in more than their own
  settings — extra overrides, seeds — or rest on one seed's measurement noise says so in its
  ``note`` and in the summary sentence);
* ``OUT/ladder.png`` — each effect with its interval against the rungs, "no value" where a rung
  judged it without one (:func:`plot_ladder`).

A rung that needs a GPU (``cpu=False``) is not run by default; ``ladder.json`` lists its command.

Command: ``senslab run NAME --scale ladder [--rungs a,b] [--out runs/ladder/NAME]``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..train.rundir import RunDir
from ..verdicts import CONTRADICTED, INCONCLUSIVE, SUPPORTED, Effect, fisher_z, plain
from .base import (
    _ABSENT,
    Experiment,
    Rung,
    _run_fields,
    get_experiment,
    listed_runs,
    run_experiment,
    run_seconds,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: the level of a trend's interval (one comparison per effect: no correction)
TREND_LEVEL = 0.95
#: the words a trend is stated in
GROWS, SHRINKS, NO_CLEAR_CHANGE = "grows", "shrinks", "no clear change"
#: the statuses of a rung without a directory of runs (every other status but "done" and
#: "started, …" is a rung that ran and was left out, its status saying why)
NOT_RUN, NEEDS_GPU = "not run", "needs a GPU: not run here"


def select_rungs(exp: Experiment, names: Sequence[str] | None = None) -> list[Rung]:
    """The rungs of ``exp`` named in ``names`` (in ladder order), or every CPU rung. An unknown
    name, or an experiment without a ladder, is a ``ValueError`` that lists what exists."""
    if not exp.ladder:
        from .base import EXPERIMENTS

        have = [n for n in EXPERIMENTS.names() if get_experiment(n).ladder]
        raise ValueError(f"{exp.name} has no scale ladder; experiments with one: "
                         f"{', '.join(have) or 'none'}")
    known = [r.name for r in exp.ladder]
    if names is None:
        return [r for r in exp.ladder if r.cpu]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{exp.name}'s ladder has no rung {unknown[0]!r}; its rungs: "
                         f"{', '.join(known)}")
    return [r for r in exp.ladder if r.name in names]


def run_ladder(name: str, out_dir: str | Path, rungs: Sequence[str] | None = None,
               extra: Sequence[str] = (), progress: bool | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the rungs of experiment ``name``'s ladder (default: every CPU rung) into
    ``out_dir/<rung>``, one after another, then write and return the ladder summary
    (:func:`summarize_ladder`). ``extra`` overrides (e.g. ``data.root=DIR``) follow each rung's
    own. Every rung is prepared before anything trains: its overrides checked, its runs' data
    found and the experiment's own checks passed (:meth:`~senslab.experiments.base.Experiment.
    prepare`), and its runs checked against those its directory already holds."""
    exp = get_experiment(name)
    chosen = select_rungs(exp, rungs)
    _refuse_rung_keys(chosen, extra, exp.ladder, exp)
    out = Path(out_dir)
    for rung in chosen:  # a bad rung fails before any training
        # prepared, not only checked, and its runs checked against those in its directory: a
        # rung whose data is missing (a paper rung's dataset, named with --rungs), that the
        # experiment refuses (data without the target its verdict needs) or whose directory
        # holds runs of other extra overrides failed only once every rung below it had trained
        try:
            _, runs = exp.prepare(rung.scale, [*rung.overrides, *extra])
            exp.check_run_dirs(out / rung.name, runs)
        except Exception:
            log(f"rung {rung.name} is refused (below); no rung was trained")
            raise
    for i, rung in enumerate(chosen, 1):
        log(f"== rung {i}/{len(chosen)}: {rung.name} ({rung.note or rung.scale})")
        try:
            run_experiment(name, out / rung.name, scale=rung.scale,
                           overrides=[*rung.overrides, *extra], progress=progress, log=log)
        except BaseException as err:
            _record_stop(name, out, rung, err, log)
            raise
    return summarize_ladder(name, out)


def _record_stop(name: str, out: Path, rung: Rung, err: BaseException,
                 log: Callable[[str], None]) -> None:
    """After rung ``rung`` failed: ``ladder.json`` (and ``ladder.png``) written again from the
    rungs as they are, with where and why the ladder stopped. An earlier invocation's had stayed,
    read as current (a rung "done" whose verdict this one had set aside, or of other settings)
    until a later run succeeded. Where it cannot be written, the stale one is removed."""
    if not out.is_dir():  # refused before anything was written: no ladder.json to correct
        return
    said = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    stopped = (f"rung {rung.name} failed ({said}); the rungs are as they stood then; the same "
               "command resumes the ladder (finished runs are reused)")
    try:
        summarize_ladder(name, out, stopped=stopped)
    except Exception as also:
        (out / "ladder.json").unlink(missing_ok=True)
        (out / "ladder.png").unlink(missing_ok=True)
        log(f"{out}/ladder.json could not be written after rung {rung.name} failed "
            f"({type(also).__name__}: {also}): removed, not left to be read as current; the "
            "ladder's command writes it again")


def _key(override: str) -> str:
    return override.split("=", 1)[0].strip()


def _changed_fields(exp: Experiment, scale: str, before: Sequence[str], after: Sequence[str]
                    ) -> set[str]:
    """The run-configuration fields (dotted) in which the runs at ``scale`` with overrides
    ``after`` differ from those with ``before``, run by run (by name); empty when either does
    not resolve (the caller's own check names the problem)."""
    try:
        _, old = exp.resolve(scale, list(before))
        _, new = exp.resolve(scale, list(after))
    except (KeyError, TypeError, ValueError):
        return set()
    was = {r.name: _run_fields(r.config) for r in old}
    out: set[str] = set()
    for run in new:
        b = was.get(run.name)
        if b is not None:
            a = _run_fields(run.config)
            out |= {k for k in set(a) | set(b) if a.get(k, _ABSENT) != b.get(k, _ABSENT)}
    return out


def _setters(rungs: Sequence[Rung], override: str, exp: Experiment | None = None,
             on: Sequence[Rung] = ()) -> list[str]:
    """The names of the rungs among ``rungs`` whose own overrides set ``override``'s key or —
    given ``exp`` — change a run-configuration field that ``override`` changes in the rungs
    ``on`` (those it is applied to, on top of their own overrides): the same factor under
    another key (``train.epochs=20`` where a rung sets ``epochs=20``) trained the rungs alike
    while the key test let it pass."""
    changed: set[str] = set()
    if exp is not None:
        for r in on:
            changed |= _changed_fields(exp, r.scale, r.overrides, [*r.overrides, override])
    return [r.name for r in rungs if any(_key(o) == _key(override) for o in r.overrides)
            or (changed and changed & _changed_fields(exp, r.scale, (), r.overrides))]


def _refuse_rung_keys(chosen: Sequence[Rung], extra: Sequence[str],
                      ladder: Sequence[Rung] = (), exp: Experiment | None = None) -> None:
    """Refuse an extra override of a key a rung sets itself: it followed the rung's and won, so
    every rung ran with it while the ladder's record still named the rung's own value (two
    rungs trained alike, read as "no clear change"). A key that only a rung of ``ladder`` not
    chosen sets is refused too: ``--rungs cpu --set steps=N`` trained rung cpu with the factor
    that rung ``longer`` changes, and the ladder read it as rung cpu. Given ``exp``, so is an
    override that changes, in a chosen rung, a run-configuration field that a rung changes,
    under another key (``--set train.epochs=20`` where rung ``longer`` sets ``epochs=20``)."""
    for override in extra:
        setters = _setters(chosen, override) or _setters(ladder, override)
        if setters:
            raise ValueError(
                f"--set {override}: the ladder's rungs set {_key(override)} themselves (rung(s) "
                f"{', '.join(setters)}), and a rung's settings are its protocol; drop it, or run "
                "the experiment at one scale (--scale) with that --set")
        aliases = _setters(ladder, override, exp, chosen)
        if aliases:
            own = "; ".join(f"{r.name}: {' '.join(r.overrides)}" for r in ladder
                            if r.name in aliases)
            raise ValueError(
                f"--set {override}: it changes in the runs what the ladder's rungs set "
                f"themselves under another key (rung(s) {own}), so the rungs would train "
                "alike; a rung's settings are its protocol; drop it, or run the experiment at "
                "one scale (--scale) with that --set")


def _rung_verdict(out: Path, rung: Rung, name: str = "", ladder: Sequence[Rung] = ()
                  ) -> tuple[dict[str, Any] | None, str]:
    """The rung's verdict.json and "" — or None and why it cannot be used: not there, not
    readable, of another experiment (``name``), of another scale or other rung overrides, or
    run with an extra override of a key that a rung of ``ladder`` sets (the ladder's factor
    changed: another rung's protocol, or none, read as this rung's)."""
    path = out / rung.name / "verdict.json"
    if not path.is_file():
        if (out / rung.name / "experiment.json").is_file():
            return None, "started, not finished (the same command resumes it)"
        return None, NOT_RUN if rung.cpu else NEEDS_GPU
    try:
        v = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        # a truncated copy failed the whole summary with a bare JSONDecodeError naming no file
        return None, (f"{path} cannot be read ({type(err).__name__}: {err}): left out; the "
                      "rung's command sets it aside and writes it again (finished runs are "
                      "reused)")
    if not isinstance(v, dict):
        return None, (f"{path} is a JSON {type(v).__name__}, not a verdict: left out; the "
                      "rung's command sets it aside and writes it again")
    if not isinstance(v.get("verdict"), str):
        # a JSON object without a verdict failed the whole summary with a bare KeyError
        return None, (f"{path} holds no verdict (no \"verdict\" word in it): left out; the "
                      "rung's command writes it again (finished runs are reused)")
    held = _experiment_of(out / rung.name)
    if name and held is not None and held != name:
        return None, (f"{out / rung.name} holds the runs of experiment {held!r}, not {name!r}: "
                      "left out (its verdict is another claim's)")
    done = [str(o) for o in v.get("overrides") or []]
    if v.get("scale") != rung.scale or done[:len(rung.overrides)] != list(rung.overrides):
        return None, (f"{path} was run with scale {v.get('scale')!r} and overrides "
                      f"{done}, not the rung's {rung.scale!r} and {list(rung.overrides)}: "
                      "left out")
    # by key, and by the run fields an override changes (the same factor under another key)
    exp = get_experiment(name) if name else None
    clash = {o: by for o in done[len(rung.overrides):]
             if (by := _setters(ladder, o) or _setters(ladder, o, exp, [rung]))}
    if clash:
        said = "; ".join(f"{o} (set by rung(s) {', '.join(by)})" for o, by in clash.items())
        return None, (f"{path} was run with extra overrides of keys the ladder's rungs set "
                      f"themselves: {said}; a rung's settings are its protocol, so these runs "
                      f"are not rung {rung.name}'s: left out (train the rung without them)")
    return v, ""


def _experiment_of(exp_dir: Path) -> str | None:
    """The experiment name ``exp_dir``'s experiment.json gives; None when it names none."""
    try:
        held = json.loads((exp_dir / "experiment.json").read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return held if isinstance(held, str) else None


def _on_fisher_z(e: dict[str, Any]) -> bool:
    """Whether a part was judged on Fisher's z (a correlation: its ``se`` is the s.e. of z)."""
    return e.get("scale") == "fisher_z" or "Fisher's z" in (e.get("method") or "")


def trend(low: dict[str, Any], high: dict[str, Any], level: float = TREND_LEVEL
          ) -> dict[str, Any]:
    """How an effect moves from rung ``low`` to rung ``high`` (effect dicts of two verdicts):
    the difference with a Welch-type interval — s.e. √(s.e.ₗ² + s.e.ₕ²), the smaller of the two
    degrees of freedom (conservative) — and the word: *grows* (the interval lies above zero: the
    effect moves in the claimed direction), *shrinks* (below zero), *no clear change*.

    A correlation judged on Fisher's z (``scale`` ``"fisher_z"``, or a ``method`` that says so:
    its ``se`` is the s.e. of z) is compared on z: the change is z_high − z_low, with
    ``"scale": "fisher_z"`` in the result (a difference of ρ with the s.e. of z gave intervals
    such as [−2.5, +1.37], changes no correlation can make). A correlation judged on z at one
    rung and on ρ at the other has no common scale: no interval."""
    def num(x: Any, missing: float) -> float:  # JSON null: NaN (an effect) or ∞ (normal df)
        return missing if x is None else float(x)

    scale = "effect"
    on_z = (_on_fisher_z(low), _on_fisher_z(high))
    if all(on_z):
        scale = "fisher_z"

        def value(e: dict[str, Any]) -> float:
            return num(e.get("z"), math.nan) if e.get("z") is not None \
                else fisher_z(num(e.get("effect"), math.nan))

        diff = value(high) - value(low)
    else:
        diff = num(high.get("effect"), math.nan) - num(low.get("effect"), math.nan)
    se = math.hypot(num(low.get("se"), math.nan), num(high.get("se"), math.nan))
    df = min(num(low.get("df"), math.inf), num(high.get("df"), math.inf))
    out: dict[str, Any] = {"change": diff, "se": se, "df": df, "interval": None,
                           "word": NO_CLEAR_CHANGE, "level": level}
    if scale == "fisher_z":
        out["scale"] = scale
    if any(on_z) and not all(on_z):
        out["note"] = ("one rung judged the correlation on Fisher's z, the other on ρ: no common "
                       "scale")
        return out
    if not (math.isfinite(diff) and math.isfinite(se) and df >= 1):
        if not math.isfinite(diff):
            out["note"] = "a rung has no value for the effect (not estimable)"
        elif not math.isfinite(se):
            out["note"] = ("a rung's effect has no standard error: one seed without a "
                           "measurement error, or one that could not be estimated")
        return out
    if se == 0:
        # verdicts written before 2026-12-04 could hold an s.e. of 0 at both rungs: a
        # zero-width interval read any change, 1e-7 included, as "grows"
        out["note"] = ("neither rung's effect has a standard error above 0 (an exact value, "
                       "which no handful of runs can show): no interval")
        return out
    lo, hi = Effect(diff, se, df).interval(1 - level)
    out.update(interval=[lo, hi], word=GROWS if lo > 0 else SHRINKS if hi < 0 else NO_CLEAR_CHANGE)
    return out


def runs_seconds(exp_dir: str | Path) -> float | None:
    """The summed training time of the runs an experiment directory's experiment.json lists
    (each run's ``summary.json`` ``seconds``: wall clock over every sitting that trained it;
    runs of other settings left in the directory are not counted), or None when none records
    one. A rung resumed over several sittings, or with runs trained in a side process, has a
    verdict runtime of its last sitting only; this is what its runs cost."""
    found = run_seconds(exp_dir, listed_runs(exp_dir))
    return round(sum(found.values()), 1) if found else None


def summarize_ladder(name: str, out_dir: str | Path, stopped: str = "") -> dict[str, Any]:
    """Read every rung's verdict.json below ``out_dir``, write ``ladder.json`` and
    ``ladder.png`` there, and return the summary (see the module docstring). ``stopped``: why
    :func:`run_ladder` stopped before its last rung (kept as ``stopped`` and said at the end of
    the summary sentence)."""
    exp = get_experiment(name)
    if not exp.ladder:
        select_rungs(exp)  # the error naming experiments with a ladder
    out = Path(out_dir)
    rows = []
    for rung in exp.ladder:
        v, why = _rung_verdict(out, rung, name, exp.ladder)
        # a finished rung's command is the one that made its runs, extra overrides included
        extra = [] if v is None else [str(o) for o in v.get("overrides") or []][
            len(rung.overrides):]
        row: dict[str, Any] = {"rung": rung.name, "scale": rung.scale, "size": rung.size,
                               "note": rung.note, "overrides": list(rung.overrides),
                               "cpu": rung.cpu,
                               "command": rung.command(name, str(out / rung.name), extra)}
        if v is None:
            row["status"] = why
        else:
            row.update(status="done", verdict=v["verdict"], reason=v.get("reason", ""),
                       extra_overrides=extra,
                       seeds=v.get("seeds"), runtime_s=v.get("runtime_s"),
                       run_seconds=runs_seconds(out / rung.name),
                       device=v.get("device"), threads=v.get("threads"),
                       effects=v.get("effects") or {})
        rows.append(row)
    per_effect = ladder_effects(rows, exp.ladder_effects)
    summary = {"name": name, "claim": exp.claim, "rungs": rows, "effects": per_effect,
               "summary": ladder_sentence(rows, per_effect)}
    if stopped:
        summary.update(stopped=stopped, summary=f"{summary['summary']}. Stopped: {stopped}")
    summary = plain(summary)
    rd = RunDir(out, kind="experiment")
    rd.write_json("ladder.json", summary)
    plot_ladder(summary, out / "ladder.png")
    return summary


def ladder_effects(rows: list[dict[str, Any]], only: Iterable[str] | None = None
                   ) -> dict[str, Any]:
    """Each part of the rung rows that ran (those in ``only``, where given: the experiment's
    ``ladder_effects``), in the order the rungs first judge them: its verdict at every rung row
    that judged it, and its trend from the lowest such rung with a value to the highest
    (:func:`trend`, with what the two rungs do not hold equal).

    A rung that judged the part without a finite value (NaN, JSON null: it could not be
    estimated) cannot be an end of the trend; it keeps its verdict in ``at`` and is listed in
    ``no_estimate`` (left out without a word, a trend "from cpu to plateau" read as the whole
    ladder's when the highest rung had no value)."""
    keep = None if only is None else set(only)
    parts = dict.fromkeys(part for r in rows if r.get("status") == "done"
                          for part in r.get("effects") or {} if keep is None or part in keep)
    per_effect = {}
    for part in parts:
        judged = [(r["rung"], r["effects"][part]) for r in rows
                  if r.get("status") == "done" and part in (r.get("effects") or {})]
        pts = [(rung, e) for rung, e in judged if _finite(e.get("effect"))]
        blank = [rung for rung, e in judged if not _finite(e.get("effect"))]
        entry: dict[str, Any] = {"at": {rung: e.get("verdict") for rung, e in judged}}
        if blank:
            entry["no_estimate"] = blank
        if len(pts) >= 2:
            t = trend(pts[0][1], pts[-1][1])
            by_rung = {r["rung"]: r for r in rows}
            unlike = _unlike(by_rung[pts[0][0]], by_rung[pts[-1][0]], pts[0][1], pts[-1][1])
            if unlike:
                t["note"] = "; ".join([t["note"], unlike] if t.get("note") else [unlike])
            entry["trend"] = {"from": pts[0][0], "to": pts[-1][0], **t}
        per_effect[part] = entry
    return per_effect


def _finite(x: Any) -> bool:
    """Whether ``x`` is a finite number (a verdict's JSON holds NaN and ±∞ as null)."""
    return isinstance(x, int | float) and math.isfinite(x)


def _unlike(low: dict[str, Any], high: dict[str, Any], e_low: dict[str, Any],
            e_high: dict[str, Any]) -> str:
    """What the trend from rung row ``low`` to rung row ``high`` (effects ``e_low``,
    ``e_high``) does not hold equal besides the rungs' own settings, in words; "" when nothing.

    Rungs trained in separate invocations may carry different extra overrides (``--set
    seeds=3`` at one only, a quick ``train.epochs=1`` left in a directory): the change then
    mixes that difference into the scale's. One seed at a rung gives an interval of
    measurement noise alone, without the seed-to-seed variation the other rung's may hold."""
    said = []
    a, b = low.get("extra_overrides") or [], high.get("extra_overrides") or []
    if a != b:
        said.append(f"{low['rung']} ran with extra overrides {a} and {high['rung']} with {b}, "
                    "so the change is not the rungs' alone")
    if low.get("seeds") != high.get("seeds"):
        said.append(f"{low['rung']} has {low.get('seeds')} seed(s) and {high['rung']} "
                    f"{high.get('seeds')}")
    for row, e in ((low, e_low), (high, e_high)):
        if (e.get("seeds") == 1 and str(e.get("method") or "").startswith("measurement")
                and e.get("se") is not None):
            unit = e.get("unit") or "seed"
            said.append(f"{row['rung']} has one {unit}: its part of the interval is measurement "
                        f"noise only, no {unit}-to-{unit} variation")
    return "; ".join(said)


def ladder_sentence(rows: list[dict[str, Any]], per_effect: dict[str, Any]) -> str:
    """One sentence per ladder: the verdict at each rung that ran, then each effect's trend
    (one without an interval too, with why), the rungs that judged a part without a value, and
    the rungs not finished, left out (run, with a verdict that cannot be used) or not run."""
    done = [r for r in rows if r.get("status") == "done"]
    if all(_state(r) == "not run" for r in rows):
        return "no rung has run yet"
    by_word: dict[str, list[str]] = {}
    for r in done:
        by_word.setdefault(r["verdict"], []).append(r["rung"])
    # rungs started or left out, none done: said as such, not "no rung has run yet"
    text = "; ".join(f"{w} at {', '.join(rs)}" for w, rs in by_word.items()) \
        or "no rung has a verdict yet"
    trends, blank = [], []
    for part, e in per_effect.items():
        t = e.get("trend")
        on = " in atanh ρ" if t and t.get("scale") == "fisher_z" else ""
        note = f"; {t['note']}" if t and t.get("note") else ""
        if t and t.get("interval"):
            lo, hi = t["interval"]
            trends.append(f"{part} {t['word']} from {t['from']} to {t['to']} "
                          f"({t['change']:+.3g} [{lo:+.3g}, {hi:+.3g}]{on}{note})")
        elif t:  # said too: a trend left out read as a ladder that did not measure the part
            change = t.get("change")
            value = f"{change:+.3g}{on}, " if _finite(change) else ""
            why = (t.get("note") or "").removesuffix(": no interval")
            trends.append(f"{part} from {t['from']} to {t['to']}: {value}no interval"
                          + (f" ({why})" if why else ""))
        if e.get("no_estimate"):
            blank.append(f"{part} at {', '.join(e['no_estimate'])}")
    if trends:
        text += ". As scale grows: " + "; ".join(trends)
    if blank:
        text += f". No value (not estimable): {'; '.join(blank)}"
    started = [r["rung"] for r in rows if _state(r) == "not finished"]
    missing = [r["rung"] for r in rows if _state(r) == "not run"]
    # a rung whose verdict was left out (damaged, another experiment's, other settings) ran:
    # "Not run" had said it of a rung whose runs sit in its directory
    left = [r["rung"] for r in rows if _state(r) == "left out"]
    if started:
        text += f". Not finished: {', '.join(started)}"
    if left:
        text += f". Left out (run, but its verdict cannot be used; its status says why): " \
                f"{', '.join(left)}"
    if missing:
        text += f". Not run: {', '.join(missing)}"
    return text


def _state(row: dict[str, Any]) -> str:
    """A rung row in a word: ``done``, ``not finished`` (started, no verdict yet), ``not run``
    (no run directory, or a GPU rung) or ``left out`` (a verdict that cannot be used)."""
    status = row.get("status", "")
    if status == "done":
        return "done"
    if status.startswith("started"):
        return "not finished"
    return "not run" if status in (NOT_RUN, NEEDS_GPU) else "left out"


def _human(x: float) -> str:
    """4.74e6 → "4.7M", 150000 → "150k", 40 → "40"."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2g}{unit}"
    return f"{x:.3g}"


#: one marker per effect (the colour is the verdict), distinct for up to 15 effects
_MARKERS = "os^vD<>pPX*hH8d"
_COLORS = {SUPPORTED: "#1a7f37", CONTRADICTED: "#cf222e", INCONCLUSIVE: "#9a6700"}


def plot_ladder(summary: dict[str, Any], out: str | Path) -> Path:
    """Write :func:`ladder_figure` of ``summary`` to the PNG file ``out``; returns ``out``."""
    import matplotlib

    from ..report.plots import STYLE, _save

    with matplotlib.rc_context(STYLE):
        return _save(ladder_figure(summary), out)


def ladder_figure(summary: dict[str, Any]) -> Figure:
    """Each effect of ``summary`` (a :func:`summarize_ladder` result) with its interval at
    every rung that measured it, rungs in ladder order on the x axis; the marker's colour is
    that rung's verdict on the part (green supported, red contradicted, amber inconclusive). A
    rung that judged a part without a value (``no_estimate``) is marked "no value" where its
    point would be: left blank, it read as a rung that was not run."""
    import matplotlib
    from matplotlib.lines import Line2D

    from ..report.plots import STYLE, _figure

    rows = summary["rungs"]
    xs = {r["rung"]: i for i, r in enumerate(rows)}
    parts = list(summary["effects"])
    with matplotlib.rc_context(STYLE):
        fig = _figure(max(4.8, 1.3 * len(rows) + 2.4), 3.4)
        ax = fig.subplots()
        ax.axhline(0, color="0.4", lw=0.8)
        width = 0.5 / max(1, len(parts))
        blank: list[tuple[float, str]] = []  # (x, part) of a part judged without a value
        for k, part in enumerate(parts):
            offset = (k - (len(parts) - 1) / 2) * width
            px, py, lo, hi, cols = [], [], [], [], []
            for r in rows:
                e = (r.get("effects") or {}).get(part)
                if r.get("status") != "done" or not e:
                    continue
                if not _finite(e.get("effect")):
                    blank.append((xs[r["rung"]] + offset, part))
                    continue
                iv = e.get("interval") or [None, None]
                if None in iv:  # one seed: no interval over seeds (drawn without a bar)
                    iv = [e["effect"], e["effect"]]
                px.append(xs[r["rung"]] + offset)
                py.append(e["effect"])
                lo.append(e["effect"] - iv[0])
                hi.append(iv[1] - e["effect"])
                cols.append(_COLORS.get(e.get("verdict"), "0.5"))
            if not px:
                continue
            ax.plot(px, py, color="0.6", lw=0.8, zorder=1)
            ax.errorbar(px, py, yerr=[lo, hi], fmt="none", ecolor="0.3", elinewidth=1,
                        capsize=3, zorder=2)
            ax.scatter(px, py, c=cols, marker=_MARKERS[k % len(_MARKERS)], s=36, zorder=3,
                       label=part, edgecolors="0.2", linewidths=0.5)
        for x, part in blank:  # x in data, y in axes units: at the foot, whatever the scale
            ax.text(x, 0.03, f"{part}: no value" if len(parts) > 1 else "no value",
                    transform=ax.get_xaxis_transform(), rotation=90, ha="center",
                    va="bottom", fontsize=7, color="0.3")
        labels = [r["rung"] + (f"\n{_human(r['size'])}" if r.get("size") else "")
                  + f"\n({r['verdict'] if r.get('status') == 'done' else _state(r)})"
                  for r in rows]
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.set_xlim(-0.6, len(rows) - 0.4)
        ax.set_ylabel("effect (claimed direction > 0)")
        handles = [Line2D([], [], ls="", marker=_MARKERS[k % len(_MARKERS)], color="0.5", label=p)
                   for k, p in enumerate(parts)]
        handles += [Line2D([], [], ls="", marker="o", color=c, label=w)
                    for w, c in _COLORS.items()]
        fig.legend(handles=handles, loc="outside right upper", fontsize=7)
        ax.set_title(f"{summary['name']}: effect vs scale\n95% intervals (with several parts, "
                     "wider by Holm)", fontsize=9)
        return fig
