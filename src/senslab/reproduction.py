"""REPRODUCTION.md: one row per registered experiment, generated from recorded results.

Two steps, both done by ``senslab reproduction``:

1. **record** — for every experiment directory given (default: ``runs/<name>`` for every
   registered experiment), read ``experiment.json`` and ``verdict.json``, check that every run
   it lists finished and that their summaries still give that verdict (:func:`check_verdict`),
   and write a small record ``reproduction/<name>.json`` (claim, scale, verdict, reason, runtime,
   overrides, commit). The records are committed, so the table survives without the
   (git-ignored) run directories.
2. **render** — write REPRODUCTION.md from all records plus the experiment registry: an
   experiment without a record gets a row that says it was not run here and why (``requires``),
   with its :attr:`~senslab.experiments.base.Experiment.runtime_estimate` if it has one.

Nothing is typed by hand: the result column is the verdict's ``reason`` sentence, which every
experiment computes from its measured numbers, and the runtime column is the record's
``runtime_s`` (:func:`format_runtime`).

A record carries ``"schema"``, the version of its format (:data:`RECORD_SCHEMA`). A record
without it was written before the field existed and has the same fields (schema 1); a record of
a newer schema than this code knows is refused. Schema 2 adds the verdict's ``effects`` (each
part of the claim with its interval: :mod:`senslab.verdicts`), ``seeds`` and ``device``, and
records paper-scale runs too (``reproduction/<name>.paper.json``); schema-1 records carry the
two-way words of earlier verdicts ("holds", "does not hold") and are shown as they are.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import uuid
from pathlib import Path
from typing import Any

from .experiments import get_experiment, list_experiments
from .verdicts import UNPAIRED, WORDS, Effect, describe, judge, plain

RECORD_KEYS = ("verdict", "reason", "runtime_s", "overrides", "finished", "commit",
               "run_commits", "threads", "effects", "correction", "seeds", "device")
#: the format of ``reproduction/<name>.json`` this code writes and reads
RECORD_SCHEMA = 2
#: the scales REPRODUCTION.md shows, in row order
RECORD_SCALES = ("cpu", "paper")
#: how many parts of a claim the effect column lists before "… and N more"
SHOWN_PARTS = 4


def record_ladder(ladder_dir: str | Path, records: str | Path = "reproduction") -> Path:
    """Write ``records/ladders/<name>.json`` (and ``<name>.png``, the effect-vs-scale plot)
    from a ladder directory (``senslab run NAME --scale ladder``; it holds ``ladder.json``),
    re-summarised from its rungs' verdicts, and return the record's path."""
    from .experiments.ladder import summarize_ladder

    ladder_dir = Path(ladder_dir)
    name = ladder_name(ladder_dir)
    if name is None:
        raise FileNotFoundError(f"{ladder_dir} is no ladder directory (no ladder.json, and no "
                                "rung directory of an experiment's ladder)")
    summary = summarize_ladder(name, ladder_dir)
    # every rung's verdict checked against its runs, as a single experiment's record is: a
    # rung whose runs were removed or edited was recorded under the verdict they no longer give
    for row in summary["rungs"]:
        if row.get("status") == "done":
            rung_dir = ladder_dir / row["rung"]
            listed = _read_object(rung_dir / "experiment.json", "restore it (it names the "
                                  "experiment and lists the runs the rung's verdict rests on), "
                                  "or run the rung again into a new directory").get("runs", [])
            check_verdict(rung_dir, name, row["scale"], [str(r) for r in listed],
                          _read_object(rung_dir / "verdict.json", f"re-run the rung "
                                       f"(`{row['command']}`: a damaged verdict.json is set "
                                       "aside and the verdict computed again from the finished "
                                       "runs), then record"))
    out = Path(records) / "ladders" / f"{summary['name']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for row in summary["rungs"]:  # the command as a user types it, not this machine's path
        row["command"] = row["command"].replace(str(ladder_dir), f"runs/ladder/{name}")
    rec = {"schema": RECORD_SCHEMA, **summary}
    _write_whole(out, json.dumps(rec, indent=2, sort_keys=True) + "\n")
    if (ladder_dir / "ladder.png").is_file():
        shutil.copyfile(ladder_dir / "ladder.png", out.with_suffix(".png"))
    return out


def ladder_name(ladder_dir: Path) -> str | None:
    """The experiment a ladder directory belongs to: from its ladder.json, or — for a ladder
    still running, which writes ladder.json only when its command ends — from its rung
    directories, when they all name one registered experiment and are rungs of its ladder. A
    damaged ladder.json (cut short, edited: it failed as a bare "name", or as a JSON error naming
    no file) is read past to the rung directories — recording writes it again from them — and is
    an error naming it where they name none."""
    summary = ladder_dir / "ladder.json"
    if not summary.is_file():
        return _rung_experiment(ladder_dir)
    try:
        held = json.loads(summary.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        held, why = None, f"not valid JSON: {err}"
    else:
        why = "it names no experiment ('name')"
    name = held.get("name") if isinstance(held, dict) else None
    if isinstance(name, str):
        return name
    from_rungs = _rung_experiment(ladder_dir)
    if from_rungs is None:
        raise ValueError(f"{summary} is damaged ({why}), and no rung directory beside it names "
                         "the experiment; restore it, or re-run the ladder's command (`senslab "
                         f"run NAME --scale ladder --out {ladder_dir}`: finished rungs are "
                         "reused), which writes it again")
    return from_rungs


def _rung_experiment(ladder_dir: Path) -> str | None:
    """The registered experiment whose ladder ``ladder_dir``'s rung directories are the rungs
    of, by their experiment.json (all of them naming one), or None."""
    names = set()
    for exp_file in sorted(ladder_dir.glob("*/experiment.json")):
        try:
            name = json.loads(exp_file.read_text())["name"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if name not in list_experiments():
            return None
        if exp_file.parent.name not in {r.name for r in get_experiment(name).ladder}:
            return None
        names.add(name)
    return names.pop() if len(names) == 1 else None


def _read_record(path: Path) -> Any:
    """The JSON of record ``path``; damaged JSON is an error that names the file and the fix."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err.msg}, line {err.lineno}); restore "
                         "it from git, or re-record it with `senslab reproduction DIR`") from None


def load_ladders(records: str | Path = "reproduction") -> dict[str, dict[str, Any]]:
    """The ladder records in ``records/ladders``, keyed by experiment name."""
    out = {}
    for path in sorted((Path(records) / "ladders").glob("*.json")):
        rec = _read_record(path)
        if not isinstance(rec, dict) or "name" not in rec or "rungs" not in rec:
            raise ValueError(f"{path} is not a ladder record (no 'name' or 'rungs'); restore it "
                             "from git, or re-record it with `senslab reproduction LADDER_DIR`")
        _check_schema(path, rec.get("schema", 1))
        out[rec["name"]] = rec
    return out


def render_ladders(ladders: dict[str, dict[str, Any]]) -> list[str]:
    """The "Scale ladders" section of REPRODUCTION.md: per ladder, one row per rung with its
    verdict, seeds and effects, the trend sentence and the effect-vs-scale plot."""
    if not ladders:
        return []
    lines = ["", "## Scale ladders", "",
             "Each ladder runs one experiment at growing scale, every rung with the same seeds "
             "and verdict rule, committed before its runs "
             "([docs/definitions.md](docs/definitions.md#scale-ladders)); `senslab run NAME "
             "--scale ladder`. A trend is the change of an effect from the lowest to the highest "
             "rung that measured it, with its 95% interval. A rung trained over several "
             "sittings (resumed, or with runs trained in a side process) shows its last "
             "sitting's wall time and, in brackets, its runs' summed training time (wall "
             "clock, pauses included)."]
    for name, lad in ladders.items():
        lines += ["", f"### `{name}`", "", f"{_cell(lad.get('summary', ''))}.", "",
                  "| rung | size | what it changes | seeds | effect [interval] | runtime | "
                  "device | verdict |", "|---|---|---|---|---|---|---|---|"]
        for row in lad["rungs"]:
            size = f"{row['size']:.3g}" if row.get("size") else "—"
            if row.get("status") != "done":
                how = row["status"] + ("" if row.get("cpu", True)
                                       else f"; `{row['command']}`")
                lines.append(f"| {row['rung']} | {size} | {_cell(row.get('note', ''))} | — | "
                             f"{_cell(how)} | — | — | not run |")
                continue
            # a rung's note is its protocol; extra overrides its runs were made with (a data
            # root, fewer seeds, a smaller evaluation) changed it, which the row did not say
            note = row.get("note", "")
            if row.get("extra_overrides"):
                note += " (run with " + " ".join(f"`--set {o}`"
                                                 for o in row["extra_overrides"]) + ")"
            device = row.get("device") or "—"
            if row.get("threads"):
                device += f", {row['threads']} thread{'s' if row['threads'] != 1 else ''}"
            lines.append(
                f"| {row['rung']} | {size} | {_cell(note)} | "
                f"{seeds_cell(row)} | {_cell(effect_cell(row, why=True))} | "
                f"{rung_runtime(row)} | {_cell(device)} | "
                f"**{row['verdict']}**{rejudged(row)} |")
        lines += ["", f"![{name}: effect vs scale](reproduction/ladders/{name}.png)"]
    return lines


def record(exp_dir: str | Path, records: str | Path = "reproduction") -> Path:
    """Write ``records/<name>.json`` from one finished experiment directory and return its path.

    A CPU-scale run is recorded as ``<name>.json``, a paper-scale one as ``<name>.paper.json``;
    an unfinished directory (no verdict.json, or a listed run without summary.json), another
    scale, an unregistered name or a verdict.json its runs no longer give
    (:func:`check_verdict`) is an error that says which.
    """
    exp_dir = Path(exp_dir)
    if not (exp_dir / "experiment.json").is_file() and ladder_name(exp_dir) is not None:
        return record_ladder(exp_dir, records)  # a ladder (finished, or still running)
    exp_file, verdict_file = exp_dir / "experiment.json", exp_dir / "verdict.json"
    if not exp_file.is_file():
        raise FileNotFoundError(f"{exp_dir} is not an experiment directory (no experiment.json); "
                                "create one with `senslab run NAME --out DIR`")
    if not verdict_file.is_file():
        raise FileNotFoundError(f"{exp_dir} has no verdict.json: the experiment did not finish; "
                                f"re-run `senslab run NAME --out {exp_dir}` (finished runs are "
                                "reused)")
    from .train.rundir import RunDir

    RunDir(exp_dir, kind="experiment").check_readable()  # a newer format is refused, as report does
    exp = _read_object(exp_file, "restore it (it names the experiment and lists the runs its "
                                 "verdict rests on), or re-run the experiment into a new --out")
    name = exp.get("name")
    verdict = _read_object(verdict_file, f"re-run `senslab run {name or 'NAME'} --out "
                                         f"{exp_dir}` with the settings it ran with (a damaged "
                                         "verdict.json is set aside and the verdict computed "
                                         "again from the finished runs), then record")
    if name not in list_experiments():
        raise KeyError(f"{exp_dir}: experiment {name!r} is not registered "
                       f"(known: {', '.join(list_experiments())})")
    scale = verdict.get("scale", exp.get("scale", "cpu"))
    if scale not in RECORD_SCALES:
        raise ValueError(f"{exp_dir} was run at scale {scale!r}; REPRODUCTION.md records the "
                         f"scales {', '.join(RECORD_SCALES)}")
    check_verdict(exp_dir, name, scale, [str(r) for r in exp.get("runs", [])], verdict)
    rec: dict[str, Any] = {"name": name, "scale": scale, "runs": len(exp.get("runs", [])),
                           "schema": RECORD_SCHEMA}
    rec.update({k: verdict[k] for k in RECORD_KEYS if k in verdict})
    out = Path(records) / (f"{name}.json" if scale == "cpu" else f"{name}.{scale}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_whole(out, json.dumps(rec, indent=2, sort_keys=True) + "\n")
    return out


def _read_object(path: Path, fix: str) -> dict[str, Any]:
    """The JSON object in ``path`` (an experiment directory's experiment.json or verdict.json);
    a damaged file (not JSON, or not an object: cut short by a full disk, edited by hand) is a
    ValueError that names it and ``fix``, where it was a JSONDecodeError naming no file or an
    AttributeError."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        why = (f"not valid JSON ({err.msg}, line {err.lineno})"
               if isinstance(err, json.JSONDecodeError) else f"not UTF-8 text ({err.reason})")
        raise ValueError(f"{path} is {why}: it cannot be recorded; {fix}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is a JSON {type(data).__name__}, not an object: it cannot be "
                         f"recorded; {fix}")
    return data


def _write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole: into a temporary file of this writer's own, then
    renamed over ``path``. One shared temporary name (``<name>.json.tmp``) let two writers at
    once (two ``senslab reproduction`` runs, or a record and a render) truncate each other's
    file and rename it away: the later writer failed with a bare FileNotFoundError, and a reader
    could find the record half written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # left behind only by a failed write or rename


def check_verdict(exp_dir: Path, name: str, scale: str, runs: list[str],
                  verdict: dict[str, Any]) -> None:
    """Refuse to record ``verdict`` (verdict.json of ``exp_dir``) unless every run experiment.json
    lists has finished and the runs' summaries still give that verdict: its word, effects and
    reason are recomputed as ``senslab run`` computes them (each run's ``info`` and :meth:`~senslab.
    experiments.base.Experiment.after_run` measurements, cached in its run directory, then the
    experiment's own verdict). A record rests on those runs; a removed, unfinished or edited run
    would otherwise be recorded under the verdict of runs that are gone."""
    from .experiments.base import load_summaries
    from .verdicts import plain

    overrides = [str(o) for o in verdict.get("overrides") or []]
    again = f"senslab run {name}" + (f" --scale {scale}" if scale != "cpu" else "") + "".join(
        f" --set {shlex.quote(o)}" for o in overrides) + f" --out {shlex.quote(str(exp_dir))}"
    missing = [r for r in runs if not (exp_dir / r / "summary.json").is_file()]
    if missing:
        raise FileNotFoundError(
            f"{exp_dir}: {len(missing)} of the {len(runs)} runs its experiment.json lists have "
            f"no summary.json (missing or unfinished): {', '.join(missing)}; the verdict cannot "
            f"rest on them. Resume them with `{again}` (finished runs are reused), then record")
    exp = get_experiment(name)
    try:
        settings, built = exp.resolve(scale, overrides)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{exp_dir}: verdict.json cannot be checked against its runs: its "
                         f"settings (scale {scale}, overrides {overrides}) no longer resolve: "
                         f"{err}") from None
    by_name = {r.name: r for r in built}
    if sorted(by_name) != sorted(runs):
        raise ValueError(f"verdict.json is stale: {exp_dir}'s experiment.json lists the runs "
                         f"{', '.join(runs)}, but {name} at these settings now has "
                         f"{', '.join(by_name)}; re-run `{again}`")
    summaries = []
    for r, summary in zip(runs, load_summaries(exp_dir), strict=True):
        summary = {**summary, **by_name[r].info}
        summaries.append(exp.after_run(by_name[r], exp_dir / r, summary, settings,
                                       lambda _: None))
    if settings.seeds > 1 and not exp.seed_aware:  # as run_experiment: not read from one seed
        fresh: dict[str, Any] = {"verdict": "not comparable"}
    else:
        fresh = json.loads(json.dumps(plain(exp.verdict(summaries))))  # as verdict.json reads
    diffs = []
    if fresh.get("verdict") != verdict.get("verdict"):
        diffs.append(f"verdict: recorded {verdict.get('verdict')!r}, its runs give "
                     f"{fresh.get('verdict')!r}")
    mine, theirs = verdict.get("effects") or {}, fresh.get("effects") or {}
    for part in sorted(set(mine) | set(theirs), key=str):  # one line per part of the claim
        if part not in mine or part not in theirs:
            a, b = (_interval(e[part]) if isinstance(e.get(part), dict) else "absent"
                    for e in (mine, theirs))
            diffs.append(f"{part!r}: recorded {a}, its runs give {b}")
        else:
            diffs.extend(_differences(mine[part], theirs[part], repr(part)))
    # the reason is REPRODUCTION.md's result column: with only the word and effects compared,
    # its numbers beyond the effects (the evidence, a failed precondition's measurements) were
    # recorded as some earlier runs gave them, not as these runs do
    said, given = str(verdict.get("reason")), fresh.get("reason")
    if isinstance(given, str) and given != said:
        i = next((i for i, (a, b) in enumerate(zip(said, given, strict=False)) if a != b),
                 min(len(said), len(given)))
        lo = max(0, i - 30)
        diffs.append(f"reason: recorded '…{said[lo:i + 30]}…', its runs give "
                     f"'…{given[lo:i + 30]}…'")
    if diffs:
        raise ValueError(f"verdict.json is stale: {exp_dir}'s runs no longer give it ("
                         f"{'; '.join(diffs[:4])}{'; …' if len(diffs) > 4 else ''}); re-run "
                         f"`{again}` (finished runs are reused) to write their verdict, then "
                         "record")
    _check_run_configs(exp_dir, name, scale, overrides, runs, by_name)


def _check_run_configs(exp_dir: Path, name: str, scale: str, overrides: list[str],
                       runs: list[str], by_name: dict[str, Any]) -> None:
    """Refuse runs that ``senslab run`` would not reuse as the runs of these settings: each run's
    trainer ``check_dir`` (a run of another configuration under the same name, a summary its
    metric log contradicts). The experiment's spec changed since they trained (a scale's default,
    a run's field): their verdict is the earlier spec's, and the record would show it in the row
    of the current one. A run without config.json (made by hand) or whose dataset this machine
    lacks (the configuration cannot be completed to compare) is not compared."""
    from .data import DataUnavailableError
    from .train.trainers import get_trainer

    for r in runs:
        check = get_trainer(by_name[r].trainer).check_dir
        if check is None or not (exp_dir / r / "config.json").is_file():
            continue
        try:
            check(by_name[r].config, exp_dir / r)
        except DataUnavailableError:
            continue
        except ValueError as err:
            fresh = (f"senslab run {name}" + (f" --scale {scale}" if scale != "cpu" else "")
                     + "".join(f" --set {shlex.quote(o)}" for o in overrides)
                     + " --out NEW_DIR")
            raise ValueError(
                f"verdict.json is stale: `senslab run` would not reuse its run {r} as the run "
                f"{name} trains at its settings (scale {scale}, overrides {overrides}) now, so "
                f"the verdict is not the current experiment's: {err}. Train the runs again "
                f"(`{fresh}`), then record") from None


def _differences(recorded: Any, fresh: Any, where: str) -> list[str]:
    """Where ``recorded`` and ``fresh`` (JSON values) differ, as ``"where.key: recorded a, its
    runs give b"``; numbers equal to 1e-9 (relative) are the same.

    The recorded keys are compared. A key only ``fresh`` holds is not: a verdict written before
    an effect gained a field (``rho``'s ``scale`` and ``z``) is not stale for it. A recorded
    key that ``fresh`` lacks is a difference — the record states a number its runs no longer
    give — unless its recorded value is null: ``plain`` writes an undefined number (NaN, an
    infinite df) as null, and a field left out states no number either."""
    if isinstance(recorded, dict) and isinstance(fresh, dict):
        out = []
        for k in sorted(recorded, key=str):
            if k in fresh:
                out.extend(_differences(recorded[k], fresh[k], f"{where}.{k}"))
            elif recorded[k] is not None:
                out.append(f"{where}.{k}: recorded {recorded[k]!r}, its runs give no {k!r}")
        return out
    if isinstance(recorded, list) and isinstance(fresh, list) and len(recorded) == len(fresh):
        return [d for i, (a, b) in enumerate(zip(recorded, fresh, strict=True))
                for d in _differences(a, b, f"{where}[{i}]")]
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool)
                  for x in (recorded, fresh))
    if recorded == fresh or numbers and math.isclose(recorded, fresh, rel_tol=1e-9,
                                                      abs_tol=1e-12):
        return []
    return [f"{where}: recorded {recorded!r}, its runs give {fresh!r}"]


def _check_schema(path: Path, schema: Any) -> None:
    """A record's schema must be a whole number this code reads: 1 .. :data:`RECORD_SCHEMA`."""
    if type(schema) is not int or schema < 1:
        raise ValueError(f"{path} has an invalid record schema {schema!r} (a whole number from 1 "
                         "up); the record is damaged: restore it from git, or re-record it")
    if schema > RECORD_SCHEMA:
        raise ValueError(f"{path} was written by a newer senslab (record schema {schema}; "
                         f"this one reads up to {RECORD_SCHEMA}); upgrade senslab")


def load_records(records: str | Path = "reproduction") -> dict[str, dict[str, Any]]:
    """All records in ``records``, keyed by file stem (the experiment's name for its CPU-scale
    record, ``<name>.paper`` for a paper-scale one), in the current format (a record without
    ``schema`` is one of schema 1); a damaged record or one of a newer schema is an error that
    names the file."""
    out = {}
    for path in sorted(Path(records).glob("*.json")):
        rec = _read_record(path)
        if not isinstance(rec, dict) or "name" not in rec:
            raise ValueError(f"{path} is not a reproduction record (no 'name'); restore it from "
                             "git, or delete it")
        _check_schema(path, rec.setdefault("schema", 1))
        if "verdict" not in rec:
            raise ValueError(f"{path} lacks 'verdict': the record is damaged; restore it from "
                             "git, or re-record it with `senslab reproduction DIR`")
        rec.setdefault("scale", "cpu")
        out[path.stem] = rec
    return out


def refloor(entry: dict[str, Any]) -> str:
    """Judge a record's (or a ladder rung's) parts again where a stored standard error is below
    the part's own measurement error, which the rule of :func:`senslab.verdicts.over_seeds`
    now never allows (seeds that agree more closely than their measurement error can are
    chance, not precision: verdicts written before the rule kept such intervals). Those parts
    get the measurement error as their standard error, every part is judged again
    (:func:`senslab.verdicts.judge`, Holm over the claim's parts), and the verdict, effects and
    the reason's sentence of each part are replaced. Returns what changed, in words ("" when
    no part lies below its floor); ``entry`` is changed in place.

    Refused where judging the stored parts as they are does not give the stored verdict (the
    experiment decided with more than its parts), or where the reason does not hold the parts'
    sentences: the record cannot be re-derived from its numbers."""
    effects = entry.get("effects") or {}
    below = [k for k, e in effects.items()
             if isinstance(e.get("se"), (int, float)) and isinstance(e.get("se_measure"),
                                                                     (int, float))
             and math.isfinite(e["se_measure"]) and e["se"] < e["se_measure"] * (1 - 1e-9)]
    if not below:
        return ""

    def part(e: dict[str, Any], floored: bool) -> Effect:
        se, se_seed, method = e["se"], e.get("se_seed"), e.get("method") or ""
        # as describe() reads a part stored before ``unit`` was: a bootstrap's units are runs
        # (a plain "seed" turned "12 runs" into "12 seeds" in the reason)
        unit = e.get("unit") or ("run" if method.startswith("bootstrap") else "seed")
        if floored:
            if not method.startswith("mean over"):
                raise ValueError(f"refloor: part {e.get('what')!r} is no mean over seeds "
                                 f"({method!r}): its floor is not the seeds' rule")
            se, se_seed = e["se_measure"], 0.0
            # the seeds paired_by_seed left out stay said (describe() repeats them): the new
            # method dropped them, and the reason then read as a mean over every seed run
            unpaired = method.partition(UNPAIRED)[2]
            method = (f"mean over {e['seeds']} {unit}s (t; s.e. floored at the measurement "
                      "error)" + (f"; {UNPAIRED}{unpaired}" if unpaired else ""))
        return Effect(float(e["effect"]), math.nan if se is None else float(se),
                      math.inf if e.get("df") is None else float(e["df"]), int(e["seeds"]),
                      e.get("se_measure"), se_seed, e.get("what") or "", method, unit)

    as_stored = judge({k: part(e, False) for k, e in effects.items()})
    if as_stored["verdict"] != entry.get("verdict"):
        raise ValueError(f"refloor: the stored parts judge {as_stored['verdict']!r}, the record "
                         f"says {entry.get('verdict')!r}: not re-derivable from its parts")
    reason = entry.get("reason") or ""
    old = {k: describe(k, p) for k, p in effects.items()}
    if any(reason.count(text) != 1 for text in old.values()):
        raise ValueError("refloor: the reason does not hold each part's sentence once")
    fresh = judge({k: part(e, k in below) for k, e in effects.items()})
    before = entry["verdict"]
    for k, p in fresh["parts"].items():
        reason = reason.replace(old[k], describe(k, p))
    entry["reason"] = reason
    entry["effects"] = plain(fresh["parts"])
    entry["verdict"] = fresh["verdict"]
    if "correction" in entry:
        entry["correction"] = fresh["correction"]
    said = ", ".join(f"{k} (s.e. {effects[k]['se']:.3g} → {effects[k]['se_measure']:.3g})"
                     for k in below)
    return (f"s.e. floored at the measurement error, as the rule now requires: {said}; "
            f"judged again (Holm over {len(effects)} part{'s' if len(effects) != 1 else ''}): "
            f"{before} → {fresh['verdict']}")


def format_runtime(seconds: float | None) -> str:
    """A record's ``runtime_s`` as REPRODUCTION.md shows it ("84 s", "6.9 min"; "—" for a
    record written before runtimes were recorded)."""
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


def rung_runtime(row: dict[str, Any]) -> str:
    """A ladder rung's runtime cell: the verdict's wall time, and the runs' summed training
    time where it exceeds that by more than a fifth (a rung trained over several sittings)."""
    wall, runs = row.get("runtime_s"), row.get("run_seconds")
    text = format_runtime(wall)
    if isinstance(runs, (int, float)) and isinstance(wall, (int, float)) and runs > 1.2 * wall:
        text += f" (its runs: {format_runtime(runs)})"
    return text


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _paper_and_section(paper: str) -> tuple[str, str]:
    """'Title (venue), §5 / A.1' → ('Title (venue)', '§5 / A.1')."""
    head, sep, section = paper.rpartition("), ")
    return (head + ")", section) if sep else (paper, "")


def _num(x: Any, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "?"


def _interval(p: dict[str, Any]) -> str:
    lo, hi = p.get("interval") or [None, None]
    text = (f"{p.get('what') or '?'} {_num(p.get('effect'), '+.3g')} "
            f"[{_num(lo, '+.3g')}, {_num(hi, '+.3g')}]")
    parts = [f"{k} {p[v]:.2g}" for k, v in (("meas.", "se_measure"), ("seeds", "se_seed"))
             if p.get(v) is not None]
    if parts and p.get("se") is not None:
        text += f" (s.e. {p['se']:.2g}: {', '.join(parts)})"
    return text


def seeds_cell(rec: dict[str, Any]) -> str:
    """The seeds column: the record's ``seeds`` setting, followed by "(N judged)" where the parts
    that are means over seeds rest on another number of seeds (``"5 (3 judged)"``: runs left
    out, unpaired or never reached the verdict's condition; ``"3–4"`` when the parts differ).
    Until 2026-12-07 the column showed the setting alone, and a verdict resting on 3 of 5 seeds
    read as resting on 5. Parts over runs or settings (a unit other than the seed: a fit or a
    correlation over the runs) count no seeds and are not compared."""
    setting = rec.get("seeds")
    judged = sorted({e["seeds"] for e in (rec.get("effects") or {}).values()
                     if isinstance(e, dict) and (e.get("unit") or "seed") == "seed"
                     and isinstance(e.get("seeds"), int)})
    text = str(setting) if setting else "—"
    if judged and judged != [setting]:
        rest = f"{judged[0]}" if len(judged) == 1 else f"{judged[0]}–{judged[-1]}"
        text += f" ({rest} judged)"
    return text


def rejudged(rec: dict[str, Any]) -> str:
    """After a verdict that was judged again from the record's numbers under a later rule and
    changed: " (re-judged DATE: was WORD)", the latest such change; "" otherwise."""
    moved = [r for r in rec.get("rejudged") or []
             if isinstance(r, dict) and r.get("verdict_before") not in (None, rec.get("verdict"))]
    if not moved:
        return ""
    return f" (re-judged {moved[-1].get('date')}: was {moved[-1]['verdict_before']})"


def short_reason(reason: str) -> str:
    """The first clause of a verdict's reason: up to its first colon, semicolon or " | "."""
    cut = min((i for i in (reason.find(": "), reason.find("; "), reason.find(" | ")) if i >= 0),
              default=len(reason))
    return reason[:cut].strip()


def effect_cell(rec: dict[str, Any], why: bool = False) -> str:
    """The effect column: each part of the claim with its interval (at its Holm level) and the
    two parts of its standard error, at most :data:`SHOWN_PARTS` of them. Without effects (a
    failed precondition), "—", followed with ``why`` by the first clause of the reason."""
    effects = rec.get("effects") or {}
    if not effects:
        reason = short_reason(rec.get("reason") or "") if why else ""
        return f"— ({reason})" if reason else "—"
    shown = [_interval(p) for p in list(effects.values())[:SHOWN_PARTS]]
    more = len(effects) - SHOWN_PARTS
    return "; ".join(shown) + (f"; … and {more} more" if more > 0 else "")


#: the first day on which runs measured with noise of a stream of their own
#: (:func:`senslab._seeds.noise_seed`), not the one their models' weights were drawn from
OWN_NOISE_FROM = "2026-12-06"


def _measured_on_run_seed(name: Any) -> bool:
    """Whether experiment ``name`` measured its runs with noise of the run's own seed before
    :data:`OWN_NOISE_FROM`: those of the first paper and the demo (tracked sensitivity, final
    measurements, sharpness); the implicit-bias experiments measure no sensitivity, and Hahn
    & Rofin's share one draw of one parameter's sharpness (not counted)."""
    if name not in list_experiments():
        return False
    module = type(get_experiment(name)).__module__
    return ".lowsens." in module or module.endswith(".demo")


def _shared_seed_note(records: dict[str, dict[str, Any]]) -> list[str]:
    """A paragraph on the records finished before :data:`OWN_NOISE_FROM` (none: no lines)."""
    early = sorted({r.get("name", "?") + ("" if r.get("scale", "cpu") == "cpu"
                                          else f" ({r.get('scale')} scale)")
                    for r in records.values()
                    if str(r.get("finished") or "")[:10] < OWN_NOISE_FROM
                    and _measured_on_run_seed(r.get("name"))})
    if not early:
        return []
    many = len(early) != 1
    return [f"{len(early)} record{'s' if many else ''} ({', '.join(early)}) "
            f"{'were' if many else 'was'} finished "
            f"before {OWN_NOISE_FROM}, when a run's sensitivity and sharpness were measured "
            "with noise drawn from the run's own seed, the stream its model's initial weights "
            "came from (the text models' first noise rows were their initial embedding table; "
            "a memorised grokking model flipped on 10.0% of such copies and on 4.6% with fresh "
            "noise): their numbers may be biased, by an amount not measured "
            "([docs/definitions.md](docs/definitions.md#tracked-sensitivity)); the same "
            "`senslab run` command now measures with noise of its own.", ""]


def render(records: dict[str, dict[str, Any]],
           ladders: dict[str, dict[str, Any]] | None = None) -> str:
    """The markdown of REPRODUCTION.md: one section per paper, one row per experiment and
    recorded scale."""
    by_paper: dict[str, list[tuple[str, str]]] = {}
    for name in list_experiments():
        paper, section = _paper_and_section(get_experiment(name).paper)
        by_paper.setdefault(paper, []).append((name, section))
    # the summary counts the records, the rows look them up by file stem: a record no row shows
    # (of an experiment no longer registered, or a copy under another stem) was counted in the
    # summary's verdicts without a row, or marked its experiment as run while the row said
    # "not run here"
    for key, rec in records.items():
        name, scale = rec.get("name"), rec.get("scale", "cpu")
        if name not in list_experiments():
            raise ValueError(f"record {key}.json is of experiment {name!r}, which is not "
                             "registered (renamed or removed?): REPRODUCTION.md has no row for "
                             "it; delete the record, or re-record the experiment under its "
                             "current name")
        stem = name if scale == "cpu" else f"{name}.{scale}"
        if key != stem:
            raise ValueError(f"record {key}.json holds experiment {name!r} at scale {scale!r}, "
                             f"whose record is {stem}.json: REPRODUCTION.md would show it in "
                             "another row, or none; rename it, or delete it if it is a stray "
                             "copy")
    counts: dict[str, dict[str, int]] = {}
    for rec in records.values():
        by_word = counts.setdefault(rec.get("scale", "cpu"), {})
        by_word[rec["verdict"]] = by_word.get(rec["verdict"], 0) + 1
    order = {w: i for i, w in enumerate(WORDS)}

    def summary(scale: str) -> str:
        c = counts.get(scale, {})
        return ", ".join(f"{n} {v}" for v, n in sorted(c.items(),
                                                       key=lambda x: (order.get(x[0], 9), x[0])))

    cpu_recorded = {r["name"] for r in records.values() if r.get("scale", "cpu") == "cpu"}
    lines = [
        "# Reproduction status",
        "",
        "Generated by `senslab reproduction` from the records in `reproduction/` (one JSON file "
        "per experiment and scale, written from a finished `senslab run NAME` directory); do not "
        "edit by hand.",
        "A verdict is *supported* (the interval of every part of the claim lies on the claimed "
        "side of zero), *contradicted* (some part lies on the other side), *inconclusive* (an "
        "interval contains zero; the part states the smallest effect it could have detected) or "
        "*not comparable* (the runs failed the claim's precondition): "
        "[docs/definitions.md](docs/definitions.md#verdicts). Effects are positive in the "
        "claimed direction; intervals are 95% (Holm-adjusted where a claim has several parts) "
        "and use Student's t over the training seeds. How each paper-scale setting compares "
        "with the authors' own code: [docs/fidelity.md](docs/fidelity.md).",
        "",
        *_shared_seed_note(records),
        "Summary, CPU scale: " + (summary("cpu") or "nothing recorded")
        + f", {sum(1 for n in list_experiments() if n not in cpu_recorded)} not run here."
        + (f" Paper scale: {summary('paper')}." if counts.get("paper") else ""),
    ]
    for paper, items in by_paper.items():
        lines += ["", f"## {paper}", "",
                  "| experiment | claim | scale | result | seeds | effect [interval] | runtime "
                  "| device | verdict |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, section in items:
            exp = get_experiment(name)
            label = f"`{name}`" + (f" ({section})" if section else "")
            recs = [(sc, records[key]) for sc, key in (("cpu", name), ("paper", f"{name}.paper"))
                    if key in records]
            if not any(sc == "cpu" for sc, _ in recs):
                why = exp.requires or "no CPU-scale result recorded yet"
                lines.append(f"| {label} | {_cell(exp.claim)} | cpu | not run here: {_cell(why)} "
                             f"| — | — | {_cell(exp.runtime_estimate) or '—'} | — | not run |")
            for scale, rec in recs:
                result = rec.get("reason", "")
                sets = " ".join(f"`--set {o}`" for o in rec.get("overrides") or [])
                if scale == "cpu" and exp.cpu_scale_note:
                    # the note describes the scale as defined: next to "(run with --set
                    # train.epochs=10)" its "4 epochs" read as what ran, or the two as a conflict
                    result += (f" *CPU scale, before this run's overrides: {exp.cpu_scale_note}* "
                               f"(run with {sets}, which replace those values where they "
                               "differ)" if sets else f" *CPU scale: {exp.cpu_scale_note}*")
                elif sets:
                    result += f" (run with {sets})"
                threads = rec.get("threads")
                device = rec.get("device") or ("CPU" if scale == "cpu" else "—")
                if threads:
                    device += f", {threads} thread{'s' if threads != 1 else ''}"
                lines.append(
                    f"| {label} | {_cell(exp.claim)} | {scale} | {_cell(result)} | "
                    f"{seeds_cell(rec)} | {_cell(effect_cell(rec))} | "
                    f"{format_runtime(rec.get('runtime_s'))} | {_cell(device)} | "
                    f"**{rec['verdict']}**{rejudged(rec)} |")
    lines += render_ladders(ladders or {})
    return "\n".join(lines) + "\n"


def holds_records(records: str | Path) -> bool:
    """Whether directory ``records`` holds any record (``*.json``, or ``ladders/*.json``)."""
    root = Path(records)
    return root.is_dir() and (any(root.glob("*.json")) or any(root.glob("ladders/*.json")))


def shown_records(markdown: str) -> list[str]:
    """The recorded rows a REPRODUCTION.md (as :func:`render` writes it) shows: ``"name"`` for
    a CPU-scale row, ``"name (paper)"``, ``"name (ladder)"``; rows of experiments not run are
    left out."""
    shown = []
    ladders = False
    for line in markdown.splitlines():
        if line.startswith("## Scale ladders"):
            ladders = True
        elif ladders and line.startswith("### `"):
            shown.append(f"{line.split('`')[1]} (ladder)")
        elif (not ladders and line.startswith("| `") and line.rstrip().endswith("|")
              and not line.rstrip().endswith("| not run |")):
            scale = "paper" if " | paper | " in line else "cpu"
            name = line.split("`")[1]
            shown.append(name if scale == "cpu" else f"{name} ({scale})")
    return shown


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
    _write_whole(path, render(load_records(records), load_ladders(records)))
    return path
