"""Reading run and experiment directories (format: ``docs/run-directory.md``).

A *run directory* holds ``config.json``, ``env.json``, ``metrics.jsonl`` and, once finished,
``summary.json``. An *experiment directory* holds ``experiment.json`` (and usually
``verdict.json``) next to one run subdirectory per (model, seed). Everything here only reads;
nothing retrains or rewrites a run, and no lock is taken (a run may be read while it trains).
A directory written by a newer senslab (a higher schema in ``senslab.json``) is refused, and so
are a metric log with a step logged twice or out of order and a summary.json whose final numbers
are not those of the log's last record, or whose log is empty or ends in a torn line (one of the
two was edited or damaged): their numbers cannot be trusted.

A run without ``summary.json`` has not finished (it was stopped, or is still training): its
numbers are the last values it logged. It is shown apart, as ``<label> (unfinished, step N)``
(:attr:`Run.group_label`), never averaged with the finished runs of its label, and the readers
warn once about such runs.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from senslab.train.rundir import RunDir, RunDirError, metric_order_problem

PathLike = str | Path

RUN_MARKERS = ("config.json", "metrics.jsonl")
EXPERIMENT_MARKER = "experiment.json"


class RunFormatError(ValueError):
    """A directory is not a readable run/experiment, or one of its files is malformed."""


@dataclass
class Run:
    """One training run, as read from its directory.

    ``metrics`` is the list of logged objects in file order, steps strictly increasing (a resume
    first drops the records logged after its checkpoint). ``summary`` is ``None`` while the run
    has not finished.
    """

    path: Path
    config: dict[str, Any]
    env: dict[str, Any]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None = None
    experiment: Path | None = None
    #: the label given by :func:`load_runs` where runs of one label differ in a setting
    relabel: str | None = None
    #: the name given by :func:`load_runs` where runs read together share a name
    rename: str | None = None

    @property
    def name(self) -> str:
        """The run's own name (``config.name``), else its directory name; where runs read
        together share it (``mlp-s0`` of two directories), the name with as much of its path
        as tells them apart (``dirA/mlp-s0``, ``mlp (r0)``)."""
        return self.rename if self.rename is not None else self.own_name

    @property
    def own_name(self) -> str:
        """The run's own name (``config.name``), else its directory name."""
        return str(self.config.get("name") or self.path.name)

    @property
    def finished(self) -> bool:
        """Whether the run finished (it has ``summary.json``)."""
        return self.summary is not None

    @property
    def last_step(self) -> int | None:
        """The step of the last logged record (None: nothing logged yet)."""
        return int(self.metrics[-1]["step"]) if self.metrics else None

    @property
    def status(self) -> str:
        """``"finished"``, or ``"unfinished, step N"`` (N: the last logged step) for a run
        without ``summary.json`` — stopped, or still training."""
        if self.finished:
            return "finished"
        step = self.last_step
        return "unfinished, nothing logged" if step is None else f"unfinished, step {step}"

    @property
    def group_label(self) -> str:
        """The label the run's numbers are shown and aggregated under: :attr:`label` for a
        finished run; for an unfinished one its label marked ``(unfinished, step N)``, so that
        its last logged values are never averaged with the finished runs' final ones."""
        return self.label if self.finished else f"{self.label} ({self.status})"

    @property
    def label(self) -> str:
        """The curve/bar this run belongs to; finished runs sharing a label are aggregated over
        seeds (see :attr:`group_label` for unfinished ones)."""
        if self.relabel is not None:
            return self.relabel
        # an empty one (the boolean trainer's summary of a run configured without a label) is
        # none: it was shown as an empty label once finished, as its name before
        if self.summary and self.summary.get("label") not in (None, ""):
            return str(self.summary["label"])
        # without a summary (unfinished), the label its trainer will write at the finish: the
        # attention loop's "sps" (its optimizer) read as the run's name, "example (unfinished,
        # step 2000)", and was never set beside the finished runs of its label
        return str(self.config.get("label") or default_label(self.config) or self.own_name)

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    @property
    def final(self) -> dict[str, Any]:
        """Final value of every metric.

        ``summary.json``'s ``final`` wins; a key it lacks (or every key, while the run has no
        summary: see :attr:`status`) falls back to the last value logged for it in
        ``metrics.jsonl``. Taking the last
        value *per key* rather than only the last line matters because expensive metrics
        (sensitivity, sharpness) are logged less often than the loss.
        """
        out: dict[str, Any] = {}
        for row in self.metrics:
            out.update(row)
        if self.summary:
            out.update(self.summary.get("final") or {})
        return out

    def series(self, key: str) -> tuple[list[int], list[float], list[Any]]:
        """``(steps, epochs, values)`` of ``key`` over training, sorted by step.

        Lines without the key are skipped. A line without an epoch, or with ``"epoch": null``
        (not known), has NaN as its epoch.
        """
        by_step: dict[int, tuple[float, Any]] = {}
        for row in self.metrics:
            if key in row and row[key] is not None:
                epoch = row.get("epoch")
                by_step[int(row["step"])] = (math.nan if epoch is None else float(epoch),
                                             row[key])
        steps = sorted(by_step)
        return steps, [by_step[s][0] for s in steps], [by_step[s][1] for s in steps]

    def lookup(self, key: str) -> Any:
        """A final metric, or a config entry when ``key`` is ``config.<dotted.path>``."""
        if key.startswith("config."):
            node: Any = self.config
            for part in key.split(".")[1:]:
                if not isinstance(node, dict) or part not in node:
                    raise KeyError(f"run {self.path} has no config entry {key[7:]!r}")
                node = node[part]
            return node
        final = self.final
        if key not in final:
            raise KeyError(
                f"run {self.path} has no metric {key!r}; it has: {', '.join(sorted(final))}"
            )
        return final[key]


@dataclass
class Experiment:
    """An experiment directory: its claim, its verdict (if judged yet) and its runs."""

    path: Path
    info: dict[str, Any]
    verdict: dict[str, Any] | None
    runs: list[Run] = field(default_factory=list)
    #: runs ``experiment.json`` lists that are not in the directory (skipped with a warning)
    missing: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.info.get("name") or self.path.name)

    @property
    def claim(self) -> str | None:
        return self.info.get("claim")

    def verdict_caveat(self) -> str | None:
        """Why ``verdict.json`` cannot be read as the verdict of the runs shown, or None: it was
        computed from every run ``experiment.json`` lists, finished, and some of them are missing
        here or have no ``summary.json`` (unfinished, or their summary was removed). As
        ``senslab reproduction``, which refuses to record such a verdict."""
        if self.verdict is None:
            return None
        unfinished = [r.path.name for r in self.runs if not r.finished]
        if not self.missing and not unfinished:
            return None
        listed = len(self.info.get("runs") or []) or len(self.runs) + len(self.missing)
        n, m = len(self.missing), len(unfinished)
        parts = ([f"{n} {'is' if n == 1 else 'are'} missing ({', '.join(self.missing)})"]
                 if n else []) + ([f"{m} {'has' if m == 1 else 'have'} no summary.json "
                                   f"(unfinished: {', '.join(unfinished)})"] if m else [])
        scale = self.verdict.get("scale", self.info.get("scale", "cpu"))
        again = (f"senslab run {self.name}" + (f" --scale {scale}" if scale != "cpu" else "")
                 + "".join(f" --set {o}" for o in self.verdict.get("overrides") or [])
                 + f" --out {self.path}")
        return (f"this verdict was computed from the {listed} finished runs experiment.json "
                f"lists, of which {' and '.join(parts)}: it is not the verdict of the runs "
                "shown, and cannot be checked against them; restore those runs, or re-run "
                f"`{again}` (finished runs are reused)")


def default_label(config: dict[str, Any]) -> str | None:
    """The label the run of ``config`` (its config.json, ``label`` empty) gets in its summary
    when it finishes, where its trainer gives it one other than its name (the trainer's
    ``label``, :class:`senslab.train.trainers.Trainer`): an unfinished run is shown under the
    label its finished runs have."""
    if not config:
        return None
    from senslab.train.trainers import get_trainer, trainer_of

    # a config.json written by hand (``name`` and ``seed`` alone) fits several: no guess
    name = trainer_of(config, unique=True)
    rule = get_trainer(name).label if name is not None else None
    label = rule(config) if rule is not None else None
    return str(label) if label else None


def _null(constant: str) -> float | None:
    """``json.loads``'s reading of a bare ``NaN``: null (not known), as senslab writes it
    today. An older senslab wrote it bare, and a diverged seed's NaN was averaged in (``nan ±
    nan``) where today's null is left out and said (``0.5 ± 0.14 (2 of 3 runs, 1 null)``). A
    bare ``Infinity`` stays the number it is (a mean over it is inf, and says so)."""
    return None if constant == "NaN" else float(constant)


def _read_json(path: Path, nan_as_null: bool = False) -> Any:
    try:
        # UTF-8 whatever the locale: senslab writes it; a file saved in another encoding (a
        # label edited by hand as latin-1) failed as a bare UnicodeDecodeError naming no file
        return json.loads(path.read_bytes().decode("utf-8"),
                          parse_constant=_null if nan_as_null else None)
    except UnicodeDecodeError as err:
        raise RunFormatError(
            f"{path} is not UTF-8 text (byte {err.start}: {err.reason}); the file was damaged, "
            "or saved by an editor in another encoding: save it as UTF-8, or restore it"
        ) from err
    except json.JSONDecodeError as err:
        raise RunFormatError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}); the file is corrupted, "
            "fix or delete it"
        ) from err


def _read_json_dict(path: Path, optional: bool = True, nan_as_null: bool = False
                    ) -> dict[str, Any] | None:
    if not path.is_file():
        if optional:
            return None
        raise RunFormatError(f"missing {path}")
    data = _read_json(path, nan_as_null)
    if not isinstance(data, dict):
        raise RunFormatError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def read_metrics(path: PathLike, finished: bool = False) -> list[dict[str, Any]]:
    """Parse a ``metrics.jsonl`` file into a list of dicts.

    Blank lines are ignored. A bare ``NaN`` (written by an older senslab) is read as null,
    as senslab writes it today. A last line that does not parse is a write cut short by a killed
    run: it is skipped with a warning. In a ``finished`` run (one with summary.json, written
    after its last record) no crash can cut it, so the warning says the file was damaged since;
    the line is still skipped. A bad line anywhere else means the file is corrupt and is
    an error that names the line number. Every object must carry ``step``, a whole number (a
    step that is null, text or fractional is an error naming the line), and steps must
    increase strictly: a repeated or earlier step (two writers, or a log pieced together) is an
    error naming the line and the step.
    """
    path = Path(path)
    # bytes, decoded line by line: a line that is not UTF-8 (damaged, or edited in another
    # encoding) is a bad line like any other, where decoding the whole file failed as a bare
    # UnicodeDecodeError naming neither the file nor the line
    lines = path.read_bytes().splitlines()
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    rows: list[tuple[int, dict[str, Any]]] = []
    for pos, (lineno, line) in enumerate(numbered):
        try:
            # a bare NaN (written by an older senslab) is null, as written today
            row = json.loads(line.decode("utf-8"), parse_constant=_null)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            msg = err.msg if isinstance(err, json.JSONDecodeError) else "not UTF-8 text"
            if pos == len(numbered) - 1:
                why = ("the run was probably killed while writing it" if not finished else
                       f"the run finished, so no crash cut it: the file was damaged or edited "
                       f"since ({msg}), and the run's last logged point is missing from "
                       "the curves; restore the file, or train the run again")
                # once per process: ``senslab report`` reads its runs twice
                _warn_once_at(f"{path}: skipping truncated last line {lineno} ({why})",
                              [path], stacklevel=4)
                break
            raise RunFormatError(
                f"{path}: line {lineno} is not valid JSON ({msg}); the metrics file is "
                "corrupt, fix or delete that line"
            ) from err
        if not isinstance(row, dict) or "step" not in row:
            raise RunFormatError(
                f"{path}: line {lineno} must be a JSON object with a 'step' key, got "
                f"{line.decode('utf-8')[:80]!r}"
            )
        if not _is_whole_number(row["step"]):
            # read as int(step) below: 1.5 and 1.7 were one point (the first lost without a
            # word), null failed later as a TypeError, and "10" went past the order check
            raise RunFormatError(
                f"{path}: line {lineno} has step {row['step']!r}, but a step is a whole number "
                "(the optimizer steps so far); the metrics file was written by a trainer that "
                "logs its steps otherwise, or edited: fix that line's step"
            )
        rows.append((lineno, row))
    problem = metric_order_problem(path, rows)
    if problem:
        raise RunFormatError(problem)
    return [row for _, row in rows]


def _is_whole_number(value: Any) -> bool:
    """Whether ``value`` is a whole number: an int (not a bool), or a float such as ``5.0``
    (a step written through ``json.dumps(..., default=float)`` from a NumPy integer)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or (math.isfinite(value) and value.is_integer())


def check_schema(path: Path, kind: str) -> None:
    """Refuse a directory written by a newer senslab than this one (see docs/run-directory.md)."""
    try:
        RunDir(path, kind=kind).check_readable()
    except RunDirError as err:
        raise RunFormatError(str(err)) from None


def is_run_dir(path: PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and any((p / m).is_file() for m in RUN_MARKERS)


def is_experiment_dir(path: PathLike) -> bool:
    return (Path(path) / EXPERIMENT_MARKER).is_file()


def load_run(path: PathLike, experiment: Path | None = None) -> Run:
    """Read one run directory. It needs ``config.json`` or ``metrics.jsonl`` (a run that has
    just started may have logged nothing yet); ``env.json`` and ``summary.json`` are optional."""
    p = Path(path)
    if not p.is_dir():
        raise RunFormatError(f"{p} does not exist or is not a directory; pass a run directory")
    if not is_run_dir(p):
        try:
            held = [] if is_experiment_dir(p) else [d for d in sorted(p.iterdir()) if is_run_dir(d)]
        except OSError:  # unreadable: said as before
            held = []
        hint = (
            " It is an experiment directory: use load_runs or load_experiment."
            if is_experiment_dir(p)
            # a folder of runs (runs/): the message said only what it is not
            else f" It holds {len(held)} run directories ({', '.join(d.name for d in held[:3])}"
            f"{', …' if len(held) > 3 else ''}): pass those (e.g. {p / '*'})."
            if held
            else " Pass a directory written by `senslab train` or `senslab run`."
        )
        raise RunFormatError(
            f"{p} is not a run directory (it has neither config.json nor metrics.jsonl).{hint}"
        )
    check_schema(p, "run")
    metrics_file = p / "metrics.jsonl"
    summary = _read_json_dict(p / "summary.json", nan_as_null=True)
    if summary is not None and not isinstance(summary.get("final") or {}, dict):
        # read as a dict of final numbers: a list failed as a bare TypeError naming no file
        raise RunFormatError(
            f"{p / 'summary.json'}: 'final' must be a JSON object of the run's final numbers, "
            f"found {type(summary['final']).__name__}; the file was damaged or edited: restore "
            f"it, or delete it and re-run the run's command (it resumes from its last "
            "checkpoint and writes the summary again)")
    metrics = (read_metrics(metrics_file, finished=summary is not None)
               if metrics_file.is_file() else [])
    if summary is not None and metrics_file.is_file():
        try:  # the check every trainer makes before it reuses a finished run
            RunDir(p, kind="run").check_summary(summary)
        except RunDirError as err:
            raise RunFormatError(str(err)) from None
    return Run(
        path=p,
        config=_read_json_dict(p / "config.json") or {},
        env=_read_json_dict(p / "env.json") or {},
        metrics=metrics,
        summary=summary,
        experiment=experiment,
    )


def load_experiment(path: PathLike) -> Experiment:
    """Read an experiment directory and its runs.

    The runs are the subdirectories listed in ``experiment.json``'s ``runs`` (in that order);
    listed runs that are not there yet are skipped with a warning (an experiment still in
    progress). Without a ``runs`` list every run subdirectory is taken, sorted by name with
    its numbers read as numbers (``s2`` before ``s10``, as seeds are numbered).
    """
    p = Path(path)
    check_schema(p, "experiment")
    info = _read_json_dict(p / EXPERIMENT_MARKER, optional=False) or {}
    verdict = _read_json_dict(p / "verdict.json")
    missing: list[str] = []
    if "runs" in info:
        subdirs = []
        for sub in info["runs"]:
            if is_run_dir(p / sub):
                subdirs.append(p / sub)
            else:
                missing.append(str(sub))
                # once per process: ``senslab report`` reads its runs twice
                _warn_once_at(f"{p}: listed run {sub!r} is missing, skipping it", [p / sub],
                              stacklevel=3)
    else:
        subdirs = sorted((d for d in p.iterdir() if is_run_dir(d)), key=_natural_key)
    return Experiment(p, info, verdict, [load_run(d, experiment=p) for d in subdirs], missing)


def _natural_key(path: Path) -> list[str | int]:
    """``path``'s name split into text and numbers: ``mlp-s2`` before ``mlp-s10``, where a
    plain sort put seed 10 between seeds 1 and 2 in the tables."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def load_runs(paths: PathLike | Iterable[PathLike]) -> list[Run]:
    """Read run directories, expanding experiment directories into their runs (in order).

    A run reached twice (a directory given twice, or a run and its experiment) is refused. Runs
    that share a label are aggregated as seeds only where they differ in nothing but the seed
    (and :data:`NOT_SETTINGS`); otherwise each gets a label that names its differing settings
    (``mlp (optim.lr=0.5)``), with a warning where they come from different directories."""
    return load_all(paths)[1]


def load_all(paths: PathLike | Iterable[PathLike]) -> tuple[list[Experiment], list[Run]]:
    """The experiments among ``paths`` and every run, read and checked as :func:`load_runs`
    reads them (what ``report.html`` shows and ``senslab report`` prints come from the same
    runs, labelled the same way)."""
    experiments: list[Experiment] = []
    runs: list[Run] = []
    for p in as_paths(paths):
        if is_experiment_dir(p):
            experiments.append(load_experiment(p))
            runs.extend(experiments[-1].runs)
        else:
            runs.append(load_run(p))
    seen: dict[Path, Path] = {}
    for run in runs:
        key = run.path.resolve()
        if key in seen:
            raise RunFormatError(f"run {run.path} is given twice (also as {seen[key]}, or through "
                                 "its experiment directory): pass each run once, or its runs "
                                 "would count as two seeds")
        seen[key] = run.path
    _name_apart(runs)
    _separate_settings(runs)
    warn_unfinished(runs)
    return experiments, runs


def _name_apart(runs: Sequence[Run]) -> None:
    """Give runs that share a name (``mlp-s0`` of ``dirA`` and of ``dirB``) names that tell
    them apart by the end of their paths (:attr:`Run.rename`): the per-run rows and the
    warnings naming runs showed two identical names, and which numbers were whose could not be
    told."""
    by_name: dict[str, list[Run]] = {}
    for run in runs:
        by_name.setdefault(run.own_name, []).append(run)
    for name, group in by_name.items():
        if len(group) < 2:
            continue
        parts = [r.path.resolve().parts for r in group]
        k = 1  # the fewest last path parts that differ between every two of them
        while k < max(map(len, parts)) and len({p[-k:] for p in parts}) < len(parts):
            k += 1
        for run, p in zip(group, parts, strict=True):
            if p[-1] == name:  # the directory's name is the run's: its parents tell it apart
                run.rename = "/".join(p[-max(k, 2):])
            else:
                run.rename = f"{name} ({'/'.join(p[-k:])})"


#: (run directory, status) of the unfinished runs already warned about in this process
_WARNED: set[tuple[Path, str]] = set()
#: (warning text, run directories) of the settings warnings already given in this process
_SAID: set[tuple[str, frozenset[Path]]] = set()


def _warn_once(text: str, runs: Iterable[Run]) -> None:
    """Warn ``text`` about ``runs`` once per process (``senslab report`` reads its runs twice:
    report.html, then the table)."""
    _warn_once_at(text, [r.path for r in runs], stacklevel=6)


def _warn_once_at(text: str, paths: Iterable[Path], stacklevel: int) -> None:
    """Warn ``text`` about the files or directories ``paths`` once per process."""
    key = (text, frozenset(Path(p).resolve() for p in paths))
    if key not in _SAID:
        _SAID.add(key)
        warnings.warn(text, stacklevel=stacklevel)


def warn_unfinished(runs: Sequence[Run]) -> None:
    """One warning naming the runs that have not finished (no ``summary.json``): their numbers
    are last logged values, shown apart from the finished runs of their label. A run is named
    once per status in a process (``senslab report`` reads its runs twice: report.html, then
    the table); when it has logged more since, it is named again."""
    unfinished = []
    for run in runs:
        key = (run.path.resolve(), run.status)
        if not run.finished and key not in _WARNED:
            _WARNED.add(key)
            unfinished.append(run)
    if not unfinished:
        return
    shown = ", ".join(f"{r.path} ({r.status.removeprefix('unfinished, ')})"
                      for r in unfinished[:4]) + (", …" if len(unfinished) > 4 else "")
    warnings.warn(f"{len(unfinished)} run(s) have not finished (no summary.json): {shown}; "
                  "their numbers are the last values they logged, shown apart as '<label> "
                  "(unfinished, step N)' and not averaged with finished runs; re-run the "
                  "command that trained them to finish them", stacklevel=4)


#: config keys that say where and how a run ran, not what it is: runs that differ only in these
#: (and the seed) are seeds of one setting
NOT_SETTINGS = frozenset({"seed", "name", "label", "device", "data.root", "data.download",
                          "track.report_to", "train.checkpoint_every", "train.keep_checkpoints",
                          "train.eval_batch_size", "track.chunk_size"})


def _is_seed_key(key: str) -> bool:
    """Whether the config key ``key`` names a seed by its name (``data.seed``,
    ``function_seed``): the seed fields of the trainers' configurations (``seeded()``)."""
    last = key.rsplit(".", 1)[-1]
    return last == "seed" or last.endswith("_seed")


def seed_like_keys(runs: Sequence[Run]) -> set[str]:
    """The config keys other than ``seed`` that are seeds of the replicates ``runs``: a seed
    field (:func:`_is_seed_key`) whose value is the run's own ``seed`` in every run. An
    experiment that draws each seed replicate's data or target function from its seed
    (ib_joint's ``data.seed = seed``, hr_random_functions' ``function_seed = seed``) varies
    them with the seed alone; runs that differ in them otherwise (two data seeds under one
    model seed) differ in a setting."""
    if not runs or any(r.seed is None for r in runs):
        return set()
    flats = [_flat(r.config) for r in runs]
    keys = {k for f in flats for k in f if k != "seed" and _is_seed_key(k)}
    return {k for k in keys
            if all(k in f and f[k] == r.seed and type(f[k]) is type(r.seed)
                   for r, f in zip(runs, flats, strict=True))}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _separate_settings(runs: Sequence[Run]) -> None:
    """Give runs of one label that differ in a setting the label plus those settings (a sweep
    within an experiment, such as one function's runs over several input lengths, or runs from
    different directories), so that a label's spread is over seeds alone (a seed field that
    equals each run's seed is a seed too: :func:`seed_like_keys`); warn where runs from
    different directories were split, and where two have the same setting and seed (copies of
    one run, not two seeds)."""
    by_label: dict[str, list[Run]] = {}
    for run in runs:  # finished or not: a sweep's unfinished run names its setting too
        by_label.setdefault(run.label, []).append(run)
    for label, group in by_label.items():
        if len(group) < 2:
            continue
        skip = NOT_SETTINGS | seed_like_keys(group)  # data.seed = seed: a seed, not a setting
        flat = [{k: json.dumps(v, sort_keys=True) for k, v in _flat(r.config).items()
                 if k not in skip} for r in group]
        keys = sorted({k for f in flat for k in f if len({g.get(k) for g in flat}) > 1})
        if keys:
            for run, f in zip(group, flat, strict=True):
                named = ", ".join(f"{k}={f.get(k, '-')}" for k in keys)
                run.relabel = f"{label} ({named})"
            if len({r.experiment or r.path for r in group}) > 1:
                _warn_once(f"runs labelled {label!r} differ in {', '.join(keys)}: shown apart "
                           "as labels that name those settings, not averaged as seeds", group)
        seeds: dict[tuple[str, str, Any], Run] = {}
        for run, f in zip(group, flat, strict=True):
            # runs shown apart (one unfinished) are not counted together: no warning
            twin = seeds.setdefault((run.group_label, json.dumps(f, sort_keys=True), run.seed),
                                    run)
            if twin is not run:
                _warn_once(f"runs {twin.path} and {run.path} have the same settings and seed "
                           f"{run.seed}: they are counted as two runs of {run.label!r}, but "
                           "their spread is not seed-to-seed variation", (twin, run))


def as_paths(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    if isinstance(paths, str | Path):
        return [Path(paths)]
    out = [Path(p) for p in paths]
    if not out:
        raise RunFormatError("no paths given; pass at least one run or experiment directory")
    return out


def group_by_label(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs grouped by :attr:`Run.group_label` (an unfinished run apart from the finished runs
    of its label), labels in order of first appearance."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.group_label, []).append(run)
    return groups
