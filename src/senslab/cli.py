"""The ``senslab`` command: train, measure, run experiments, report, list.

    senslab list models|datasets|experiments
    senslab train --model vit_small --data mnist --set optim.lr=0.05 --out runs/vit
    senslab measure --model mlp --data digits [--checkpoint runs/x] --sigma 0.5
                    [--set device=cuda --autocast bf16 --compile]
    senslab run demo [--scale cpu|paper] [--out runs/demo]
    senslab run mnist_binary --scale ladder [--rungs cpu,plateau] [--out runs/ladder/NAME]
    senslab report runs/demo [more run or experiment dirs --out DIR]
    senslab demo            # = senslab run demo, then the report
    senslab reproduction    # record runs/<name> results, regenerate REPRODUCTION.md

Failures. An error the user can act on is one line on stderr, ``senslab: error: <what was wrong
and how to fix it>``, and no traceback; the exit status says what kind:

    2    bad input: an unknown or out-of-range option or config value, a missing data file or
         run directory, a damaged config.json or checkpoint (senslab's ValueError, TypeError,
         KeyError, FileNotFoundError, ImportError and their subclasses)
    1    the work failed: the training loss became NaN (FloatingPointError), a file could not be
         written (OSError: the message names the path), a RuntimeError raised by senslab's
         own code (its message is written for the user), or a warning that the warnings
         filter (``-W error``, PYTHONWARNINGS) made an error (its message, said to be one)
    130  interrupted by Ctrl-C; an interrupted training run says at which step, and that
         re-running the same command resumes it
    141  stdout was closed early (``senslab list experiments | head -1``): nothing is printed,
         the status a shell reports for a command ended by SIGPIPE

Any other exception (and a RuntimeError raised inside torch or another library) is unexpected —
most likely a bug: it is reported in one line with its type, and the hint to re-run with
``SENSLAB_DEBUG=1`` (any value but 0), which lets every exception through with its full
traceback. Warnings are one line too, ``senslab: warning: <message>``, unless SENSLAB_DEBUG is
set. Lines about what a command does (``senslab: measuring …``) go to stderr as well: stdout
holds only the result.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any


class UsageError(ValueError):
    """A command-line argument that cannot work; the message names it and the fix."""


def _note(message: str) -> None:
    """A one-line message about what the command does, on stderr (stdout is its result)."""
    print(f"senslab: {message}", file=sys.stderr, flush=True)


def _check_out(path: Path, option: str = "--out") -> None:
    """Fail before any work when the output directory ``path`` cannot be created or written
    (nothing is created here: the run directory's own code does that)."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} is a file, not a directory; choose a directory")
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{option} {path} cannot be created: {existing} is a file, not a "
                         f"directory; choose another {option}")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == path else f" (in {existing})"
        raise UsageError(f"{option} {path} is not writable{where}: permission denied or a "
                         f"read-only file system; choose a directory you can write for {option}")


def _list(args: argparse.Namespace) -> int:
    if args.what == "models":
        from .models import list_models

        names = list_models(args.pattern)
    elif args.what == "datasets":
        from .data import list_datasets

        names = list_datasets(args.pattern)
    else:
        from .experiments import get_experiment, list_experiments

        names = list_experiments(args.pattern)
        if not names:
            return _no_match(args)
        records = _records_here()
        for name in names:
            exp = get_experiment(name)
            rungs = (" [ladder: " + " → ".join(r.name + ("" if r.cpu else " (GPU)")
                                               for r in exp.ladder) + "]") if exp.ladder else ""
            print(f"{name:<24} {exp.claim}{_runtime_note(records.get(name), exp)}{rungs}")
        return 0
    if not names:
        return _no_match(args)
    print("\n".join(names))
    return 0


def _no_match(args: argparse.Namespace) -> int:
    """A pattern that matches no registered name: said on stderr (models and datasets printed
    an empty line, experiments nothing, and no word that the glob, exact and case-sensitive,
    matched nothing: ``senslab list models vit`` read as "no ViT models")."""
    pattern = args.pattern
    hint = "" if any(c in pattern for c in "*?[") else f": '*{pattern}*' for names containing it"
    _note(f"no registered {args.what[:-1]} matches {pattern!r} (a case-sensitive glob pattern "
          f"matching whole names{hint}); `senslab list {args.what}` lists them all")
    return 0


def _records_here() -> dict[str, dict[str, Any]]:
    """The reproduction records of the project in the working directory (``reproduction/``, as
    ``senslab reproduction`` writes them), or none: an installed senslab run elsewhere has no
    records, and a damaged one only costs the runtimes (with a warning)."""
    from .reproduction import load_records

    if not Path("reproduction").is_dir():
        return {}
    try:
        return load_records("reproduction")
    except ValueError as err:
        warnings.warn(f"runtimes not shown: {err}", stacklevel=2)
        return {}


def _runtime_note(record: dict[str, Any] | None, exp: Any) -> str:
    """`` [6.9 min on CPU, recorded]`` from a record's ``runtime_s``; for an experiment without a
    record, its labelled estimate if it has one; else nothing."""
    from .reproduction import format_runtime

    if record is not None:
        seconds = record.get("runtime_s")
        # a record of a run with --set overrides (steps=50: a smoke test) timed those settings,
        # not the experiment's CPU scale: "[2 s on CPU, recorded]" for a 41 s experiment
        given = "".join(f" --set {o}" for o in record.get("overrides") or [])
        with_set = f" with{given}" if given else ""
        return (f" [{format_runtime(seconds)} on CPU{with_set}, recorded]"
                if seconds is not None else "")
    return f" [{exp.runtime_estimate} on CPU]" if exp.runtime_estimate else ""


#: defaults of ``--model``/``--data``/``--seed`` (their argparse default is None, so that
#: ``measure --checkpoint`` and :func:`_check_option_sets` can tell an option given from one
#: left out)
DEFAULT_MODEL, DEFAULT_DATA, DEFAULT_SEED = "mlp", "digits", 0


def _config(args: argparse.Namespace) -> Any:
    from .data._registry import takes
    from .train.config import RunConfig, apply_overrides

    model, data = args.model or DEFAULT_MODEL, args.data or DEFAULT_DATA
    seed = DEFAULT_SEED if args.seed is None else args.seed
    cfg = RunConfig(name=args.name or f"{model}-{data}-s{seed}", seed=seed)
    cfg.model.name, cfg.data.name = model, data
    if args.data_root is not None:  # (an empty one is refused by _check_args)
        cfg.data.root = args.data_root
    cfg = apply_overrides(cfg, args.set or [])
    chosen = {item.split("=", 1)[0].strip() for item in args.set or []}
    if args.name is None and "name" not in chosen:
        # named after what trains, --set included: from the options alone, `--set seed=3`
        # trained seed 3 into runs/mlp-digits-s0, and `--set seed=4` was then refused there
        cfg.name = f"{cfg.model.name}-{cfg.data.name}-s{cfg.seed}"
    if ("data.test_split" not in chosen and cfg.data.test_split == "test"
            and takes(cfg.data.name, "tokenizer")):
        cfg.data.test_split = "validation"  # the text sets' held-out split (no labelled test)
    return cfg


def _check_fits(cfg: Any) -> None:
    """A model on data it cannot take — an image model on a text set or back, or any pair with
    a generated set or a small research model (``mlp`` on ``boolean``, ``sparse_attention`` on
    ``digits``) — or a small model built for another size than the generated set's: a
    UsageError naming the mismatch and what would fit, before any data is loaded or any file
    written. Models and sets of no known kind (registered elsewhere) are not checked."""
    from .data._registry import DATASETS
    from .data.synthetic import input_size
    from .models import model_config
    from .models._registry import MODELS
    from .train.loop import check_model_fits_data

    # an unknown name (--model vit): refused here, before `train` says it is training
    for registry, name in ((MODELS, cfg.model.name), (DATASETS, cfg.data.name)):
        try:
            registry.get(name)
        except KeyError as err:
            raise UsageError(str(err.args[0])) from None
    try:
        check_model_fits_data(cfg)
    except ValueError as err:
        raise UsageError(str(err)) from None
    _check_data_options(cfg.data.name, cfg.data.options)
    _check_model_overrides(cfg.model.name, cfg.model.overrides)
    model, data = cfg.model.name, cfg.data.name
    takes, holds = _takes(model), _holds(data)
    if takes is None or holds is None:
        return
    if holds not in takes:
        from .data import list_datasets
        from .models import list_models

        sets = ", ".join(n for n in list_datasets() if _holds(n) in takes)
        models = ", ".join(n for n in list_models() if holds in (_takes(n) or ()))
        raise UsageError(f"{model} takes {' or '.join(_INPUT_WORDS[k] for k in takes)} and "
                         f"{data} holds {_INPUT_WORDS[holds]}: use {model} on {sets}, or on "
                         f"{data} a model that takes {_INPUT_WORDS[holds]} ({models})")
    small, want = _small_model(model), input_size(data, cfg.data.options)
    if small is None or want is None:
        return
    _, key, at_least = small
    if key == "dim" and key not in cfg.model.overrides:
        return  # a token-vector model left to its default takes the data's length (build_model)
    have = cfg.model.overrides.get(key, getattr(model_config(model), key))
    if not isinstance(have, int) or (have >= want if at_least else have == want):
        return
    size = {"n_bits": f"{'at most ' if at_least else ''}{{}} bits",
            "p": "(a + b) mod {}", "dim": "token vectors of length {}"}[key]
    raise UsageError(f"{model} is built for {size.format(have)} (model.overrides.{key}) and "
                     f"{data} holds {size.replace('at most ', '').format(want)}: add --set "
                     f"model.overrides.{key}={want}")


def _check_data_options(data: str, options: dict[str, Any]) -> None:
    """Refuse a ``data.options`` key that the loader of registered dataset ``data`` does not
    take, naming the keys it does: the loader's own "digits() got an unexpected keyword
    argument 'foo'" named no fix, and came after ``train`` said it was training. A loader
    that takes any keyword (``**kwargs``) is left to check its own."""
    import inspect

    from .data._registry import DATASETS
    from .train.config import _loader_signature

    try:
        params = _loader_signature(inspect.unwrap(DATASETS.get(data)))[0]
    except KeyError:
        return
    if not params:  # no signature to read: the loader checks its own keywords
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    # root, download and split are set by data.root, data.download and the splits (validate
    # refuses them as options, naming those keys)
    own = {"split", "root", "download"}
    unknown = [k for k in options if k not in params and k not in own]
    if not unknown:
        return
    valid = [n for n, p in params.items() if n not in own and p.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    takes = (f"it takes {', '.join(f'data.options.{n}' for n in valid)}" if valid
             else "it takes no data.options")
    raise UsageError(f"data.options.{unknown[0]} is not an option of the {data} data set: "
                     f"{takes}; drop --set data.options.{unknown[0]}, or fix its name")


def _check_model_overrides(model: str, overrides: dict[str, Any]) -> None:
    """Refuse a ``model.overrides`` key that registered model ``model``'s config has no field
    for, naming the fields: the model builder's own error came after ``train`` said it was
    training and had made the run directory (its lock and senslab.json left behind)."""
    import dataclasses
    import difflib

    from .models import model_config

    if not overrides:
        return
    try:
        config = model_config(model)
    except Exception:  # noqa: BLE001  (not buildable with its defaults: the builder says why)
        return
    if not dataclasses.is_dataclass(config):
        return
    valid = [f.name for f in dataclasses.fields(config)]
    unknown = [k for k in overrides if k not in valid]
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], valid, n=1)
    hint = f" (did you mean model.overrides.{close[0]}?)" if close else ""
    raise UsageError(f"model.overrides.{unknown[0]} is not an option of {model}{hint}: its "
                     f"options are {', '.join(valid)}; drop --set model.overrides."
                     f"{unknown[0]}, or fix its name")


#: what the inputs of a kind are, in words: the image and text sets (:func:`train.loop.data_kind`)
#: and the generated sets' kinds (:data:`data.synthetic.INPUTS`)
_INPUT_WORDS = {"image": "images", "text": "text", "bits": "±1 bit strings",
                "ids": "token ids `a b =`", "vectors": "sequences of float token vectors"}


def _holds(data: str) -> str | None:
    """The kind of inputs registered dataset ``data`` holds (:data:`_INPUT_WORDS`), or None."""
    from .data.synthetic import INPUTS
    from .train.loop import data_kind

    return data_kind(data) or INPUTS.get(data)


def _small_model(model: str) -> tuple[str, str, bool] | None:
    """For a small research model (by the class of its config): the kind of inputs it takes,
    its config field that must fit the generated set's size
    (:func:`data.synthetic.input_size`), and whether the field is a bound (≥ the size) or must
    equal it; None for any other model."""
    from .models import model_config
    from .models.small import (
        AttentionModelConfig,
        BooleanConfig,
        ModAddConfig,
        ParityConfig,
        SparseAttentionConfig,
    )

    try:
        config = model_config(model)
    except Exception:  # noqa: BLE001  (unknown, or not buildable with its defaults: not ours)
        return None
    small = {SparseAttentionConfig: ("vectors", "dim", False),
             AttentionModelConfig: ("vectors", "dim", False),
             ModAddConfig: ("ids", "p", False),
             ParityConfig: ("bits", "n_bits", True), BooleanConfig: ("bits", "n_bits", True)}
    return next((spec for cls, spec in small.items() if isinstance(config, cls)), None)


def _takes(model: str) -> tuple[str, ...] | None:
    """The kinds of inputs (:data:`_INPUT_WORDS`) registered model ``model`` takes, or None for
    a model of no known kind. A text model takes any token ids, so ``modular_addition`` too."""
    from .train.loop import model_kind

    kind = model_kind(model)
    if kind is not None:
        return ("text", "ids") if kind == "text" else (kind,)
    small = _small_model(model)
    return None if small is None else (small[0],)


def _train(args: argparse.Namespace) -> int:
    from .report import final_table, format_table, load_runs
    from .train.loop import check_config, fit

    cfg = _config(args)
    _check_run_name(cfg.name, args)
    _check_fits(cfg)  # (fit checks too) before the note, and before --out is looked at
    # what fit refuses before it writes (a config value out of range: --seed -1), refused
    # before the note too: "training mlp on digits (seed -1)" was printed, then the error
    check_config(cfg)
    out = Path(args.out or Path("runs") / cfg.name)
    _check_out(out)
    _note(f"training {cfg.model.name} on {cfg.data.name} (seed {cfg.seed}) into {out}")
    summary = fit(cfg, out)
    print(format_table(final_table(load_runs([out]))))
    print(f"run directory: {out} ({summary['seconds']} s)")
    return 0


def _check_run_name(name: str, args: argparse.Namespace) -> None:
    """Refuse a run name that names no directory of its own below ``runs/``: an empty one
    (``--set name=``, which ``--name`` refuses as empty) trained into ``runs/`` itself, among
    the other runs' directories, and ``.``/``..`` into ``runs/`` or the working directory."""
    given = any(item.split("=", 1)[0].strip() == "name" for item in args.set or [])
    option = "--set name" if given else "--name"
    if not name.strip():
        where = "" if args.out else ": the run would be trained into runs/ itself, among other runs"
        raise UsageError(f"{option} is empty (an unset shell variable?){where}; give a name, "
                         f"or drop {option}")
    if args.out is None and name.strip() in (".", ".."):
        shown = f"{option}={name.strip()}" if given else f"{option} {name.strip()}"
        raise UsageError(f"{shown} names no run directory of its own (runs/{name.strip()}); "
                         "give a name, or choose the directory with --out")


#: ``senslab measure --autocast`` names → dtypes
AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}

#: ``senslab measure``'s own defaults of the options that a run's tracker sets too. Their
#: argparse default is None, so that ``--checkpoint`` can tell an option given from one left
#: out and take the run's value for it (:func:`_measure_options`): with measure's own, a plain
#: ``measure --checkpoint RUN`` drew other examples and noise than the run's logged sens/*
MEASURE_DEFAULTS: dict[str, Any] = {"seed": 0, "num_examples": 512, "sigma": [0.1], "repeats": 1}
#: those options → where a run keeps its value (what its tracker measures sens/* with)
_RUN_SETTING = {"seed": "seed", "num_examples": "track.num_examples", "sigma": "track.sigma",
                "repeats": "track.repeats"}


def _option_words(dest: str, value: Any) -> str:
    if dest == "seed":
        return f"seed {value}"
    if dest == "num_examples":
        return f"{value} example{'s' if value != 1 else ''}"
    if dest == "sigma":
        return "sigma " + ", ".join(f"{v:g}" for v in value)
    return f"{value} draw{'s' if value != 1 else ''} per token"


def _measure_options(args: argparse.Namespace, cfg: Any = None) -> dict[str, str]:
    """Set the options of :data:`MEASURE_DEFAULTS` that were left out (None): to measure's own
    defaults, or with ``cfg`` (a checkpoint's run configuration) to the values the run's tracker
    measured ``sens/*`` with (:meth:`senslab.train.track.Tracker.sensitivity`: the run's seed for
    the examples and the noise, ``track.num_examples``, ``track.sigma``, ``track.repeats``;
    ``track.chunk_size`` changes only how many copies go through the model at once). Returns
    where each value came from: ``"given"``, ``"run"`` or ``"default"`` (measure's own: without
    ``cfg``, or for ``sigma`` where the run tracked none, ``track.sigma=0``)."""
    source = {}
    for dest, default in MEASURE_DEFAULTS.items():
        if getattr(args, dest) is not None:
            source[dest] = "given"
            continue
        value = None if cfg is None else _run_value(cfg, dest)
        if dest == "sigma" and value == [0]:
            value = None  # the run measured no sensitivity: nothing of its to reproduce
        source[dest] = "default" if value is None else "run"
        if value is None:
            value = list(default) if isinstance(default, list) else default
        setattr(args, dest, value)
    return source


def _run_value(cfg: Any, dest: str) -> Any:
    if dest == "seed":
        return cfg.seed
    value = getattr(cfg.track, dest)
    return [value] if dest == "sigma" else value


def _run_settings_words(args: argparse.Namespace, cfg: Any, source: dict[str, str],
                        split: str, available: int) -> str:
    """Which of a checkpoint measurement's seed, example count, sigma and draws are the run's
    (``source``: :func:`_measure_options`), and whether the numbers are then the run's logged
    ``sens/train`` (``split`` "train") or ``sens/val`` (``available``: the split's size, to
    which both example counts are cut)."""
    key = "sens/train" if split == "train" else "sens/val"
    said = []
    taken = [d for d in MEASURE_DEFAULTS if source[d] == "run"]
    if taken:
        said.append(f"{', '.join(_option_words(d, getattr(args, d)) for d in taken)}: the run's "
                    f"track settings (config.json {', '.join(_RUN_SETTING[d] for d in taken)})")
    unlike = []
    for dest in MEASURE_DEFAULTS:
        given, run = getattr(args, dest), _run_value(cfg, dest)
        if source[dest] != "given":
            continue
        if dest == "num_examples":
            same = min(given, available) == min(run, available)
        elif dest == "sigma":
            same = run[0] in given
        else:
            same = given == run
        if not same:
            option = "--" + dest.replace("_", "-")
            shown = " ".join(f"{v:g}" for v in given) if dest == "sigma" else given
            unlike.append(f"{option} {shown} (the run's: {_option_words(dest, run)})")
    if args.sigma_space != "input":
        unlike.append(f"--sigma-space {args.sigma_space} (the run's tracker: input)")
    if args.autocast:
        unlike.append(f"--autocast {args.autocast} (the run's tracker: float32's decisions)")
    if source["sigma"] == "default":
        said.append(f"sigma {args.sigma[0]:g} is measure's default: the run tracked no "
                    f"sensitivity (track.sigma=0)")
    elif unlike:
        said.append(f"given unlike the run's tracker: {', '.join(unlike)}, so these are not "
                    f"the run's logged {key}")
    elif split == "test" and not cfg.track.val:
        said.append("the examples and noise of the run's sens/val, had it tracked one (it "
                    "tracked none: track.val=false)")
    else:
        sigma = f" (the row at sigma {cfg.track.sigma:g})" if len(args.sigma) > 1 else ""
        said.append(f"the examples and noise of the run's logged {key}{sigma}")
    return "; ".join(said)


#: ``--set`` keys that configure training only, and the ``measure`` options that do their job
_TRAINING_ONLY = ("name", "label", "optim.", "train.", "track.")
_MEASURE_OPTION = {"track.sigma": "--sigma", "track.repeats": "--repeats",
                   "track.num_examples": "--num-examples"}
#: what ``--set`` may change on top of a checkpoint's config: where things run and where the
#: (same) data is read from, nothing that the trained weights depend on
_CHECKPOINT_KEYS = ("device", "data.root", "data.download")


def _check_measure_set(assignments: list[str], cfg: Any, checkpoint: str | None) -> None:
    """Refuse ``--set`` keys that ``measure`` would ignore, and (with ``--checkpoint``) those
    that the checkpoint fixes. Keys are already known to exist: the overrides were applied."""
    for item in assignments:
        key = item.split("=", 1)[0].strip()
        if key in _TRAINING_ONLY or key.startswith(_TRAINING_ONLY):
            use = _MEASURE_OPTION.get(key)
            fix = f"use {use} instead" if use else f"drop --set {key}"
            raise UsageError(f"--set {key} configures training and has no effect on "
                             f"`senslab measure`; {fix}")
        if checkpoint is None or key in _CHECKPOINT_KEYS:
            continue
        if key.startswith("model."):
            raise UsageError(f"--set {key} would change the model, but the checkpoint's weights "
                             f"fix it ({cfg.model.name} as trained in {checkpoint}); drop --set "
                             f"{key}")
        what = "its seed (for the noise draws use --seed)" if key == "seed" else "its data"
        raise UsageError(f"--set {key} would change what the checkpoint's run trained on: "
                         f"{checkpoint} fixes {what}; drop --set {key} (with --checkpoint, "
                         f"--set may change only {', '.join(_CHECKPOINT_KEYS)})")


def _checkpoint(args: argparse.Namespace) -> tuple[Any, dict[str, Any], Path]:
    """The config of run directory ``--checkpoint`` with the allowed overrides, its newest
    verified checkpoint and that checkpoint's file."""
    from .train.config import RunConfig, apply_overrides
    from .train.rundir import RunDir
    from .train.trainers import experiment_of, trainer_of

    path = Path(args.checkpoint)
    made_by = "pass the directory that `senslab train --out DIR` wrote"
    if not path.exists():
        raise UsageError(f"--checkpoint {path}: no such directory; {made_by}")
    if not path.is_dir():
        raise UsageError(f"--checkpoint {path} is a file; {made_by}, not a file in it")
    rd = RunDir(path)
    config = path / "config.json"
    if not config.is_file():
        raise UsageError(f"--checkpoint {path} is not a run directory (it has no config.json); "
                         f"{made_by}")
    try:
        raw = rd.read_json("config.json")
    except json.JSONDecodeError as err:
        raise UsageError(f"{config} is not valid JSON ({err.msg}, line {err.lineno}): the file "
                         f"is truncated or damaged; restore it, or train the run again") from None
    try:
        cfg = RunConfig.from_dict(raw)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        other = trainer_of(raw, "fit")
        if other is not None:
            # a valid run of another trainer (`senslab run ib_joint`'s runs): "does not hold a
            # run configuration … Did you mean 'train.batch_size'?" read as a damaged file
            raise UsageError(f"--checkpoint {path} is a run of the {other!r} trainer"
                             f"{experiment_of(path)}, not of `senslab train` (trainer 'fit'): "
                             "measure --checkpoint rebuilds only the models that `senslab "
                             "train` (and the experiments that train with it) trains; this "
                             f"run's numbers are in its metrics.jsonl (`senslab report {path}`)"
                             ) from None
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        raise UsageError(f"{config} does not hold a run configuration this senslab can read "
                         f"({msg})") from None
    for option, given, trained in (("--model", args.model, cfg.model.name),
                                   ("--data", args.data, cfg.data.name)):
        if given is not None and given != trained:
            raise UsageError(f"{option} {given} but the checkpoint's run trained "
                             f"{'on ' if option == '--data' else ''}{trained}; drop {option} "
                             "(--checkpoint measures the model and data it was trained with)")
    if args.data_root is not None:  # the same data, found in another place: safe
        cfg.data.root = args.data_root
    apply_overrides(cfg, args.set or [])
    _check_measure_set(args.set or [], cfg, str(path))
    _check_fits(cfg)  # e.g. the config.json of a run that failed on its first step
    found = rd.load_latest()
    if found is None:
        raise UsageError(f"no usable checkpoint in {path / 'checkpoints'}: the run saved none "
                         "yet, or every one is damaged; train it (re-running its `senslab train` "
                         "command resumes it) and measure again")
    ckpt, state = found
    return cfg, state, ckpt


def _describe_tokens(tokens: Any, x: Any) -> str:
    """``tokens`` (a Tokenization) in words, with the number per example of inputs ``x``."""
    from .tokens import Embedding, Patches, Sequence

    if isinstance(tokens, Patches):
        h, w = x.shape[-2:]
        count = (h // tokens.size) * (w // tokens.size)
        space = ""
        if tokens.sigma_space == "pixel":
            std = "model's std" if tokens.std is None else ", ".join(f"{v:g}" for v in tokens.std)
            space = f"; σ in [0, 1] pixel units (noise ÷ std {std})"
        return f"{count} patches of {tokens.size}×{tokens.size} pixels{space}"
    length = (x["input_ids"] if isinstance(x, dict) else x).shape[1]
    if isinstance(tokens, Embedding):
        module = tokens.module if isinstance(tokens.module, str) else type(tokens.module).__name__
        return f"up to {length} positions of {module}'s output (padding left out)"
    if isinstance(tokens, Sequence):
        return f"{length} sequence positions"
    return repr(tokens)


def _precision_note(model: Any, device: Any, args: argparse.Namespace) -> str:
    """The precision the perturbed forwards run in (``--autocast``, or ``--precision`` with its
    ``"auto"`` rule)."""
    import torch

    from .measure._precision import auto_precision

    if args.autocast:
        return f"autocast {args.autocast} (its own decisions)"
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if dtype == torch.float32 and args.precision in ("bf16-checked", "int8-checked"):
        return f"checked {args.precision.removesuffix('-checked')} (float32's decisions)"
    if dtype == torch.float32 and args.precision == "auto":
        low = auto_precision(torch.device(device))
        if low is not None:
            then = " if its timed calibration finds it pays, else float32" if low[1] else ""
            return f"checked {low[0]}{then} (float32's decisions)"
    return str(dtype).removeprefix("torch.")


def _table(model: Any, tokens: Any, batches: Any, args: argparse.Namespace,
           device: Any, rule: tuple[str, float | None] | None = None) -> None:
    """Measure every ``--sigma`` on ``batches`` (a function of (lo, hi) giving a batch on
    ``device``) and print one table row each; ``rule``: the decision rule (``output_kind``,
    ``threshold``) to read the outputs with, else the model's own."""
    import torch

    from ._seeds import noise_seed
    from .measure import TokenSensitivity
    from .measure._stats import fixed as _fixed

    fast = {"autocast": getattr(torch, AUTOCAST[args.autocast]) if args.autocast else None,
            "compile": args.compile, "precision": args.precision}
    if rule is not None:
        fast.update(output_kind=rule[0], threshold=rule[1])
    print(f"{'sigma':>8} {'sensitivity':>12} {'s.e.':>8} {'95% CI':>17} {'forwards':>9}"
          f" {'re-checked':>10}")
    for sigma in args.sigma:
        metric = TokenSensitivity(model, tokens, sigma=sigma, repeats=args.repeats,
                                  generator=noise_seed(args.seed), **fast)
        for lo in range(0, batches.count, batches.size):
            metric.update(batches(lo, lo + batches.size))
        r = metric.compute()
        # the share of bf16 copies re-evaluated in float32 ("-": no copy ran in checked bf16,
        # or only the calibration's, all of which ran in both precisions: its 100% beside
        # "bf16 would re-check 5%" read as a contradiction)
        idle = metric.checked_precision == "float32"
        recheck = ("-" if r.recheck_fraction is None or idle
                   else f"{r.recheck_fraction:.1%}")
        print(f"{sigma:>8g} {_fixed(r.estimate):>12} {_fixed(r.stderr):>8} "
              f"{_fixed(r.ci95[0]):>8}–{_fixed(r.ci95[1]):<8} {r.num_forward:>9,} {recheck:>10}")
        if idle:
            share = ("" if not r.num_forward_fp32 else f"; its calibration evaluated "
                     f"{r.num_forward_fp32:,} copies in both precisions, all decided in float32")
            _note(f"sigma {sigma:g}: the copies ran in float32 — {metric.float32_reason}{share}")


class _Batches:
    """Batches ``lo:hi`` of a dataset subset, prepared (``prepare``) and moved to ``device``."""

    def __init__(self, subset: Any, device: Any, prepare: Any = None, size: int = 256) -> None:
        self.subset, self.device, self.prepare, self.size = subset, device, prepare, size
        self.count = len(subset)

    def __call__(self, lo: int, hi: int) -> Any:
        x, _ = self.subset.batch(slice(lo, hi))
        if self.prepare is not None:
            x = self.prepare(x)
        if isinstance(x, dict):
            return {k: v.to(self.device) for k, v in x.items()}
        return x.to(self.device)


def _summary(model_words: str, data_words: str, tokens_words: str, args: argparse.Namespace,
             precision: str, device: Any) -> None:
    import torch

    extra = ", compiled" if args.compile else ""
    threads = torch.get_num_threads()
    sigmas = ", ".join(f"{s:g}" for s in args.sigma)
    _note(f"measuring {model_words}, on {data_words}; tokens: {tokens_words}; sigma {sigmas}; "
          f"{args.repeats} noise draw(s) per token; precision {precision}; {device}{extra}, "
          f"{threads} thread{'s' if threads != 1 else ''}")


def _rule_words(rule: tuple[str, float | None], loss: str) -> str:
    """How a run's decision rule (:func:`senslab.train.track.decision_rule`) reads outputs."""
    kind, threshold = rule
    if threshold is not None:
        read = f"class = output > {threshold:g}; output_kind={kind}, threshold={threshold:g}"
    else:
        one = "> 0.5" if kind == "probabilities" else "its sign"
        read = f"class = argmax, one column: {one}; output_kind={kind}"
    return f"decisions as its training tracked sens/*, train.loss={loss}: {read}"


def _measure(args: argparse.Namespace) -> int:
    import torch

    from .tokens import auto_tokens
    from .train.config import validate
    from .train.loop import build_model, load_data, resolve_device
    from .train.rundir import checkpoint_step, load_model_state
    from .train.track import decision_rule

    if args.hf or args.timm:
        _measure_options(args)
        return _measure_pretrained(args)
    state: dict[str, Any] | None = None
    source: dict[str, str] = {}
    if args.checkpoint:
        cfg, state, ckpt = _checkpoint(args)
        # left out: the values the run tracked sens/* with, not measure's own
        source = _measure_options(args, cfg)
        weights = f"checkpoint step {checkpoint_step(ckpt)} of {args.checkpoint}"
    else:
        seeded = _measure_options(args)["seed"] == "given"
        cfg = _config(args)
        _check_measure_set(args.set or [], cfg, None)
        if not seeded:
            # `--set seed=N` alone seeds the examples and the noise too, as `--seed N` does (it
            # seeded the untrained weights only: "seed 4" printed over seed 0's draws)
            args.seed = cfg.seed
        weights = f"untrained (seed {cfg.seed})"
    validate(cfg)
    _check_fits(cfg)
    device = resolve_device(cfg.device)
    train, test = load_data(cfg)
    data = train if args.split == "train" else test
    model = build_model(cfg, train)
    if state is not None:  # a checkpoint of another model: an error naming it and the fix
        load_model_state(model, state["model"], ckpt)
    model = model.to(device)
    # the examples training tracks (train.track): seed + 1 for sens/train, seed + 2 for sens/val
    g = torch.Generator().manual_seed(args.seed + (2 if args.split == "test" else 1))
    subset = data.first(min(args.num_examples, len(data)), generator=g)
    pixel = {}
    if args.sigma_space == "pixel":
        pixel = {"sigma_space": "pixel", "std": data.meta.get("std")}
        if pixel["std"] is None:
            raise UsageError(f"--sigma-space pixel needs image data normalised by a known std; "
                             f"{cfg.data.name} records none")
    tokens = auto_tokens(model, **pixel) if hasattr(model, "default_tokens") else None
    what = _describe_tokens(tokens, subset.batch(slice(0, 1))[0]) if tokens else "?"
    split = cfg.data.train_split if args.split == "train" else cfg.data.test_split
    rule, rule_words = None, ""
    if state is not None:
        # the run's own rule, as its tracker worked it out: train.loss=mse on one column reads
        # class = output > 0.5 where the model declares logits (class = sign), and measured by
        # the model's rule the number disagreed with the run's sens/* for the same weights
        rule = decision_rule(cfg, model, subset, device)
        rule_words = _rule_words(rule, cfg.train.loss)
    _summary(f"{cfg.model.name}, {weights}",
             f"{cfg.data.name} ({split} split, {len(subset)} examples{_cut_words(data)})", what,
             args,
             _precision_note(model, device, args), device)
    if rule_words:
        _note(rule_words)
    if state is not None:
        _note(_run_settings_words(args, cfg, source, args.split, len(data)))
    _table(model, tokens, _Batches(subset, device), args, device, rule)
    return 0


def _check_text_fits(model: Any, ids: Any, name: str, data_name: str) -> None:
    """Refuse token ids the model has no embedding for (a tokenizer of another model) and
    sequences longer than its positions (torch's index or size error, mid-table, before)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    config = getattr(model, "config", None)
    vocab = getattr(emb, "num_embeddings", None) or getattr(config, "vocab_size", None)
    top = int(ids.max()) if ids.numel() else -1
    if vocab is not None and top >= vocab:
        raise UsageError(f"--data {data_name} tokenized with {name}'s tokenizer holds token id "
                         f"{top:,}, but the model embeds only {vocab:,} ids: the directory's "
                         "tokenizer does not belong to its model")
    positions = (getattr(config, "max_position_embeddings", None)
                 or getattr(config, "n_positions", None))
    if isinstance(positions, int) and ids.shape[1] > positions:
        raise UsageError(f"--data {data_name} is padded to {ids.shape[1]} tokens, but {name} has "
                         f"{positions} positions: pass --set data.options.max_len={positions}")


def _check_hf_dir(name: str) -> None:
    """Refuse an ``--hf`` path that is no directory save_pretrained wrote: a file in one
    (config.json: "unexpected Exception: expected `,`…", called a bug) or a directory without
    config.json (transformers' "should have a `model_type` key in its config.json")."""
    path = Path(name).expanduser()
    made_by = "pass the directory that save_pretrained wrote (config.json beside the weights)"
    if path.is_file():
        raise UsageError(f"--hf {name} is a file; {made_by}, not a file in it")
    if path.is_dir() and not (path / "config.json").is_file():
        raise UsageError(f"--hf {name} has no config.json, so no model was saved there; "
                         f"{made_by}")


def _check_tokenizer_vocabulary(meta: dict[str, Any], name: str, data_name: str) -> None:
    """Refuse a tokenizer whose vocabulary is its special tokens alone: what transformers builds
    for a model directory saved without its tokenizer (BERT's five), which read every word of
    the text as the unknown token — and the table was printed as if the text had been read."""
    vocab, special = meta.get("vocab_size"), meta.get("special_ids") or {}
    if not isinstance(vocab, int) or not special or vocab > len(special):
        return
    raise UsageError(f"--hf {name}'s tokenizer holds only its {vocab} special tokens "
                     f"({', '.join(special)}) and no vocabulary: every word of {data_name} "
                     "would be read as the unknown token. Save the tokenizer beside the model "
                     "(tokenizer.save_pretrained(DIR), which writes its vocabulary files)")


def _cut_words(data: Any) -> str:
    """What the cut of a text set to its maximum length removed (``meta``), or ""."""
    cut = data.meta.get("truncated_rows") if isinstance(getattr(data, "meta", None), dict) else 0
    if not cut:
        return ""
    return (f"; {cut:,} of the split's {len(data):,} rows cut to {data.meta.get('max_len')} "
            f"tokens ({data.meta.get('truncated_tokens', 0):,} tokens dropped)")


# -- pretrained models (``--hf``, ``--timm``) ---------------------------------------------------


def _check_label_count(model: Any, classes: int, what: str, data_name: str) -> None:
    """Warn where the model's head has another number of labels (a Hugging Face config's
    ``num_labels``, a timm model's ``num_classes``) than the data has classes: the measurement
    is still well defined (flips among the model's own labels), but the model's labels are not
    the data's classes, so no accuracy can be read from the run."""
    if type(model).__name__.endswith("ForCausalLM"):
        # its own language-model head: config.num_labels (2 by default) is not what it decides
        vocab = getattr(getattr(model, "get_output_embeddings", lambda: None)(), "out_features",
                        None)
        if isinstance(vocab, int):
            warnings.warn(f"{what} is a causal language model: the sensitivity counts flips of "
                          f"its next token (a {vocab:,}-way decision over its vocabulary) at "
                          f"each example's last real token, not of {data_name}'s {classes} "
                          f"classes (no accuracy can be read from this run); to measure a "
                          f"{data_name} classifier, give a model with a {classes}-label "
                          "classification head", stacklevel=2)
        return
    labels, field = getattr(getattr(model, "config", None), "num_labels", None), "num_labels"
    if labels is None:
        labels, field = getattr(model, "num_classes", None), "num_classes"
    if not isinstance(labels, int) or labels == classes:
        return
    warnings.warn(f"{what} has {labels} output label{'' if labels == 1 else 's'} ({field}="
                  f"{labels}) but {data_name} has {classes} classes: the sensitivity counts "
                  f"flips of the model's own {labels}-way decision, whose labels are not "
                  f"{data_name}'s (no accuracy can be read from this run); to measure a "
                  f"{data_name} classifier, give a model with a {classes}-label head",
                  stacklevel=2)


_TEXT_DEFAULT, _IMAGE_DEFAULT = "rotten_tomatoes", "digits"


def _measure_pretrained(args: argparse.Namespace) -> int:
    """``senslab measure --hf NAME`` / ``--timm NAME``: a pretrained model on registered data."""
    import torch

    from .data._registry import takes
    from .data.text import own_pair_layout
    from .models import pretrained
    from .tokens import auto_tokens
    from .train.config import validate
    from .train.loop import load_data, resolve_device

    if args.hf and args.timm:  # --timm was dropped without a word: the --hf model measured
        raise UsageError(f"--hf {args.hf} and --timm {args.timm} name two models; measure one "
                         "at a time: drop --hf or --timm")
    option, name = ("--hf", args.hf) if args.hf else ("--timm", args.timm)
    for other, given in (("--model", args.model), ("--checkpoint", args.checkpoint)):
        if given:
            raise UsageError(f"{option} measures a pretrained model: drop {other}")
    for item in args.set or []:
        # the model is loaded as saved and seeded from --seed: these keys were accepted and
        # changed nothing, the numbers those of the model and seed without them
        key = item.split("=", 1)[0].strip()
        if key.startswith("model."):
            raise UsageError(f"--set {key} configures senslab's own models and has no effect on "
                             f"{option} {name}, which is measured as saved; drop --set {key}")
        if key == "seed":
            raise UsageError(f"--set seed has no effect on {option} {name}: --seed seeds its "
                             "newly initialised head (if any), the examples and the noise "
                             "draws; use --seed instead")
    processor, config = None, None
    if args.hf:
        _check_hf_dir(name)
        config = pretrained.hf_config(name)
        image = pretrained.is_image_config(config)
    else:
        image = True
    args.data = args.data or (_IMAGE_DEFAULT if image else _TEXT_DEFAULT)
    cfg = _config(args)
    _check_measure_set(args.set or [], cfg, None)
    # (before the model's own options are added: a loader's TypeError below is taken for data
    # that does not fit the model, "--data digits does not fit a image model; use digits")
    _check_data_options(cfg.data.name, cfg.data.options)
    cfg.data.options.setdefault(*(("normalize", "none") if image else ("tokenizer", name)))
    if not image and takes(cfg.data.name, "pair_encoding"):  # pairs as the tokenizer encodes them
        cfg.data.options.setdefault("pair_encoding", "tokenizer")
    validate(cfg)
    device = resolve_device(cfg.device)
    try:
        train, test = load_data(cfg)
    except TypeError as err:
        kind, use = ("image", "digits, mnist or cifar10") if image else (
            "text", "rotten_tomatoes, sst2 or mrpc")
        raise UsageError(f"--data {cfg.data.name} does not fit a {kind} model ({err}); use "
                         f"{use}") from None
    data = train if args.split == "train" else test
    split = cfg.data.train_split if args.split == "train" else cfg.data.test_split
    if args.hf:
        try:
            model, processor, weights = pretrained.load_hf(name, config, args.seed,
                                                           max(train.num_classes, 2))
        except OSError as err:  # a saved config without weights: "the work failed", status 1
            if not Path(name).expanduser().is_dir():
                raise
            said = str(err).strip().splitlines()[0].rstrip(".")
            raise UsageError(f"--hf {name}: {said}; pass a directory that save_pretrained wrote "
                             "(the weights beside config.json)") from None
    else:
        model, weights = pretrained.load_timm(name)
    _check_label_count(model, train.num_classes, f"{option} {name}", cfg.data.name)
    model = model.to(device)
    g = torch.Generator().manual_seed(args.seed + 1)
    subset = data.first(min(args.num_examples, len(data)), generator=g)
    first = subset.batch(slice(0, 1))[0]
    if image:
        if not isinstance(first, torch.Tensor) or first.dim() != 4:
            raise UsageError(f"--data {cfg.data.name} holds no images, but {name} is an image "
                             "model; use digits, mnist or cifar10")
        prepare, data_words, norm = pretrained.image_prep(model, processor, first)
        pixel: dict[str, Any] = {"sigma_space": args.sigma_space}
        if args.sigma_space == "pixel":  # no normalisation: the inputs are the pixels
            pixel.update({"std": norm[1], "mean": norm[0]} if norm else {"std": 1.0})
        tokens = auto_tokens(model, **pixel)
        if args.sigma_space == "input" and norm is not None:
            data_words += "; σ in the model's input units (--sigma-space pixel: [0, 1] pixels)"
    else:
        if not isinstance(first, dict):
            raise UsageError(f"--data {cfg.data.name} holds no text, but {name} is a text "
                             "model; use rotten_tomatoes, sst2 or mrpc")
        if args.sigma_space == "pixel":
            raise UsageError("--sigma-space pixel applies to image models; drop it")
        _check_tokenizer_vocabulary(data.meta, name, cfg.data.name)
        _check_text_fits(model, subset.batch(slice(0, len(subset)))[0]["input_ids"], name,
                         cfg.data.name)
        prepare, padded = pretrained.text_prep(model, data.meta.get("pad_id"))
        data_words = f"tokenized with {name}'s tokenizer{padded}"
        own = (own_pair_layout(name) if data.meta.get("pair_encoding") == "senslab" else None)
        if data.meta.get("pair_encoding") == "tokenizer":
            data_words += "; pairs in the tokenizer's own encoding"
        if own is not None:  # measured on a layout other than the model's own pair encoding
            data_words += (f"; pairs in senslab's layout <s> A </s></s> B </s>, not the "
                           f"tokenizer's own ({own}): a model fine-tuned on its own pair "
                           "encoding is measured on inputs unlike its training")
        tokens = auto_tokens(model)
        data_words += _cut_words(data)
    what = _describe_tokens(tokens, prepare(first))
    _summary(f"{option.removeprefix('--')}:{name} ({type(model).__name__}), {weights}",
             f"{cfg.data.name} ({split} split, {len(subset)} examples; {data_words})",
             what, args, _precision_note(model, device, args), device)
    _table(model, tokens, _Batches(subset, device, prepare, 64), args, device)
    return 0


def _run(args: argparse.Namespace) -> int:
    from .experiments import get_experiment, run_experiment
    from .report import final_table, format_table, load_runs, make_report

    if args.scale == "ladder":
        return _run_ladder(args)
    if getattr(args, "rungs", None):
        raise ValueError("--rungs chooses rungs of a scale ladder; add --scale ladder")
    out = Path(args.out or Path("runs") / args.experiment)
    _check_out(out)
    exp = get_experiment(args.experiment)
    exp.check(args.scale, list(args.set or []))  # a refused --set before the warning below
    _warn_threads(args, exp, [args.scale])
    start = time.perf_counter()
    # its progress ("[1/9] vit_small (fit)") and notices (a damaged verdict.json set aside)
    # are lines about what the command does: stderr, as the module docstring says (they were
    # printed on stdout, mixed into the result a script reads)
    verdict = run_experiment(args.experiment, out, scale=args.scale, overrides=args.set,
                             log=_note)
    options = getattr(exp, "report_options", {})
    report = make_report([out], **options)
    print()
    print(format_table(final_table(load_runs([out]))))
    print(f"\nverdict: {verdict['verdict']} — {verdict.get('reason', '')}")
    print(f"report: {report}  ({time.perf_counter() - start:.0f} s)")
    return 0


def _warn_threads(args: argparse.Namespace, exp: Any, scales: list[str]) -> None:
    """Say so where ``--threads`` would be overruled: an experiment trains the runs of the
    scales in its ``one_thread_at`` on one thread, whatever the command asked for."""
    one = sorted({s for s in scales if s in getattr(exp, "one_thread_at", ())})
    if args.threads is None or args.threads == 1 or not one:
        return
    warnings.warn(f"--threads {args.threads} is overruled: {exp.name} trains and measures its "
                  f"{' and '.join(one)}-scale runs on one thread, as verdict.json records "
                  "(models this small run slower on more, and one thread keeps their numbers "
                  "the same on every machine); drop --threads", stacklevel=2)


def _run_ladder(args: argparse.Namespace) -> int:
    from .experiments import get_experiment
    from .experiments.ladder import run_ladder, select_rungs
    from .report import load_all, make_report

    out = Path(args.out or Path("runs") / "ladder" / args.experiment)
    _check_out(out)
    rungs = [r.strip() for r in args.rungs.split(",") if r.strip()] if args.rungs else None
    if rungs == []:  # `--rungs ,` (`--rungs "$A,$B"` unset): ran no rung, status 0
        raise UsageError(f"--rungs {args.rungs!r} names no rung; give rung names separated by "
                         f"commas (e.g. --rungs cpu), or drop --rungs for every CPU rung")
    exp = get_experiment(args.experiment)
    _warn_threads(args, exp, [r.scale for r in select_rungs(exp, rungs)])
    start = time.perf_counter()
    summary = run_ladder(args.experiment, out, rungs=rungs, extra=args.set or [], log=_note)
    print()
    for row in summary["rungs"]:
        if row.get("status") == "done":  # with the experiment's own plots, as `run` draws
            make_report([out / row["rung"]], **_report_options(
                args.experiment, load_all([out / row["rung"]])[1]))
            print(f"{row['rung']:>12}: {row['verdict']} ({row.get('seeds')} seeds) — "
                  f"{row.get('reason', '')}")
        else:
            print(f"{row['rung']:>12}: {row['status']}"
                  + ("" if row["cpu"] else f"; to run it: {row['command']}"))
    print(f"\nladder: {summary['summary']}")
    print(f"effect vs scale: {out / 'ladder.png'}  ({time.perf_counter() - start:.0f} s)")
    return 0


def _report_options(name: str, runs: list[Any]) -> dict[str, Any]:
    """The plot options (``report_options``) of registered experiment ``name`` for a report of
    its ``runs``, as ``senslab run`` draws them: `senslab report runs/EXP` and each rung of a
    ladder rewrote report.html without them (hr_norm_vs_blowup's two scatters gone, ib_fixed_v's
    log-step axes linear). A scatter no run can draw yet (none finished) is left out with a
    notice; an unregistered name (a directory of another version) gets the defaults."""
    from .experiments import get_experiment

    try:
        options = dict(getattr(get_experiment(name), "report_options", {}))
    except KeyError:
        return {}
    pairs = []
    for pair in options.get("scatter", ()):
        if any(_drawable(run, pair[0]) and _drawable(run, pair[1]) for run in runs):
            pairs.append(pair)
        else:
            _note(f"the scatter of {pair[1]} against {pair[0]} is left out: no run has both "
                  "yet (finish the experiment's runs for it)")
    if "scatter" in options:
        options["scatter"] = pairs
    return options


def _drawable(run: Any, key: str) -> bool:
    """Whether ``run`` has a number for ``key`` (a final metric or ``config.<path>``)."""
    from .report.aggregate import is_number

    try:
        return is_number(run.lookup(key))
    except KeyError:
        return False


def _report(args: argparse.Namespace) -> int:
    from .report import final_table, format_table, load_all, make_report

    if args.out is not None:  # a file there failed late, as "file exists" with status 1
        _check_out(Path(args.out))
    elif len(args.paths) > 1:
        # the combined report went into the first run's directory (make_report's default),
        # replacing the report.html and plots that `senslab report` of that run alone wrote
        raise UsageError(f"{len(args.paths)} directories are reported together, and without "
                         f"--out the report would be written into the first run's directory, "
                         f"replacing {args.paths[0]}'s own report.html; give --out DIR (e.g. "
                         "--out runs/report)")
    experiments, runs = load_all(args.paths)
    own = (_report_options(experiments[0].name, runs)
           if len(args.paths) == 1 and len(experiments) == 1 else {})
    path = make_report(args.paths, out_dir=args.out, **own)
    print(format_table(final_table(runs)))
    for exp in experiments:  # each experiment's verdict, as `senslab run` prints it
        of = "" if len(experiments) == 1 else f" of {exp.path}"
        if exp.verdict is None:
            print(f"\nverdict{of}: not judged yet (no verdict.json)")
            continue
        caveat = exp.verdict_caveat()  # verdict.json rests on runs that are not all here
        print(f"\nverdict{of}{' (of runs not all here)' if caveat else ''}: "
              f"{exp.verdict.get('verdict', 'unknown')} — {exp.verdict.get('reason', '')}")
        if caveat:
            print(f"  {caveat[0].upper()}{caveat[1:]}.")
    print(f"report: {path}")
    return 0


def _reproduction(args: argparse.Namespace) -> int:
    from .experiments import list_experiments
    from .reproduction import reproduction

    runs = Path(args.runs or "runs")
    if args.runs is not None and args.dirs:
        raise UsageError(f"--runs {args.runs} says where the default directories are, and "
                         "directories are given: it would have no effect; drop --runs, or the "
                         "directories")
    # before anything is recorded: a REPRODUCTION.md that cannot be written failed after the
    # records, naming a temporary file ("nodir/.REPRODUCTION.md.<pid>.<hex>.tmp: no such file")
    out, records = Path(args.out), Path(args.records)
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; give the file to write (e.g. "
                         f"{out / 'REPRODUCTION.md'})")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out} cannot be written: {out.parent} is not a directory; "
                         "create it first, or choose another --out")
    _check_out(records, "--records")
    from .reproduction import holds_records, shown_records

    if out.is_file() and not holds_records(records):
        # a mistyped --records (or the command run from another directory) rendered the
        # existing file from no records at all: every recorded row became "not run here",
        # exit status 0, and REPRODUCTION.md lost its results without a word
        try:
            shown = shown_records(out.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            shown = []
        if shown:
            what = "no such directory" if not records.is_dir() else "no record in it"
            names = ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5
                                             else "")
            raise UsageError(
                f"--records {records} holds no record ({what}), but {out} shows "
                f"{len(shown)} recorded row{'s' if len(shown) != 1 else ''} ({names}): written "
                f"from {records}, every one would read \"not run here\"; give the --records "
                "directory those rows were recorded in (default: reproduction, in the working "
                f"directory), or delete {out} to write it afresh")
    if args.runs is not None and not runs.is_dir():
        # a mistyped --runs recorded nothing and rewrote REPRODUCTION.md, exit status 0
        raise UsageError(f"--runs {runs}: no such directory; give the directory that holds "
                         "the experiment directories (`senslab run NAME --out RUNS/NAME`)")
    if not args.dirs and not any((runs / n / "verdict.json").is_file()
                                 for n in list_experiments()):
        none = "" if holds_records(records) else " (none: every experiment's row reads \"not " \
                                                 "run here\")"
        _note(f"no finished experiment in {runs} (no {runs}/<experiment>/verdict.json): nothing "
              f"new is recorded; {args.out} is written from the records in {args.records}"
              f"{none}")
    path = reproduction(args.dirs or None, records=args.records, out=args.out,
                        runs_root=runs)
    print(f"wrote {path}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    args.experiment, args.scale = "demo", "cpu"
    return _run(args)


def parser() -> argparse.ArgumentParser:
    # the module docstring's first line, less its reST markup (``senslab`` read literally)
    p = argparse.ArgumentParser(prog="senslab",
                                description=__doc__.splitlines()[0].replace("``", ""))
    sub = p.add_subparsers(dest="command", required=True)
    # every command takes --threads: small models on a shared CPU run many times faster with
    # fewer threads than cores (oversubscription), big ones want all cores
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--threads", type=int, metavar="N",
                        help="torch CPU threads (default: torch's choice, usually all cores)")

    s = sub.add_parser("list", parents=[shared],
                       help="list registered models, datasets or experiments")
    s.add_argument("what", choices=["models", "datasets", "experiments"])
    s.add_argument("pattern", nargs="?", default="*")
    s.set_defaults(fn=_list)

    def common(s: argparse.ArgumentParser, seed_help: str | None = None) -> None:
        s.add_argument("--model", help=f"registered model name (default: {DEFAULT_MODEL}; "
                                        "measure --checkpoint: the run's)")
        s.add_argument("--data", help=f"registered dataset name (default: {DEFAULT_DATA}; "
                                      "measure --checkpoint: the run's)")
        s.add_argument("--data-root", help="directory holding the dataset's files")
        # None, so that a seed given can be told from one left out (measure --checkpoint takes
        # the run's; a --set seed= that contradicts it is refused: _check_option_sets)
        s.add_argument("--seed", type=int, help=seed_help or f"seed (default: {DEFAULT_SEED})")
        s.add_argument("--name")
        s.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="config override, e.g. optim.lr=0.05 (repeatable)")

    s = sub.add_parser("train", parents=[shared],
                       help="train one model with sensitivity tracked")
    common(s)
    s.add_argument("--out", help="run directory (re-running resumes it)")
    s.set_defaults(fn=_train)

    s = sub.add_parser("measure", parents=[shared],
                       help="sensitivity of a model (or a run's checkpoint) on data",
                       description="Token-wise sensitivity of a model on data. With --checkpoint, "
                                   "--seed, --num-examples, --sigma and --repeats left out are "
                                   "the run's (its seed and track.* settings), so the command "
                                   "measures the examples the run tracked with the same noise "
                                   "and prints its sens/train (--split test: sens/val) as "
                                   "logged at the checkpoint's step; "
                                   "an option given wins, and stderr says which values are the "
                                   "run's.")
    # (--hf/--timm draw either split's examples with seed + 1, as their numbers always were)
    common(s, seed_help=f"seed of the examples drawn (--split train: seed + 1, test: seed + 2; "
                        f"--hf, --timm: seed + 1 for either split), of the noise draws (through "
                        f"senslab.measure.noise_seed(seed): a stream apart from the weights), "
                        f"and of an untrained model's weights or a new head (default: "
                        f"{MEASURE_DEFAULTS['seed']}; --checkpoint: the run's seed)")
    s.add_argument("--checkpoint", metavar="RUN_DIR",
                   help="a run directory: measure its last checkpoint with its config (--set may "
                        "change only device, data.root and data.download) and, for the options "
                        "left out, its seed and track.* settings")
    s.add_argument("--split", choices=["train", "test"], default="train")
    s.add_argument("--sigma", type=float, nargs="+", action="extend",
                   help=f"noise standard deviation(s) (default: {MEASURE_DEFAULTS['sigma'][0]:g}; "
                        "--checkpoint: the run's track.sigma)")
    s.add_argument("--repeats", type=int,
                   help=f"noise draws per token (default: {MEASURE_DEFAULTS['repeats']}; "
                        "--checkpoint: the run's track.repeats)")
    s.add_argument("--num-examples", type=int,
                   help=f"examples measured, a seeded random subset of the split (default: "
                        f"{MEASURE_DEFAULTS['num_examples']}; --checkpoint: the run's "
                        "track.num_examples)")
    s.add_argument("--autocast", choices=sorted(AUTOCAST),
                   help="run the perturbed forwards under bf16/fp16 autocast (GPU: 2-6× faster, "
                        "within the float32 interval; see the README's GPU benchmark)")
    s.add_argument("--precision", choices=["auto", "float32", "bf16-checked", "int8-checked"],
                   default="auto",
                   help="float32; bf16-checked (copies in bf16, copies near the decision "
                        "boundary re-checked in float32: float32's decisions); int8-checked "
                        "(the same with int8 linear layers, CPU); auto (default) picks the "
                        "checked precision whose matrix products run faster than float32 here, "
                        "and on a CPU falls back to float32 where its calibration, timed, "
                        "finds it would not pay")
    s.add_argument("--compile", action="store_true",
                   help="evaluate the perturbed copies through torch.compile (the model's call "
                        "and its reuse paths; compiling takes minutes on a small CPU)")
    s.add_argument("--hf", metavar="NAME_OR_PATH",
                   help="a Hugging Face model: a directory save_pretrained wrote, or a hub name "
                        "in the local cache (default data: rotten_tomatoes for text, digits for "
                        "images, tokenized/resized/normalised for the model)")
    s.add_argument("--timm", metavar="NAME",
                   help="a timm model with its pretrained weights (from the local cache)")
    s.add_argument("--sigma-space", choices=["input", "pixel"], default="input",
                   help="images: sigma on the model's inputs (default) or on [0, 1] pixels, "
                        "divided per channel by the model's normalisation std")
    s.set_defaults(fn=_measure)

    s = sub.add_parser("run", parents=[shared],
                       help="run a registered experiment and write its report")
    s.add_argument("experiment")
    # = senslab.experiments.base.SCALES + "ladder", written out so that --help does not import torch
    # (tests/experiments/test_overrides.py checks they agree)
    s.add_argument("--scale", choices=["cpu", "paper", "ladder"], default="cpu",
                   help="cpu (default), paper, or ladder: every CPU rung of the experiment's "
                        "scale ladder into OUT/<rung> (default OUT: runs/ladder/NAME)")
    s.add_argument("--rungs", metavar="A,B",
                   help="with --scale ladder: only these rungs (a GPU rung runs only if named)")
    s.add_argument("--out")
    s.add_argument("--set", action="append", metavar="KEY=VALUE")
    s.set_defaults(fn=_run)

    s = sub.add_parser("report", parents=[shared],
                       help="plots and report.html from run/experiment directories")
    s.add_argument("paths", nargs="+")
    s.add_argument("--out", help="where report.html and its plots go (default: the one "
                                 "directory given; needed for several)")
    s.set_defaults(fn=_report)

    s = sub.add_parser("reproduction", parents=[shared],
                       help="record finished experiment directories and write REPRODUCTION.md")
    s.add_argument("dirs", nargs="*",
                   help="experiment directories (default: RUNS/<name> for every experiment)")
    s.add_argument("--runs", help="where the default directories are (default: runs)")
    s.add_argument("--records", default="reproduction", help="where the JSON records are kept")
    s.add_argument("--out", default="REPRODUCTION.md")
    s.set_defaults(fn=_reproduction)

    s = sub.add_parser("demo", parents=[shared],
                       help="the headline experiment at CPU scale, with its report")
    s.add_argument("--out")
    s.add_argument("--set", action="append", metavar="KEY=VALUE")
    s.set_defaults(fn=_demo)
    return p


#: options that name something (a model, a folder, a run): an empty value, as an unset shell
#: variable gives (``--data-root "$DATA"``), was taken for the option left out — its default, or
#: for --checkpoint an untrained model — without a word
_NOT_EMPTY = ("model", "data", "data_root", "name", "checkpoint", "hf", "timm", "out", "rungs",
              "runs", "records")


def _empty_option(dest: str) -> str:
    option = "--" + dest.replace("_", "-")
    if dest == "data_root":
        return (f"{option} is empty (an unset shell variable?): an empty path would mean the "
                f"working directory; give the folder that holds the data set's files, or drop "
                f"{option} to use SENSLAB_DATA or the data home")
    return f"{option} is empty (an unset shell variable?): give a value, or drop {option}"


#: options and arguments that are paths: a leading ``~`` is the home directory, as the shell
#: has it; a shell leaves ``--out=~/runs/x`` as it is, and ``~`` was a folder in the working
#: directory (the run trained into ./~/runs/x, --checkpoint and --data-root were not found;
#: ``--hf=~/bert`` was taken for a hub name, "Repo id must use alphanumeric chars": no hub name
#: starts with ``~``)
_PATHS = ("out", "checkpoint", "data_root", "runs", "records", "paths", "dirs", "hf")


def _warn_repeated_sets(items: list[str]) -> None:
    """Say so when one ``--set`` key is given two different values. The overrides apply in
    order and the last one is used — on purpose: an error's fix "add --set
    model.overrides.dim=40" is added after the ``dim=32`` it corrects — but a key set twice by
    mistake (``--set optim.lr=0.1`` from a script, then ``--set optim.lr=0.01`` typed after it)
    trained at the second value without a word. The same value twice says one thing: no
    warning. An item without ``=`` is left to the override's own check."""
    seen: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            continue
        key, value = (part.strip() for part in item.split("=", 1))
        if key in seen and seen[key] != value:
            warnings.warn(f"--set {key} is given twice, as {key}={seen[key]} and then "
                          f"{key}={value}: the last is used ({key}={value}); drop the other "
                          "--set if that is not what you meant", stacklevel=2)
        seen[key] = value


#: options that set a config key themselves, and the key
_OPTION_KEYS = {"model": "model.name", "data": "data.name", "data_root": "data.root",
                "seed": "seed", "name": "name"}


def _check_option_sets(args: argparse.Namespace) -> None:
    """Refuse an option and a ``--set`` that give its config key two values (``--seed 3 --set
    seed=4``): the ``--set`` applies after the option, so its value won without a word (with
    ``measure``, a seed for the untrained weights other than that of the examples and noise).
    The same value twice (a data root as ``~/x`` and as the path it expands to) says one thing
    and passes. Left to the later checks, whose messages name the fix: with ``--checkpoint``
    every key but ``data.root`` (the run fixes its model, data and seed), with ``--hf``/
    ``--timm`` the model and seed (``--set model.*``/``seed`` has no effect there), and a value
    the key cannot take."""
    if getattr(args, "checkpoint", None):
        dests: tuple[str, ...] = ("data_root",)
    elif getattr(args, "hf", None) or getattr(args, "timm", None):
        dests = ("data", "data_root")
    else:
        dests = tuple(_OPTION_KEYS)
    given = {_OPTION_KEYS[d]: d for d in dests if getattr(args, d, None) is not None}
    items = [item for item in getattr(args, "set", None) or []
             if "=" in item and item.split("=", 1)[0].strip() in given]
    if not items:
        return
    from .train.config import RunConfig, set_option

    for item in items:
        key, value = item.split("=", 1)
        key = key.strip()
        scratch = RunConfig()
        try:
            set_option(scratch, key, value)  # the value as the config would hold it
        except (KeyError, TypeError, ValueError):
            continue
        set_to, option = scratch, getattr(args, given[key])
        for part in key.split("."):
            set_to = getattr(set_to, part)
        if key == "data.root":
            same = isinstance(set_to, str) and (Path(os.path.expanduser(set_to))
                                                == Path(os.path.expanduser(option)))
        else:
            same = set_to == option
        if not same:
            flag = "--" + given[key].replace("_", "-")
            raise UsageError(f"{flag} {option} and --set {key}={value.strip()} give {key} two "
                             "values; pass one of them")


def _home(value: Any) -> Any:
    if isinstance(value, list):
        return [_home(v) for v in value]
    return os.path.expanduser(value) if isinstance(value, str) and value[:1] == "~" else value


#: ``--threads`` above this many per CPU (:func:`_usable_cpus`) is refused: more threads than
#: CPUs only oversubscribe them, and torch's thread pool crashes the process at counts like 100000
MAX_THREADS_PER_CPU = 4


def _usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (a batch job's cores, ``taskset``) where
    the system says it, else ``os.cpu_count()`` (the machine's, which a job given 8 of 128
    cores would have taken for its own)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS, Windows: no affinity
        return os.cpu_count() or 1


def _check_args(args: argparse.Namespace) -> None:
    """Option values argparse's types let through but no command can use."""
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be ≥ 1, got {args.threads}")
    cpus = _usable_cpus()
    if args.threads is not None and args.threads > MAX_THREADS_PER_CPU * cpus:
        # torch's thread pool took any count: --threads 100000 ended the process with a
        # segmentation fault (status 139), and thousands of threads only slow a run down
        raise UsageError(f"--threads {args.threads} is far more than the {cpus} CPU"
                         f"{'s' if cpus != 1 else ''} this process may use (at most "
                         f"{MAX_THREADS_PER_CPU * cpus}"
                         f", {MAX_THREADS_PER_CPU} per CPU, are taken): give --threads {cpus} "
                         "or fewer, or drop --threads for torch's choice")
    if args.threads is not None and args.threads > cpus:
        # taken, as torch takes it, but said: --threads 512 on 2 CPUs ran without a word, its
        # threads taking turns on the CPUs and waiting on each other at every barrier. Printed,
        # not warnings.warn: once per command, whatever a warnings filter says
        _error(f"--threads {args.threads} is more than the {cpus} CPU{'s' if cpus != 1 else ''} "
               "this process may use: the threads take turns on them and wait on each other, so "
               f"the command runs slower than with --threads {cpus} or fewer; "
               "on a shared machine give the cores no other job uses", kind="warning")
    for dest in _NOT_EMPTY:
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.strip():
            raise UsageError(_empty_option(dest))
    for dest in _PATHS:
        if hasattr(args, dest):
            setattr(args, dest, _home(getattr(args, dest)))
    _warn_repeated_sets(getattr(args, "set", None) or [])
    if args.command != "measure":
        _check_option_sets(args)
        return
    if args.name is not None:
        raise UsageError(f"--name {args.name} names the run directory of `senslab train`; "
                         "`senslab measure` writes none, so it would have no effect; drop --name")
    # (None: left out, measure's default or with --checkpoint the run's: _measure_options)
    if args.num_examples is not None and args.num_examples < 1:
        raise UsageError(f"--num-examples must be ≥ 1, got {args.num_examples} (the number of "
                         "examples measured, e.g. --num-examples 512)")
    if args.seed is not None:
        # with --checkpoint the seed reaches no config, whose check refused it: --seed 2**32
        # measured seed 0's examples and noise without a word, --seed -1 passed and 2**64 was
        # "Overflow when unpacking long long"
        import dataclasses

        from .train.config import RunConfig, check_value

        meta = next(f.metadata for f in dataclasses.fields(RunConfig) if f.name == "seed")
        try:
            check_value("--seed", args.seed, meta)
        except ValueError as err:
            raise UsageError(str(err)) from None
    if args.repeats is not None and args.repeats < 1:
        raise UsageError(f"--repeats must be ≥ 1, got {args.repeats} (noise draws per token)")
    for sigma in args.sigma or []:
        if not (math.isfinite(sigma) and sigma > 0):
            raise UsageError(f"--sigma must be positive and finite, got {sigma:g} (the noise "
                             "standard deviation, e.g. --sigma 0.1)")
    if args.autocast and args.precision != "auto":
        raise UsageError(f"--autocast {args.autocast} keeps the low precision's own decisions; "
                         f"--precision {args.precision} contradicts it: pass one of them")
    _check_option_sets(args)  # after --name, which measure refuses whatever --set says


#: frames that pass every torch call on (senslab's torch-function and dispatch modes): an error
#: raised inside them is the call's, raised for the frame that made the call
_PASS_THROUGH = ("__torch_function__", "__torch_dispatch__")


def _raised_by_senslab(err: BaseException) -> bool:
    """Whether ``err`` was raised by senslab's own code: its innermost frame, past the torch
    modes that pass a call on (a torch or transformers error inside a measurement was shown as
    a message senslab wrote, without the hint that it was not expected), is in the package."""
    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    while len(frames) > 1 and frames[-1].f_code.co_name in _PASS_THROUGH:
        frames.pop()
    if not frames:
        return False
    package = Path(__file__).resolve().parent
    return Path(frames[-1].f_code.co_filename).resolve().is_relative_to(package)


_OS_FIXES = {
    errno.EACCES: "check its permissions, or choose a directory you can write (e.g. for --out)",
    errno.EPERM: "check its permissions, or choose a directory you can write (e.g. for --out)",
    errno.EROFS: "choose a directory on a writable file system (e.g. for --out)",
    errno.ENOTDIR: "a part of that path is a file, not a directory; choose another path",
    errno.EISDIR: "it is a directory; give a file name",
    errno.ENOSPC: "free some space, or choose a directory on another disk (e.g. for --out)",
    errno.EDQUOT: "free some space, or choose a directory on another disk (e.g. for --out)",
}


def _os_message(err: OSError) -> str:
    if not (err.filename and err.strerror):
        return str(err)  # senslab's own OSErrors carry a full message
    path = f"{err.filename}" + (f" → {err.filename2}" if err.filename2 else "")
    fix = _OS_FIXES.get(err.errno or 0)
    return f"{path}: {err.strerror.lower()}" + (f"; {fix}" if fix else "")


def explain(err: Exception) -> tuple[int, str]:
    """(exit status, one-line message) for an exception that ended a command (see the module
    docstring for the classes)."""
    if isinstance(err, Warning):
        # raised only because the warnings filter says so (-W error, PYTHONWARNINGS=error):
        # the message is senslab's or a library's warning, not a bug
        return 1, (f"{err} ({type(err).__name__}, made an error by the warnings filter: "
                   "-W error or PYTHONWARNINGS; the command stopped there)")
    if isinstance(err, json.JSONDecodeError):
        return 2, (f"a JSON file is truncated or damaged ({err.msg}, line {err.lineno}); run "
                   "with SENSLAB_DEBUG=1 to see which, then restore or delete it")
    if isinstance(err, KeyError):
        return 2, str(err.args[0]) if err.args else "KeyError"
    if isinstance(err, FloatingPointError):
        return 1, str(err)
    if isinstance(err, FileNotFoundError):
        return 2, _os_message(err)
    if isinstance(err, OSError):
        return 1, _os_message(err)
    if isinstance(err, (ValueError, TypeError, ImportError)):
        return 2, str(err)
    if isinstance(err, RuntimeError) and _raised_by_senslab(err):
        return 1, str(err)
    text = str(err).strip().splitlines()
    return 1, (f"unexpected {type(err).__name__}" + (f": {text[0]}" if text else "")
               + " (probably a bug: run again with SENSLAB_DEBUG=1 for the traceback and "
               "report it)")


def _interrupted(err: KeyboardInterrupt) -> str:
    step = getattr(err, "step", None)
    if step is None:
        return "interrupted"
    text = str(err)
    return text if text.startswith("interrupted") else (
        f"interrupted at step {step}; re-run the same command to resume")


def _error(message: str, kind: str = "error") -> None:
    one_line = "; ".join(part.strip() for part in message.splitlines() if part.strip())
    try:
        print(f"senslab: {kind}: {one_line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed too: nothing left to tell
        pass


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """``warnings.showwarning`` for the command: the message alone, no source line."""
    _error(str(message), kind="warning")


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null, so that the flush at interpreter exit
    does not raise again ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout is not a real file (tests)
        pass


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` (default: ``sys.argv[1:]``) and return its exit status."""
    debug = os.environ.get("SENSLAB_DEBUG", "") not in ("", "0")
    if argv is None and not debug:  # the real command line (tests pass argv: leave them be)
        warnings.showwarning = _show_warning
    try:
        args = parser().parse_args(argv)
        _check_args(args)
        if args.threads is not None:
            import torch

            torch.set_num_threads(args.threads)
        code = args.fn(args)
        sys.stdout.flush()  # a closed pipe fails here, inside the handlers, not at exit
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return 141
    except KeyboardInterrupt as err:
        if debug:
            raise
        _error(_interrupted(err))
        # a second Ctrl-C while the interpreter shuts down printed a traceback from an atexit
        # finalizer after the line above: from here on it ends the process quietly (the
        # command's process only: main([...]) called from Python keeps its caller's handler)
        if argv is None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        return 130
    except Exception as err:
        if debug:
            raise
        code, message = explain(err)
        _error(message)
        return code


if __name__ == "__main__":
    sys.exit(main())
