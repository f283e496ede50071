"""Experiments: a claim from a paper, the runs that test it, and a verdict computed from numbers.

An experiment is a *spec*, readable top to bottom: its claim, a settings dataclass with one
instance per scale of :data:`SCALES`, its runs as data (:meth:`Experiment.runs`: a list of
:class:`Run`, each naming a registered trainer — :mod:`senslab.train.trainers` — and that
trainer's configuration), optional measurements of each finished run (:meth:`Experiment.
after_run`) and :meth:`Experiment.verdict`. It holds no optimizer and no step loop. The one
:meth:`Experiment.execute` trains every run into its own run directory below the experiment
directory; :func:`run_experiment` then writes ``experiment.json`` and ``verdict.json`` (format:
docs/run-directory.md). ``senslab report EXP_DIR`` turns that into report.html.

Settings and seeds are axes: every settings dataclass derives from :class:`Settings`, whose
``seeds`` field (a default per experiment) sets how many seed replicates the runs have, and
every experiment has one settings instance per scale, so a ladder of scales or a seed sweep is
``--scale`` and ``--set seeds=N``, never new code.

Overrides (``senslab run NAME --set key=value``) take one path for every experiment:
:func:`senslab.train.config.apply_overrides` — first on the settings (a key naming one of its
fields), then, for every other key, on each run's configuration (``train.epochs=3`` reaches every
:class:`~senslab.train.config.RunConfig` of a comparison); one that sets what a single setting
sets (``train.epochs=10`` where the setting ``epochs`` sets ``train.epochs``) is that setting, and
the settings say its value. A key that the experiment sets per run
(a field whose value differs between its runs as :meth:`Experiment.runs` built them — the
optimizer or model the claim compares, a per-run learning rate, a seed — and the runs' ``name``,
``label`` and ``seed``) is refused, naming the settings fields that set it: one value for every
run would train the same thing under each run's label. :func:`run_experiment` resolves them
before it writes anything, so a bad key or value fails with the same message for every
experiment.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import platform
import shlex
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..registry import Registry
from ..train._provenance import _short, commits_of
from ..train.config import (
    RunConfig,
    UnknownKey,
    apply_overrides,
    json_form,
    ranged,
    unknown_key,
    validate,
)
from ..train.looprun import single_thread
from ..train.rundir import (
    LOCK_FILE,
    MARKER,
    OWNER_FILE,
    RunDir,
    RunDirError,
    atomic_write_bytes,
    commit_relation,
    git_commit,
)
from ..train.trainers import get_trainer
from ..verdicts import plain

#: the scales every experiment runs at, smallest first; "cpu" is the default everywhere
SCALES = ("cpu", "paper")


def check_scale(scale: str) -> str:
    """``scale`` when it is one of :data:`SCALES`, else a ``ValueError`` listing them."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; use one of {', '.join(SCALES)}")
    return scale


@dataclass
class Settings:
    """The base of every experiment's settings dataclass.

    ``seeds``: how many seed replicates every run has (seeds 0 … seeds − 1); each experiment
    chooses its default, per scale."""

    seeds: int = ranged(1, ge=1)


@dataclass(frozen=True)
class Rung:
    """One rung of an experiment's scale ladder (docs/definitions.md#scale-ladders): a base
    scale of :data:`SCALES` plus settings ``overrides`` (``key=value`` as with ``--set``).

    ``size`` orders the rungs and labels the x axis of the effect-vs-scale plot (e.g. the ViT's
    parameter count, or a training-set size); ``note`` says in words what this rung changes
    against the one below it. ``cpu`` is false for a rung that needs a GPU's hours: ``senslab
    run NAME --scale ladder`` prints its command instead of running it (``--rungs`` runs it).

    ``paper_arch`` marks the top CPU rung that trains the paper's own architecture; its
    ``differs`` lists every run-configuration field (dotted, e.g. ``track.repeats``) in which it
    still differs from the paper scale, each with its reason. :func:`ladder_differences` computes
    the fields that do differ, and a test holds the two equal.
    """

    name: str
    scale: str
    overrides: tuple[str, ...] = ()
    size: float = 0.0
    note: str = ""
    cpu: bool = True
    paper_arch: bool = False
    differs: tuple[tuple[str, str], ...] = ()

    def command(self, experiment: str, out: str, extra: Sequence[str] = ()) -> str:
        """The ``senslab run`` command line that trains this rung alone into ``out``: its own
        overrides, then ``extra`` (those its runs were made with besides, e.g.
        ``data.root=DIR``, so that the command makes the same runs), each quoted for a POSIX
        shell where it needs to be."""
        sets = "".join(f" --set {shlex.quote(o)}" for o in (*self.overrides, *extra))
        return f"senslab run {experiment} --scale {self.scale}{sets} --out {shlex.quote(out)}"


@dataclass
class Run:
    """One run of an experiment, as data: its directory name below the experiment directory,
    the registered trainer that trains it, and that trainer's configuration (a dataclass of the
    trainer's ``config_type``). ``info`` is copied into the run's summary (what the verdict
    needs to know about the run beyond its metrics: a case, a model family, a seed)."""

    name: str
    config: Any
    trainer: str = "fit"
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A (nested) dataclass as ``{"dotted.field": value}``."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            out.update(_flat(v, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = v
    return out


def _split(settings: Any, overrides: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``overrides`` as (those of the settings ``settings``: a key whose first part names one of
    its fields, or no key at all; every other, for the run configurations), each in order."""
    names = {f.name for f in dataclasses.fields(settings)}
    own = [o for o in overrides if "=" not in o or o.split("=", 1)[0].strip()
           .split(".", 1)[0] in names]
    return own, [o for o in overrides if o not in own]


def ladder_differences(exp: Experiment, rung: Rung) -> dict[str, tuple[Any, Any]]:
    """``{field: (rung value, paper-scale value)}`` for every run-configuration field in which
    ``rung``'s runs differ from the same-named runs at the paper scale (``runs`` when the two
    train different sets of runs)."""
    _, mine = exp.resolve(rung.scale, list(rung.overrides))
    _, paper = exp.resolve("paper")
    mine_by, paper_by = {r.name: r for r in mine}, {r.name: r for r in paper}
    out: dict[str, tuple[Any, Any]] = {}
    if set(mine_by) != set(paper_by):
        out["runs"] = (sorted(mine_by), sorted(paper_by))
    for name in sorted(set(mine_by) & set(paper_by)):
        a, b = _flat(mine_by[name].config), _flat(paper_by[name].config)
        for key in sorted(set(a) | set(b)):
            if key in ("name", "label") or a.get(key) == b.get(key):
                continue
            out.setdefault(key, (a.get(key), b.get(key)))
    return out


#: run-configuration fields that tell the runs apart, never one value for all of them: ``--set``
#: may not set them (seeds are the ``seeds`` setting)
IDENTITY_FIELDS = ("name", "label", "seed")
_ABSENT = "<absent>"


def _run_fields(cfg: Any) -> dict[str, Any]:
    """A run configuration as ``{"dotted.field": value}``, dicts (``model.overrides``) down to
    their leaves, each value as config.json holds it."""
    def leaves(v: Any, prefix: str) -> dict[str, Any]:
        if isinstance(v, dict) and v:
            return {k: x for key, item in v.items() for k, x in leaves(item, f"{prefix}.{key}")
                    .items()}
        return {prefix: v}
    form = json_form(dataclasses.asdict(cfg))
    return {k: x for key, v in form.items() for k, x in leaves(v, key).items()}


def _values(fields: list[str], runs: list[Run], built: list[dict[str, Any]]) -> str:
    """The runs' distinct values of ``fields``, each with the first run that has it."""
    shown: dict[str, str] = {}
    for run, b in zip(runs, built, strict=True):
        value = ({f: b.get(f, _ABSENT) for f in fields} if len(fields) > 1
                 else b.get(fields[0], _ABSENT))
        shown.setdefault(repr(value), f"{run.name}: {value}")
    return "; ".join(list(shown.values())[:4]) + ("; …" if len(shown) > 4 else "")


def _controls(key: str, names: list[str]) -> list[str]:
    """The settings fields among ``names`` that by their name set run field ``key``: optim.lr →
    sgd_lr, adam_lr; model.name → models; seed → seeds; weight_decay → wd_range."""
    parts = key.split(".")[-2:]
    parts += ["".join(w[0] for w in p.split("_")) for p in parts if "_" in p]
    return [n for n in names if any(p in n.split("_") or n in (p + "s", p + "es") for p in parts)]


def seeded_name(name: str, seed: int) -> str:
    """The run name of seed ``seed`` of run ``name``: seed 0 keeps the plain name, so adding
    seeds to an experiment keeps its finished runs."""
    return name if seed == 0 else f"{name}-s{seed}"


def fit_runs(models: dict[str, list[str]], common: list[str], seeds: int = 1) -> list[Run]:
    """``seeds`` :class:`Run` s per model name for the standard loop (``"fit"``): the model's
    name is its run name (:func:`seeded_name`) and label, the ``common`` overrides apply first,
    then the model's own; seed k sets ``seed=k``."""
    out = []
    for seed in range(seeds):
        for name, extra in models.items():
            cfg = RunConfig(name=seeded_name(name, seed), label=name, seed=seed)
            cfg.model.name = name
            out.append(Run(cfg.name, apply_overrides(cfg, common + extra),
                           info={"seed": seed}))
    return out


class Experiment:
    """Subclass, set the class attributes, define :meth:`runs` and :meth:`verdict`, and register
    with ``@register_experiment("name")``."""

    name: str = ""
    paper: str = ""
    claim: str = ""
    #: for an experiment never run here only: a guess at the CPU-scale runtime, labelled as one
    #: (e.g. "~10 min (estimate: CIFAR-10 is not available here)"). Measured runtimes are never
    #: typed: they live in the records (``reproduction/<name>.json``, ``runtime_s``), which
    #: REPRODUCTION.md and ``senslab list experiments`` read.
    runtime_estimate: str = ""
    #: how the CPU-scale runs differ from the paper (smaller model, data subset, fewer epochs...);
    #: shown in REPRODUCTION.md next to the result
    cpu_scale_note: str = ""
    #: why the CPU-scale runs cannot run on this kind of machine (e.g. "CIFAR-10 must be placed
    #: in data.root"), shown in REPRODUCTION.md when no result has been recorded
    requires: str = ""
    #: the settings, one :class:`Settings` instance per scale of :data:`SCALES`
    scales: ClassVar[dict[str, Settings]] = {}
    #: scales at which the runs train on one intra-op thread (models of a few kilobytes on a
    #: shared machine lose far more to thread hand-offs than they gain)
    one_thread_at: ClassVar[tuple[str, ...]] = ()
    #: whether :meth:`verdict` judges every run it is given, seed replicates included. A
    #: verdict that compares one run per model is not: with ``seeds`` > 1 its runs are trained
    #: and recorded, but the verdict is "not comparable" rather than read from one seed of each
    seed_aware: ClassVar[bool] = False
    #: the scale ladder, smallest rung first (docs/definitions.md#scale-ladders); empty for an
    #: experiment whose CPU-scale verdict needs none. Committed before any of its runs.
    ladder: ClassVar[tuple[Rung, ...]] = ()
    #: the effect (a key of the verdict's ``effects``) the ladder follows; None: every part
    ladder_effects: ClassVar[tuple[str, ...] | None] = None
    #: the run-configuration fields through which alone the seed replicates of a label differ,
    #: and why (empty: the model seed differs them too); overrides that give such a field one
    #: value for every replicate are refused, since the verdict would count identical runs as
    #: independent seeds
    replicated_by: ClassVar[tuple[str, ...]] = ()
    replicated_why: ClassVar[str] = ""

    # -- the spec ------------------------------------------------------------------------------
    def runs(self, settings: Any) -> list[Run]:
        """The runs of this experiment for ``settings``."""
        raise NotImplementedError

    def before_training(self, settings: Any) -> None:
        """Called before anything is written, after every run's trainer found its data: check
        what the runs need beyond it (data read only after training, a package)."""

    def before_run(self, run: Run, path: Path, log: Callable[[str], None]) -> None:
        """Called before ``run`` trains into ``path`` (e.g. to copy a finished identical run)."""

    def after_run(self, run: Run, path: Path, summary: dict[str, Any], settings: Any,
                  log: Callable[[str], None]) -> dict[str, Any]:
        """Measurements of the finished run in ``path``, added to its summary for the verdict
        (cached in the run directory by the experiment; default: none)."""
        return summary

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        """``{"verdict": "supported" | "contradicted" | "inconclusive" | "not comparable",
        "reason": ..., "evidence": {...}, "effects": {...}}`` computed from the run summaries
        with the rules of :mod:`senslab.verdicts` (:func:`~senslab.verdicts.verdict`,
        :func:`~senslab.verdicts.not_comparable`)."""
        raise NotImplementedError

    # -- resolving overrides -------------------------------------------------------------------
    def resolve(self, scale: str, overrides: list[str] | tuple[str, ...] = ()
                ) -> tuple[Any, list[Run]]:
        """(settings, runs) at ``scale`` with ``overrides`` applied and checked (see the
        module docstring for where each key goes); nothing is written."""
        if check_scale(scale) not in self.scales:
            raise ValueError(f"{self.name} has no settings for scale {scale!r}")
        settings = copy.deepcopy(self.scales[scale])
        own, rest = _split(settings, overrides)
        validate(apply_overrides(settings, own))
        runs = self.runs(settings)
        built = [_run_fields(run.config) for run in runs]  # before the overrides: as runs() set
        seen: set[str] = set()
        for run in runs:
            if run.name in seen:
                raise ValueError(f"{self.name}: two runs are named {run.name!r}")
            seen.add(run.name)
            try:
                apply_overrides(run.config, rest)
            except UnknownKey as err:  # in neither: name the closest key of both
                raise unknown_key(err.key, settings, run.config) from None
        if rest and not runs:
            raise unknown_key(rest[0].split("=", 1)[0].strip(), settings)
        for item in rest:
            self._refuse_per_run(item, settings, runs, built)
        for run in runs:  # after the per-run refusal, which names the settings field to use
            validate(run.config)
        for item in own:
            self._refuse_ignored(item, scale, own, settings, runs, built)
        self._refuse_identical_replicates(overrides, runs)
        as_built = copy.deepcopy(settings)  # the settings that built ``built``
        for item in rest:
            self._take_into_settings(item, own, as_built, settings, runs, built)
        return settings, runs

    def _take_into_settings(self, item: str, own: list[str], as_built: Any, settings: Any,
                            runs: list[Run], built: list[dict[str, Any]]) -> None:
        """Give ``settings`` (``as_built``: as they built ``built``) the value of the
        run-configuration override ``item`` when a settings field not given itself sets that
        run field to its own value and, set to this one, builds the very runs that ``item``
        made (``train.epochs=10`` is ``epochs=10``, ``stop_below=0.01`` is ``stop_loss=0.01``):
        the settings then say what ran — what :meth:`after_run`, :meth:`before_training` and
        the experiment's own checks read — and a value that the setting refuses (:meth:`runs`
        raising) is refused under the run key too. The settings kept their own value: the runs
        trained one thing while the settings said another, and a refused value passed."""
        key, value = (s.strip() for s in item.split("=", 1))
        final = [_run_fields(run.config) for run in runs]
        under = sorted({f for b in (*built, *final) for f in b
                        if f == key or f.startswith(key + ".")})
        if len(under) != 1 or all(b.get(under[0], _ABSENT) == f.get(under[0], _ABSENT)
                                  for b, f in zip(built, final, strict=True)):
            return  # a whole dict, or no change: no one setting stands for it
        field = under[0]
        given = {o.split("=", 1)[0].strip().split(".", 1)[0] for o in own if "=" in o}
        refused: ValueError | None = None
        for f in dataclasses.fields(as_built):
            if f.name in given or f.name in ("seeds", *IDENTITY_FIELDS):
                continue
            mine = json_form(getattr(as_built, f.name))
            if any(b.get(field, _ABSENT) != mine for b in built):
                continue  # the runs do not carry this setting's value in that field
            trial = copy.deepcopy(as_built)
            try:
                validate(apply_overrides(trial, [f"{f.name}={value}"]))
            except (KeyError, TypeError, ValueError):
                continue  # not a value of this setting
            try:
                made = self.runs(trial)
            except ValueError as err:  # refused, unless another setting gives these runs
                refused = refused or ValueError(
                    f"--set {item}: {self.name} sets {field} from its setting {f.name} "
                    f"({f.name}={getattr(as_built, f.name)!r} here), so this is --set "
                    f"{f.name}={value}, which is refused: {err}")
                continue
            # the runs as built, but for this override's field (other overrides aside)
            want = [{**b, field: fin[field]} if field in fin else
                    {k: v for k, v in b.items() if k != field}
                    for b, fin in zip(built, final, strict=True)]
            if [r.name for r in made] != [r.name for r in runs] or any(
                    _run_fields(r.config) != w for r, w in zip(made, want, strict=True)):
                continue  # this setting sets more, or other, fields than the override
            setattr(settings, f.name, getattr(trial, f.name))
            return
        if refused is not None:
            raise refused

    def _refuse_identical_replicates(self, overrides: list[str] | tuple[str, ...],
                                     runs: list[Run]) -> None:
        """Refuse overrides under which two seed replicates of a label agree on every field of
        :attr:`replicated_by`: they would train the same run twice."""
        if not self.replicated_by:
            return
        by_label: dict[str, list[dict[str, Any]]] = {}
        for run in runs:
            by_label.setdefault(run.config.label, []).append(_run_fields(run.config))
        for label, fields in by_label.items():
            if len(fields) < 2:
                continue
            values = {repr([f.get(k, _ABSENT) for k in self.replicated_by]) for f in fields}
            if len(values) > 1:
                continue
            keys = ", ".join(self.replicated_by)
            named = [o for o in overrides if "=" in o and any(
                k == (key := o.split("=", 1)[0].strip()) or k.startswith(key + ".")
                for k in self.replicated_by)]
            said = f"--set {named[0]}" if named else "the overrides"
            raise ValueError(
                f"{said}: {self.name}'s seed replicates differ only in {keys} "
                f"({self.replicated_why}), and {said.removeprefix('--set ')} gives every "
                f"replicate of {label!r} the same one: its {len(fields)} seeds would train the "
                "same run while the verdict counts them as independent seeds. Leave "
                f"{keys} to the seeds (seed k uses k), or run seeds=1")

    def _refuse_ignored(self, item: str, scale: str, own: list[str], settings: Any,
                        runs: list[Run], built: list[dict[str, Any]]) -> None:
        """Refuse the settings override ``item`` when its field is also a run-configuration field
        that :meth:`runs` sets per run from other settings (e.g. a learning rate drawn from a
        range): the override would be recorded but change no run."""
        key = item.split("=", 1)[0].strip()
        fields = [f for f in sorted({f for b in built for f in b})
                  if (f == key or f.startswith(key + "."))
                  and len({repr(b.get(f, _ABSENT)) for b in built}) > 1]
        if not fields:
            return
        without = copy.deepcopy(self.scales[scale])
        apply_overrides(without, [o for o in own if o is not item])
        before = self.runs(without)
        if [r.name for r in before] != [r.name for r in runs]:
            return
        if any(_run_fields(r.config).get(f, _ABSENT) != b.get(f, _ABSENT)
               for r, b in zip(before, built, strict=True) for f in fields):
            return  # the setting reaches the runs
        names = [f.name for f in dataclasses.fields(settings)]
        control = [n for n in _controls(key, names) if n != key]
        how = (f"set {'them' if len(control) > 1 else 'it'} through "
               f"{', '.join(control)}" if control else "it cannot be set for these runs")
        raise ValueError(
            f"--set {item}: {self.name} sets {key} per run from other settings "
            f"({_values(fields, runs, built)}), so this setting would be recorded but change no "
            f"run; {how} ({self.name}'s settings: {', '.join(names)})")

    def _refuse_per_run(self, item: str, settings: Any, runs: list[Run],
                        built: list[dict[str, Any]]) -> None:
        """Refuse the run-configuration override ``item`` when :meth:`runs` sets its key per run
        (an identity field, or a value that differs between the runs as built): one value for
        every run would train the same thing under each run's name and label, and the verdict
        would compare labels that no longer differ."""
        key = item.split("=", 1)[0].strip()
        fields = sorted({f for b in built for f in b if f == key or f.startswith(key + ".")})
        differ = [f for f in fields if len({repr(b.get(f, _ABSENT)) for b in built}) > 1]
        if not differ and key not in IDENTITY_FIELDS:
            return
        seeds = [run.info.get("seed", b.get("seed")) for run, b in zip(runs, built, strict=True)]
        by_seed = list(zip(built, seeds, strict=True))
        compared = any(  # differs between runs of one seed: the factor the claim compares
            len({repr(b.get(f, _ABSENT)) for b, s in by_seed if s == seed}) > 1
            for f in differ for seed in set(seeds))
        if key in ("name", "label"):
            why = ("it names each run (its label in the summaries, which the verdict reads): one "
                   "value would give every run the same one")
        elif compared:
            why = ("it differs between the runs the verdict compares (it goes with each one's "
                   "model, method or function): one value for every run would change what each "
                   "of them trains, and the verdict would compare runs that no longer differ as "
                   "their labels say")
        else:
            why = ("the seed replicates are replicated over it: one value for every run would "
                   "make them identical while the verdict counts them as independent seeds")
        values = _values(differ or [key], runs, built)
        names = [f.name for f in dataclasses.fields(settings)]
        control = _controls(key, names)
        how = (f"set it through the settings field{'s' if len(control) > 1 else ''} "
               f"{', '.join(control)}" if control else
               f"no settings field of {self.name} changes it")
        raise ValueError(
            f"--set {item}: {self.name} sets {key} per run ({values}), and {why}. {how[0].upper()}"
            f"{how[1:]} ({self.name}'s settings: {', '.join(names)}); a single run of your own "
            "is `senslab train`")

    def settings(self, scale: str, overrides: list[str] | tuple[str, ...] = ()) -> Any:
        """The settings at ``scale`` with ``overrides`` applied and checked."""
        return self.resolve(scale, overrides)[0]

    def configs(self, scale: str, overrides: list[str] | tuple[str, ...] = ()) -> list[Any]:
        """Every run's configuration at ``scale`` with ``overrides`` applied and checked."""
        return [run.config for run in self.resolve(scale, overrides)[1]]

    def check(self, scale: str, overrides: list[str]) -> None:
        """Resolve ``overrides`` at ``scale`` without writing anything: an unknown key, a value
        of the wrong type or out of range, a setting a run-configuration override undoes
        (:meth:`_refuse_overwritten`) fails here, before any directory exists."""
        self._refuse_overwritten(scale, overrides, self.resolve(scale, overrides)[1])

    def _refuse_overwritten(self, scale: str, overrides: list[str] | tuple[str, ...],
                            runs: list[Run]) -> None:
        """Refuse a settings override when a run-configuration override (applied after the
        settings built the runs) sets a run field that the setting set to another value:
        ``--set epochs=10 --set train.epochs=3`` trained 3 epochs while experiment.json, the
        verdict and the record said ``epochs=10`` too, and ``--set sigma=0.3 --set
        track.sigma=2`` measured at σ = 2 under settings of σ = 0.3. Called after
        :meth:`resolve` (an experiment's own, more specific refusals of such a pair first)."""
        own, rest = _split(self.scales[scale], overrides)
        if not own or not rest:
            return
        settings = apply_overrides(copy.deepcopy(self.scales[scale]), own)
        built = [_run_fields(r.config) for r in self.runs(settings)]  # before ``rest``
        if len(built) != len(runs):
            return
        for i, item in enumerate(own):
            without = copy.deepcopy(self.scales[scale])
            apply_overrides(without, [o for j, o in enumerate(own) if j != i])
            mine: set[str] | None = None  # the fields it sets (None: those ``without`` lacks)
            try:
                before = self.runs(without)
            except ValueError:
                # the other settings alone are refused (``converged_loss=0.001`` without its
                # ``stop_loss=none``): that refusal named a value never given. Its own effect is
                # then the scale's runs against those with it alone
                try:
                    before = self.runs(copy.deepcopy(self.scales[scale]))
                    alone = self.runs(apply_overrides(copy.deepcopy(self.scales[scale]), [item]))
                except ValueError:
                    continue
                if [r.name for r in alone] != [r.name for r in before]:
                    continue
                mine = {f for a, o in zip(alone, before, strict=True)
                        for f, v in _run_fields(a.config).items()
                        if _run_fields(o.config).get(f, _ABSENT) != v}
            if [r.name for r in before] != [r.name for r in runs]:
                continue  # it changes which runs there are
            for run, b, old in zip(runs, built, before, strict=True):
                prior, final = _run_fields(old.config), _run_fields(run.config)
                undone = [f for f in sorted(set(b) | set(prior))
                          if b.get(f, _ABSENT) != prior.get(f, _ABSENT)
                          and final.get(f, _ABSENT) != b.get(f, _ABSENT)
                          and (mine is None or f in mine)]
                if not undone:
                    continue
                f = undone[0]
                by = [o for o in rest
                      if f == (k := o.split("=", 1)[0].strip()) or f.startswith(k + ".")]
                said = f"--set {by[-1]}" if by else "a run-configuration override"
                raise ValueError(
                    f"--set {item}: it sets {f} of {self.name}'s run {run.name} to "
                    f"{b.get(f, _ABSENT)!r}, but {said} sets it to {final.get(f, _ABSENT)!r} "
                    f"after it (run-configuration overrides apply to the runs the settings "
                    f"built): the runs would have {f} = {final.get(f, _ABSENT)!r} while the "
                    f"verdict and the record say {item}. Give one of the two")

    # -- running -------------------------------------------------------------------------------
    def prepare(self, scale: str, overrides: list[str]) -> tuple[Any, list[Run]]:
        """(settings, runs) as :meth:`resolve`, with every run's trainer check (its data found,
        the combinations of fields it refuses) and :meth:`before_training` passed: everything
        that can refuse the runs, done before anything is written."""
        settings, runs = self.resolve(scale, overrides)
        self._refuse_overwritten(scale, overrides, runs)
        for run in runs:  # before any training: a missing dataset stops the experiment here
            trainer = get_trainer(run.trainer)
            if not isinstance(run.config, trainer.config_type):
                raise TypeError(f"{self.name}: run {run.name} gives trainer {run.trainer!r} a "
                                f"{type(run.config).__name__}, not a "
                                f"{trainer.config_type.__name__}")
            if trainer.check is not None:
                trainer.check(run.config)
        self.before_training(settings)
        return settings, runs

    def check_run_dirs(self, out: Path, runs: list[Run]) -> None:
        """Every run's trainer ``check_dir`` (:class:`~senslab.train.trainers.Trainer`) on its
        directory below ``out``: what the runs refuse before they train — a run of other
        settings that trained under the same name (``--set epochs=20`` over a finished
        experiment), a checkpoint of a newer senslab, … — refused before anything is written or
        set aside (:func:`run_experiment`). Reads only."""
        for run in runs:
            check = get_trainer(run.trainer).check_dir
            if check is not None:
                check(run.config, out / run.name)

    def execute(self, out: Path, scale: str, overrides: list[str],
                progress: bool | None, log: Callable[[str], None],
                prepared: tuple[Any, list[Run]] | None = None) -> list[dict[str, Any]]:
        """Train every run into ``out/<run name>`` with its trainer (finished runs are reused,
        interrupted ones resume) and return the summaries, each with the run's ``info`` and
        :meth:`after_run`'s measurements. ``prepared``: what :meth:`prepare` returned for these
        settings (else it is called here)."""
        settings, runs = prepared if prepared is not None else self.prepare(scale, overrides)
        write_experiment_json(out, self, scale, [r.name for r in runs])
        summaries = []
        with single_thread() if scale in self.one_thread_at else nullcontext():
            for i, run in enumerate(runs, 1):
                log(f"[{i}/{len(runs)}] {run.name} ({run.trainer})")
                path = out / run.name
                self.before_run(run, path, log)
                summary = get_trainer(run.trainer).train(run.config, path, progress=progress,
                                                          log=log)
                if any(summary.get(k) != v for k, v in run.info.items()):
                    # the run's info (its seed) in summary.json too, so that load_summaries
                    # gives the verdict what execute gives it
                    stored = RunDir(path).read_json("summary.json")
                    RunDir(path).write_json("summary.json", {**stored, **run.info})
                summary = {**summary, **run.info}
                summaries.append(self.after_run(run, path, summary, settings, log))
        return summaries


def write_experiment_json(out: Path, exp: Experiment, scale: str, runs: list[str]) -> None:
    """experiment.json: the experiment's name, paper, claim, scale and run subdirectories."""
    RunDir(out, kind="experiment").write_json("experiment.json", {
        "name": exp.name, "paper": exp.paper, "claim": exp.claim, "scale": scale, "runs": runs,
    })


EXPERIMENTS: Registry[Callable[[], Experiment]] = Registry("experiment")


def register_experiment(name: str) -> Callable[[type[Experiment]], type[Experiment]]:
    def deco(cls: type[Experiment]) -> type[Experiment]:
        cls.name = name
        EXPERIMENTS.register(name)(cls)
        return cls

    return deco


def list_experiments(pattern: str = "*") -> list[str]:
    return EXPERIMENTS.names(pattern)


def get_experiment(name: str) -> Experiment:
    return EXPERIMENTS.get(name)()


def run_experiment(name: str, out_dir: str | Path, scale: str = "cpu",
                   overrides: list[str] | None = None, progress: bool | None = None,
                   log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train every run of experiment ``name`` (resuming finished/partial ones), write
    experiment.json and verdict.json, and return the verdict.

    ``scale`` is one of :data:`SCALES`; ``overrides`` (``["key=value", ...]``) are checked before
    anything is written (:meth:`Experiment.check`). The experiment directory is locked for the
    whole call: a second ``senslab run`` on it fails at once (see
    :meth:`senslab.train.rundir.RunDir.writing`). What the runs would refuse in their
    directories (:meth:`Experiment.check_run_dirs`) is refused before a verdict of other settings
    is set aside, and when the call fails before any run trained, the verdict and
    experiment.json are put back: a refused invocation leaves a finished directory finished."""
    check_scale(scale)
    exp = get_experiment(name)
    prepared = exp.prepare(scale, list(overrides or []))  # refusals before any directory exists
    out = Path(out_dir)
    with RunDir(out, kind="experiment").writing():
        return _run_locked(exp, out, scale, list(overrides or []), progress, log, prepared)


def _run_locked(exp: Experiment, out: Path, scale: str, overrides: list[str],
                progress: bool | None, log: Callable[[str], None],
                prepared: tuple[Any, list[Run]] | None = None) -> dict[str, Any]:
    if prepared is None:
        prepared = exp.prepare(scale, overrides)
    try:
        held = json.loads((out / "experiment.json").read_text()).get("name")
    except FileNotFoundError:
        held = None
    except (OSError, ValueError, AttributeError) as err:
        # it names the experiment whose runs the directory holds: unread, another experiment
        # trained into the directory beside them (and set their verdict aside)
        raise RunDirError(f"{out}/experiment.json cannot be read ({type(err).__name__}: {err}), "
                          "so which experiment's runs the directory holds is unknown; restore "
                          "it, or choose another --out") from None
    if held is not None and held != exp.name:
        raise RunDirError(f"{out} holds the runs of experiment {held!r}, not {exp.name!r}; "
                          f"choose another --out for {exp.name}")
    # the runs' own refusals (a run of other settings under the same name), while the directory
    # is as it was: refused after the verdict below was set aside, the directory read as
    # unfinished until re-run with its old settings
    exp.check_run_dirs(out, prepared[1])
    previous = _previous_verdict(out, scale, overrides)
    now_listed = [r.name for r in prepared[1]]
    other_runs = previous is not None and listed_runs(out) != now_listed
    if other_runs:
        # the same scale and overrides, but other runs (a newer senslab changed the experiment's
        # runs or a default such as its seeds): kept in place, that verdict stayed beside an
        # experiment.json listing runs it never judged when this invocation stopped early
        previous = None
    damaged = _damaged_verdict(out)
    #: how to put a verdict of other settings back (:func:`_put_back`)
    undo: tuple[str, bytes, dict[str, tuple[int, int]]] | None = None
    if damaged is not None:
        # unreadable, so of unknown settings: kept for inspection, never taken for a verdict
        kept = _set_verdict_aside(out, DAMAGED)
        log(f"{out}/verdict.json is damaged ({damaged}): moved to {kept}; the verdict is "
            "computed again (runtime_s then counts the runs' training time and this "
            "invocation's other time, not an earlier invocation's measurements)")
    elif previous is None and (out / "verdict.json").is_file():
        # the verdict of other settings (scale, overrides) no longer describes this directory
        # once experiment.json names the new runs: kept aside, not shown as this run's verdict
        listing = _read_bytes(out / "experiment.json")
        untouched = _run_files(out)
        kept = _set_verdict_aside(out, SUPERSEDED)
        what = (f"the same settings but other runs than they now give ({len(now_listed)} "
                "runs, a list that differs from experiment.json's)" if other_runs
                else "other settings")
        log(f"{out}/verdict.json was written for {what}: moved to {kept}")
        if listing is not None:
            undo = (kept, listing, untouched)
    before = _finished_runs(out)
    trained_before = _seconds_so_far(out)
    start = time.perf_counter()
    try:
        summaries = exp.execute(out, scale, overrides, progress, log, prepared)
    except BaseException:
        # a refusal no check could make before training (a checkpoint of another model, say),
        # or a Ctrl-C, before any run wrote a thing: the verdict set aside still describes the
        # runs, all as they were
        if undo is not None and _run_files(out) == undo[2]:
            _put_back(out, undo[0], undo[1])
            log(f"{out}: no run was trained, so verdict.json (set aside as {undo[0]}) and "
                "experiment.json are put back as they were")
        raise
    seeds = exp.settings(scale, overrides).seeds
    if seeds > 1 and not exp.seed_aware:
        verdict = {"verdict": "not comparable", "evidence": {},
                   "reason": f"{seeds} seeds per run: {exp.name}'s verdict compares one run per "
                             "model and is not computed over seeds; every run is trained and "
                             "its numbers are in its run directory (seeds=1 gives the "
                             "single-seed verdict)"}
    else:
        verdict = exp.verdict(summaries)
    seconds = round(time.perf_counter() - start, 1)
    # Provenance for REPRODUCTION.md: the cost of every run the verdict rests on. Re-running the
    # same settings reuses the finished runs and trains nothing: the runtime stays the earlier
    # one, and this invocation's time is kept apart. Otherwise (new settings reuse finished runs
    # of earlier ones, add seeds, or go back to fewer) it is the training time of the runs
    # experiment.json lists, each its own summary's over every sitting, plus this invocation's
    # time outside training them (measurements, the verdict).
    runtime = seconds
    grew = bool(set(_finished_runs(out)) - before)
    listed = run_seconds(out, listed_runs(out))
    if previous and "runtime_s" in previous and not grew:
        runtime = previous["runtime_s"]
    elif listed:
        trained_now = sum(v - trained_before.get(k, 0.0) for k, v in listed.items())
        runtime = round(sum(listed.values()) + max(0.0, seconds - trained_now), 1)
    commit = git_commit()
    # the code behind the numbers: a run trained (or resumed) by another commit than the one
    # judging it carries that code's results into this verdict
    run_commits = sorted({c for r in listed_runs(out) or [] for c in commits_of(out / r)})
    relation = {c: commit_relation(c, commit) for c in run_commits} if commit is not None else {}
    others = [_short(c) for c, how in relation.items() if how == "other"]
    if others:
        log(f"{out}: runs trained by other commits than this one ({_short(commit)}): "
            f"{', '.join(others)}; their numbers are that code's (run_commits in verdict.json)")
    unknown = [_short(c) for c, how in relation.items() if how == "unknown"]
    if unknown:  # the same commit, but git status failed in one sitting: no difference claimed
        log(f"{out}: runs trained by commit {', '.join(unknown)}, judged by {_short(commit)}: "
            "the same commit, but git status failed when one of the two started (+unknown), "
            "so whether the code under src/ differs cannot be determined (run_commits in "
            "verdict.json)")
    verdict.update(scale=scale, overrides=list(overrides), runtime_s=runtime,
                   last_invocation_s=seconds,
                   finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   commit=commit, run_commits=run_commits, seeds=seeds, device=device_name(),
                   threads=1 if scale in exp.one_thread_at else torch.get_num_threads())
    verdict = plain(verdict)  # evidence may hold NaN (an undefined ratio): JSON has no NaN
    RunDir(out, kind="experiment").write_json("verdict.json", verdict)
    return verdict


def device_name() -> str:
    """The machine the runs trained on, for the records: the GPU's name when CUDA is used
    (trainers pick it when available), else the CPU's model, core count and the vector kernels
    PyTorch uses (AVX2 and AVX-512 kernels give different float results)."""
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (CUDA)"
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    kernels = torch.backends.cpu.get_cpu_capability()  # the vector kernels ATen dispatched to
    return f"CPU: {model or platform.machine()}, {os.cpu_count()} cores, {kernels} kernels"


def _finished_runs(out: Path) -> set[str]:
    """The names of the finished runs (a summary.json) directly below ``out``."""
    return {p.parent.name for p in out.glob("*/summary.json")}


def _seconds_so_far(out: Path) -> dict[str, float]:
    """Each run's training time before this invocation: a finished run's summary ``seconds``,
    an unfinished one's last logged ``time`` (its sittings so far, up to that record), so that
    the time an invocation spends outside training is not charged to an earlier sitting."""
    found = run_seconds(out)
    for log in out.glob("*/metrics.jsonl"):
        name = log.parent.name
        if name in found:
            continue
        try:
            lines = log.read_bytes().splitlines()
            last = json.loads(lines[-1]) if lines else {}
        except (OSError, ValueError):
            continue  # a torn last line: counted as nothing, as a resume cuts it
        t = last.get("time") if isinstance(last, dict) else None
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            found[name] = float(t)
    return found


def listed_runs(out: str | Path) -> list[str] | None:
    """The run subdirectories ``out``'s experiment.json lists (the runs its verdict rests on;
    a directory may also hold runs of other settings), or None where it lists none."""
    try:
        runs = json.loads((Path(out) / "experiment.json").read_text()).get("runs")
    except (OSError, ValueError, AttributeError):
        return None
    return [str(r) for r in runs] if isinstance(runs, list) else None


def run_seconds(out: str | Path, names: list[str] | None = None) -> dict[str, float]:
    """Each finished run's training time (its summary.json ``seconds``: wall clock over every
    sitting that trained it) below ``out``, by name: those of ``names`` (None: every run)."""
    found: dict[str, float] = {}
    for summary in sorted(Path(out).glob("*/summary.json")):
        name = summary.parent.name
        if names is not None and name not in names:
            continue
        try:
            seconds = json.loads(summary.read_text()).get("seconds")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
            found[name] = float(seconds)
    return found


#: where a verdict.json of other settings goes when the directory is run with new ones (the
#: second such file goes to verdict.superseded.2.json, and so on: :func:`_set_verdict_aside`)
SUPERSEDED = "verdict.superseded.json"
#: where an unreadable verdict.json goes (a truncated or damaged file; the second to
#: verdict.damaged.2.json, and so on)
DAMAGED = "verdict.damaged.json"


def _set_verdict_aside(out: Path, name: str) -> str:
    """Move ``out``'s verdict.json to ``name`` (:data:`DAMAGED` or :data:`SUPERSEDED`) or, when
    an earlier one is kept there, to the first free ``verdict.<kind>.<N>.json`` (N = 2, 3, …),
    so that no verdict set aside before is overwritten; returns the name it was moved to."""
    stem = name.removesuffix(".json")
    n = 1
    while (out / (kept := name if n == 1 else f"{stem}.{n}.json")).exists():
        n += 1
    os.replace(out / "verdict.json", out / kept)
    return kept


def _read_bytes(path: Path) -> bytes | None:
    """``path``'s bytes; None when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError:
        return None


#: files a run's writer leaves in its directory without training (the lock, its owner, the
#: format marker): they tell nothing about whether a run trained
_NOT_TRAINING = (LOCK_FILE, OWNER_FILE, MARKER)


def _run_files(out: Path) -> dict[str, tuple[int, int]]:
    """(size, modification time) of every file in ``out``'s subdirectories (its runs), but
    :data:`_NOT_TRAINING`: unchanged over an invocation, no run wrote anything."""
    found: dict[str, tuple[int, int]] = {}
    for path in out.glob("*/**/*"):
        try:
            stat = path.stat()
        except OSError:  # removed while listed
            continue
        if path.is_file() and path.name not in _NOT_TRAINING:
            found[str(path.relative_to(out))] = (stat.st_size, stat.st_mtime_ns)
    return found


def _put_back(out: Path, kept: str, listing: bytes) -> None:
    """Undo :func:`_set_verdict_aside` (verdict.json set aside as ``kept``) and the
    experiment.json an invocation wrote over ``listing``."""
    atomic_write_bytes(out / "experiment.json", listing)
    os.replace(out / kept, out / "verdict.json")


def _damaged_verdict(out: Path) -> str | None:
    """Why ``out``'s verdict.json cannot be read as a verdict (not JSON, or not an object);
    None when it reads, or when there is none."""
    try:
        old = json.loads((out / "verdict.json").read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as err:
        return f"not valid JSON: {err.msg}, line {err.lineno}"
    except (OSError, ValueError) as err:
        return str(err)
    return None if isinstance(old, dict) else f"a JSON {type(old).__name__}, not an object"


def _previous_verdict(out: Path, scale: str, overrides: list[str]) -> dict[str, Any] | None:
    """The verdict.json of an earlier run of the same experiment settings in ``out``, if any."""
    try:
        old = json.loads((out / "verdict.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(old, dict):
        return None
    same = old.get("scale") == scale and old.get("overrides") == overrides
    return old if same else None


def load_summaries(exp_dir: str | Path) -> list[dict[str, Any]]:
    """The runs' summaries, as :meth:`Experiment.execute` gives them to the verdict. A
    summary.json written before the run's ``info`` was stored in it (before 2026-11-30) has no
    ``seed``: it is taken from the run's config.json, whose ``seed`` is the one ``info`` held."""
    exp = json.loads((Path(exp_dir) / "experiment.json").read_text())
    out = []
    for r in exp["runs"]:
        summary = json.loads((Path(exp_dir) / r / "summary.json").read_text())
        config = Path(exp_dir) / r / "config.json"
        if "seed" not in summary and config.exists():
            seed = json.loads(config.read_text()).get("seed")
            if isinstance(seed, int):
                summary["seed"] = seed
        out.append(summary)
    return out

