"""Run configuration: dataclasses, dotted command-line overrides, JSON round-trip.

``--set optim.lr=0.05`` sets one field; values are parsed as Python/JSON literals and checked
against the field's type and its valid range or choices, declared once on the field
(:func:`ranged`, :func:`one_of`, :func:`matching`); an unknown key is an error that names the
closest valid key. :func:`validate` checks a whole config the same way (``fit`` calls it first,
so a config built in code is checked before anything is written).
``model.overrides`` and ``data.options`` are free-form dicts passed on to the model factory and
the dataset loader (which check their own keys); ``data.options`` may not hold ``root``,
``download`` or ``split``, which ``data.root``, ``data.download`` and the splits set.

:func:`set_option`, :func:`apply_overrides` and :func:`validate` work on any dataclass, not only
:class:`RunConfig`: every experiment's settings (``senslab run NAME --set steps=200``) go through
them, so an override means and is checked the same everywhere.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._seeds import CPU_SEED_END

C = TypeVar("C")


def ranged(default: Any, *, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None) -> Any:
    """A numeric field whose values must satisfy the given bounds (None stays allowed when the
    field's type allows it)."""
    return field(default=default, metadata={"range": (ge, gt, le, lt)})


#: seeds run from 0 to this, exclusive: torch's CPU generator keeps only a seed's low 32 bits
SEED_END = CPU_SEED_END


def seeded(default: int = 0) -> Any:
    """A seed field: an int in [0, 2**32). torch's CPU generator (Mersenne Twister) keeps only a
    seed's low 32 bits, so seed 2**32 + s would draw, and train, exactly as seed s: two runs read
    as independent seeds would be one run twice."""
    return field(default=default, metadata={
        "range": (0, None, None, SEED_END),
        "why": "torch's CPU generator keeps only a seed's low 32 bits, so a seed of 2**32 + s "
               "would give exactly seed s's run; use a seed below 2**32 = 4294967296",
    })


def one_of(default: str, *choices: str) -> Any:
    """A string field with a fixed set of valid values."""
    return field(default=default, metadata={"choices": (default, *choices)})


def matching(default: str, pattern: str, hint: str) -> Any:
    """A string field whose values must match ``pattern`` (``hint`` says how, in the message)."""
    return field(default=default, metadata={"pattern": pattern, "hint": hint})


def _fmt(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _describe(rule: tuple[Any, ...]) -> str:
    ge, gt, le, lt = rule
    low = f"[{_fmt(ge)}" if ge is not None else f"({_fmt(gt)}" if gt is not None else None
    high = f"{_fmt(le)}]" if le is not None else f"{_fmt(lt)})" if lt is not None else None
    if low and high:
        return f"in {low}, {high}"
    if low:
        return f"≥ {_fmt(ge)}" if ge is not None else f"> {_fmt(gt)}"
    return f"≤ {_fmt(le)}" if le is not None else f"< {_fmt(lt)}"


def check_value(key: str, value: Any, meta: Any) -> None:
    """Raise ``ValueError`` naming ``key``, ``value`` and the valid range/choices when ``value``
    breaks the rule declared in the field's ``meta``."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, (list, tuple)):  # a tuple setting: the rule holds for every element
        for v in value:
            check_value(key, v, meta)
        return
    if "range" in meta and isinstance(value, (int, float)):
        ge, gt, le, lt = meta["range"]
        ok = (math.isfinite(value)
              and (ge is None or value >= ge) and (gt is None or value > gt)
              and (le is None or value <= le) and (lt is None or value < lt))
        if not ok:
            high = (lt is not None and value >= lt) or (le is not None and value > le)
            why = f"; {meta['why']}" if high and "why" in meta else ""
            raise ValueError(f"{key} must be {_describe(meta['range'])}, got {value!r}{why}")
    if "choices" in meta and value not in meta["choices"]:
        also = f", {meta['also']}" if "also" in meta else ""
        raise ValueError(f"{key} must be one of {', '.join(meta['choices'])}{also}, got "
                         f"{value!r}")
    if "pattern" in meta and not re.fullmatch(meta["pattern"], str(value)):
        raise ValueError(f"{key} must be {meta['hint']}, got {value!r}")


@dataclass
class ModelConfig:
    name: str = "mlp"
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    name: str = "digits"
    root: str | None = None
    download: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    train_split: str = "train"
    test_split: str = "test"
    # keep a seeded random subset of this many training examples
    train_subset: int | None = ranged(None, ge=1)


@dataclass
class OptimConfig:
    name: str = one_of("sgd", "adam", "adamw", "ngd", "sngd", "sps")
    lr: float = ranged(0.1, gt=0)  # unused by sps (its step is the Polyak one)
    momentum: float = ranged(0.0, ge=0, lt=1)
    weight_decay: float = ranged(0.0, ge=0)
    eta_max: float | None = ranged(None, gt=0)  # cap for ngd / sps
    # constant | step (×gamma every step_epochs) | cosine; scales optim.lr, or for sps a factor
    # on its whole step that starts at 1 (senslab.optim.SPS's lr)
    schedule: str = one_of("constant", "step", "cosine")
    step_epochs: int = ranged(8, ge=1)
    gamma: float = ranged(0.5, gt=0)


@dataclass
class TrainConfig:
    epochs: int = ranged(10, ge=1)
    batch_size: int = ranged(100, ge=1)
    max_steps: int | None = ranged(None, ge=1)
    # stop once reached (comparable train accuracy)
    target_train_acc: float | None = ranged(None, ge=0, le=1)
    loss: str = one_of("auto", "ce", "bce", "mse")
    # none | noise (augmentation) | patch_mse (sensitivity-regularized loss)
    regularizer: str = one_of("none", "noise", "patch_mse")
    reg_alpha: float = ranged(0.5, ge=0, le=1)
    reg_sigma: float = ranged(1.0, ge=0)
    reg_patch: int = ranged(4, ge=1)
    checkpoint_every: int = ranged(0, ge=0)  # steps; 0 = at the end of every epoch
    keep_checkpoints: int = ranged(2, ge=0)  # 0 = keep all
    eval_batch_size: int = ranged(500, ge=1)


#: the ``train.reg_*`` settings each ``train.regularizer`` reads (:func:`validate` refuses a
#: non-default one that the chosen regularizer would ignore)
REGULARIZER_READS = {"none": (), "noise": ("reg_sigma",),
                     "patch_mse": ("reg_alpha", "reg_sigma", "reg_patch")}


@dataclass
class TrackConfig:
    # evaluate every `every` epochs (unit=epoch) or steps (unit=step)
    every: int = ranged(1, ge=1)
    unit: str = one_of("epoch", "step")
    # noise standard deviation of token-wise sensitivity (0: not measured)
    sigma: float = ranged(0.1, ge=0)
    repeats: int = ranged(1, ge=1)
    num_examples: int = ranged(256, ge=1)  # fixed, seeded subset of the training set
    val: bool = False  # also measure on the same number of test examples
    chunk_size: int | None = ranged(None, ge=1)
    sharpness: bool = False  # ShOp / ShPred (output sharpness) at every evaluation
    sharpness_sigma: float = ranged(0.05, gt=0)
    loss_sharpness: bool = False  # Hahn & Rofin's E[L(θ+Δ)] − L(θ), positional params excluded
    loss_sharpness_sigma: float = ranged(0.02, gt=0)
    weight_norm: bool = True
    # accuracy/loss on this many examples (None: all)
    eval_examples: int | None = ranged(None, ge=1)
    # where else every metrics.jsonl record goes (train/report_to.py); logging only: not part of
    # the run's identity (LOGGING_ONLY), so turning it on resumes a run instead of refusing it
    report_to: list[str] = field(default_factory=list,
                                 metadata={"choices": ("tensorboard", "wandb"),
                                           # Hugging Face's report_to="none" is the empty list
                                           "also": "or none at all: an empty list (--set "
                                                   "'track.report_to=[]', the default)"})


@dataclass
class RunConfig:
    name: str = "run"
    label: str = ""  # curve/bar this run belongs to in reports (default: the model name)
    seed: int = seeded()
    device: str = matching("auto", r"auto|cpu|mps|cuda(:\d+)?", "auto, cpu, cuda, cuda:N or mps")
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    track: TrackConfig = field(default_factory=TrackConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        cfg = cls()
        for key, value in _flatten(d).items():
            set_option(cfg, key, value, parse=False)
        return cfg


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("overrides", "options"):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def valid_keys(cfg: Any, prefix: str = "", entries: bool = False) -> list[str]:
    """The dotted keys of the dataclass ``cfg``; with ``entries``, a dict field is listed as
    ``field.<key>`` (it takes any entry)."""
    keys = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            keys += valid_keys(v, f"{prefix}{f.name}.", entries)
        else:
            keys.append(f"{prefix}{f.name}" + (".<key>" if entries and isinstance(v, dict) else ""))
    return keys


#: a number written with some nonzero digit (so not 0 whatever it rounds to)
_NONZERO_NUMBER = re.compile(r"[+-]?(?=[\d.]*[1-9])(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def parse_value(text: str) -> Any:
    """``"0.1"`` → 0.1, ``"[1, 2]"`` → [1, 2], ``"none"``/``"null"`` → None, else the string."""
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


@functools.cache
def _options(hint: Any) -> tuple[tuple[Any, Any, tuple[Any, ...]], ...]:
    """The types a value of type ``hint`` may have, each with its origin and arguments
    (``str | None`` → ``(str, str, ()), (NoneType, NoneType, ())``)."""
    origin = typing.get_origin(hint)
    options = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    return tuple((opt, typing.get_origin(opt) or opt, typing.get_args(opt)) for opt in options)


def _check_type(key: str, value: Any, hint: Any) -> Any:
    """``value`` as the type ``hint`` asks for (an int for a float, a list for a tuple), or a
    ``TypeError`` naming ``key``, the type and the value."""
    try:
        options = _options(hint)
    except TypeError:  # an unhashable hint
        options = _options.__wrapped__(hint)
    for opt, base, args in options:
        if opt is Any:
            return value
        if opt is type(None) and value is None:
            return None
        if base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if base is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if base in (str, bool, dict) and isinstance(value, base):
            return value
        if base in (tuple, list) and isinstance(value, (tuple, list)):
            items = _check_items(value, base, args)
            if items is not None:
                return items
    names = " or ".join(_type_name(o) for o, _, _ in options)
    raise TypeError(f"{key} must be {names}, got {value!r}")


def _check_items(value: Any, base: type, args: tuple[Any, ...]) -> Any:
    """The elements of a list/tuple value checked against ``tuple[int, ...]``,
    ``tuple[float, float]``, ``list[str]``...; None when they do not fit."""
    if base is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(value):
            return None
        hints = list(args)
    else:
        hints = [args[0] if args else Any] * len(value)
    try:
        return base(_check_type("", v, h) for v, h in zip(value, hints, strict=True))
    except TypeError:
        return None


class UnknownKey(KeyError):
    """An override key that names no field; ``key`` is the key as given."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


def unknown_key(key: str, *cfgs: Any) -> UnknownKey:
    """The error for ``key`` naming no field of any of ``cfgs``: the closest valid key and every
    valid key."""
    keys = list(dict.fromkeys(k for cfg in cfgs for k in valid_keys(cfg)))
    hint = _closest(key, keys, cfgs)
    hint = f" Did you mean {hint!r}?" if hint else ""
    listed = ", ".join(dict.fromkeys(k for cfg in cfgs for k in valid_keys(cfg, entries=True)))
    return UnknownKey(f"unknown config key {key!r}.{hint} Valid keys: {listed}", key)


def _closest(key: str, keys: list[str], cfgs: tuple[Any, ...]) -> str | None:
    """The valid key ``key`` most likely meant. Spelling alone (difflib on the dotted key) named
    ``train.loss`` for ``train.lr``, nothing for ``lr`` and ``model.name`` for ``model.depth``;
    so, in order: a key of the same field name in another section (``lr`` → ``optim.lr``), a
    near spelling, an entry of the section's free-form dict (``model.depth`` →
    ``model.overrides.depth``), a looser spelling."""
    *section, name = key.split(".")
    same = [k for k in keys if k.rsplit(".", 1)[-1] == name]
    if same:
        return difflib.get_close_matches(key, same, n=1, cutoff=0)[0]
    near = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
    if near:
        return near[0]
    for cfg in cfgs if section else ():
        obj = cfg
        for part in section:
            obj = getattr(obj, part, None) if dataclasses.is_dataclass(obj) else None
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            entries = [f.name for f in dataclasses.fields(obj)
                       if isinstance(getattr(obj, f.name), dict)]
            if entries:
                return ".".join([*section, entries[0], name])
    loose = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    return loose[0] if loose else None


def set_option(cfg: Any, key: str, value: Any, parse: bool = True) -> None:
    """Set dotted ``key`` (e.g. ``"optim.lr"``, ``"model.overrides.depth"``, ``"steps"``) on the
    dataclass ``cfg`` (a :class:`RunConfig` or an experiment's settings), checked against the
    field's type hint and its declared range/choices (:func:`check_value`): ``KeyError`` for an
    unknown key (naming the closest valid one), ``TypeError``/``ValueError`` naming the key, the
    value and what is valid. A ``dict`` field takes ``field.<entry>`` keys without checking them
    (the model factory or data loader does); it is replaced, never changed in place.

    A text value for a ``str`` field is taken as written when it does not parse to a string
    (``only=0`` means ``"0"``)."""
    raw = value
    if parse and isinstance(value, str):
        value = parse_value(value)
        if isinstance(value, float) and value == 0 and _NONZERO_NUMBER.fullmatch(raw.strip()):
            # 1e-400 read as 0.0 turned sensitivity tracking off (σ = 0: not measured); one
            # too large reads as inf, which every field's range refuses
            raise ValueError(f"{key}={raw.strip()} is below a float's range: it reads as "
                             f"{value}; write 0, or a number of size 1e-308 or more")
    parts = key.split(".")
    obj: Any = cfg
    for i, part in enumerate(parts):
        if part not in {f.name for f in dataclasses.fields(obj)}:
            raise unknown_key(key, cfg)
        current = getattr(obj, part)
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(current):
                raise KeyError(f"{key} is a section; set one of its fields, e.g. "
                               f"{key}.{dataclasses.fields(current)[0].name}")
            hint = _hints(type(obj))[part]
            try:
                value = _check_type(key, value, hint)
            except TypeError:
                if not (parse and isinstance(raw, str)):
                    raise
                if _allows(hint, str):
                    value = raw
                elif _str_sequence(hint) is not None:  # report_to=tensorboard,wandb
                    seq = _str_sequence(hint)
                    value = seq(_names(raw))
                else:
                    raise
            check_value(key, value, _field(obj, part).metadata)
            setattr(obj, part, value)
            return
        if isinstance(current, dict):  # free-form dicts: model.overrides.*, data.options.*
            if i != len(parts) - 2:
                raise KeyError(f"{key}: {'.'.join(parts[:i + 1])} entries are single values")
            setattr(obj, part, {**current, parts[-1]: value})
            return
        if not dataclasses.is_dataclass(current):
            raise unknown_key(key, cfg)
        obj = current


def _allows(hint: Any, kind: type) -> bool:
    origin = typing.get_origin(hint)
    options = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    return kind in options


def _names(raw: str) -> list[str]:
    """The names of a comma-separated list written on the command line: ``a,b``, or with the
    brackets of a list around it and its names unquoted, ``[a,b]`` (read as the names
    ``'[a'`` and ``'b]'`` before, which the field then refused as unknown, naming no
    syntax), quotes around a name dropped (``[a,'b']``)."""
    text = raw.strip()
    if len(text) >= 2 and text[0] + text[-1] in ("[]", "()"):
        text = text[1:-1]
    names = (v.strip() for v in text.split(","))
    return [v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"" else v
            for v in names if v]


def _str_sequence(hint: Any) -> type | None:
    """``list`` or ``tuple`` when ``hint`` is a sequence of strings (``list[str]``,
    ``tuple[str, ...]``), so that ``a,b`` on the command line can mean ``["a", "b"]``."""
    base, args = typing.get_origin(hint), typing.get_args(hint)
    if base in (list, tuple) and args and args[0] is str and args[-1] in (str, Ellipsis):
        return base
    return None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The evaluated annotations of the dataclass ``cls`` (kept: evaluating the string
    annotations again for each of an experiment's 2,000 runs cost most of its resolve)."""
    return typing.get_type_hints(cls)


def _field(obj: Any, name: str) -> dataclasses.Field[Any]:
    return next(f for f in dataclasses.fields(obj) if f.name == name)


def validate(cfg: C) -> C:
    """Check the type and the declared range/choices of every field of the dataclass ``cfg``
    (one built in code as well as one from overrides), then, for a :class:`RunConfig`, the
    combinations of fields; the first bad value is an error naming the key, the value and what
    is valid. Returns ``cfg``."""

    def walk(obj: Any, prefix: str) -> None:
        hints = _hints(type(obj))
        for f in dataclasses.fields(obj):
            value, key = getattr(obj, f.name), f"{prefix}{f.name}"
            if dataclasses.is_dataclass(value):
                walk(value, f"{key}.")
                continue
            _check_type(key, value, hints[f.name])
            check_value(key, value, f.metadata)

    walk(cfg, "")
    if isinstance(cfg, RunConfig):
        o = cfg.optim
        unused = [f"optim.{k}={getattr(o, k)}" for k in ("momentum", "weight_decay")
                  if getattr(o, k) != 0]
        if o.name in ("ngd", "sngd", "sps") and unused:
            raise ValueError(f"{', '.join(unused)}: optim.name={o.name} has no momentum or weight "
                             "decay (its step is the normalised or Polyak one alone); set them to "
                             f"0, or use optim.name=sgd/adamw for them")
        # the other settings an optimizer or schedule never reads: recorded in config.json (and
        # set apart in reports) while the run trained exactly as without them
        od = OptimConfig()
        unread = [(k, why) for k, why, ignored in (
            ("momentum", f"optim.name={o.name} has no SGD momentum (Adam's first moment, β1, "
                         "is fixed at 0.9); use optim.name=sgd for momentum",
             o.name in ("adam", "adamw")),
            ("eta_max", f"optim.name={o.name} has no step-size cap (optim.eta_max caps ngd, "
                        "sngd and sps only)", o.name in ("sgd", "adam", "adamw")),
            ("lr", "optim.name=sps sets its own step size (the Polyak step, capped by "
                   "optim.eta_max; optim.schedule scales it by a factor that starts at 1)",
             o.name == "sps"),
            ("step_epochs", f"optim.schedule={o.schedule} has no steps (optim.step_epochs "
                            "and optim.gamma belong to optim.schedule=step)",
             o.schedule != "step"),
            ("gamma", f"optim.schedule={o.schedule} has no steps (optim.step_epochs and "
                      "optim.gamma belong to optim.schedule=step)", o.schedule != "step"),
        ) if ignored and getattr(o, k) != getattr(od, k)]
        if unread:
            key, why = unread[0]
            raise ValueError(f"optim.{key}={getattr(o, key)}: {why}, so the run would train "
                             f"without it; drop optim.{key}, or choose the optimizer or "
                             "schedule that reads it")
        t, default = cfg.train, TrainConfig()
        reads = REGULARIZER_READS.get(t.regularizer, ())
        ignored = [f"train.{k}={getattr(t, k)}" for k in ("reg_alpha", "reg_sigma", "reg_patch")
                   if k not in reads and getattr(t, k) != getattr(default, k)]
        if ignored:
            used = ", ".join(f"train.{k}" for k in reads) or "none of them"
            raise ValueError(f"{', '.join(ignored)}: train.regularizer={t.regularizer} does not "
                             f"read {'it' if len(ignored) == 1 else 'them'} ({used}), so the run "
                             "would train without the setting; choose the regularizer that uses "
                             "it (noise: reg_sigma; patch_mse: reg_alpha, reg_sigma, reg_patch), "
                             "or drop it")
        for key, own in (("root", "data.root"), ("download", "data.download"),
                         ("split", "data.train_split and data.test_split")):
            if key in cfg.data.options:
                raise ValueError(
                    f"data.options.{key}={cfg.data.options[key]!r}: the loader's {key} is set "
                    f"by {own}, so this entry would be ignored or clash with it; set {own} "
                    f"instead (and drop data.options.{key})")
        _check_entry_types(cfg)
    return cfg


#: the types an entry's declared type is made of that :func:`_check_type` checks exactly; an
#: entry declared with any other (a Literal, a path, a class) is left to its loader or model
_ENTRY_TYPES = (int, float, str, bool, type(None), tuple, list, dict)


def _entry_hint(hint: Any) -> Any:
    """``hint`` when :func:`_check_type` can check a value against every type it allows, else
    None."""
    try:
        options = _options.__wrapped__(hint)
    except TypeError:
        return None
    if all(base in _ENTRY_TYPES and all(a is Ellipsis or _entry_hint(a) is not None
                                        for a in args) for _, base, args in options):
        return hint
    return None


def _default_hint(default: Any) -> Any:
    """The type a value must have to stand for ``default``, as the model configs check their
    overrides (models/_config.py): an int or a float for a float, a list or a tuple for a tuple;
    None (anything) for a default of None."""
    if default is None:
        return None
    if isinstance(default, tuple):
        return tuple | list
    return type(default) if type(default) in _ENTRY_TYPES else None


@functools.cache
def _loader_signature(loader: Any) -> tuple[Any, dict[str, Any]]:
    """The parameters of a data loader and their evaluated annotations (kept: an experiment
    checks each of its runs)."""
    import inspect

    try:
        params: Any = inspect.signature(loader).parameters
    except (TypeError, ValueError):
        params = {}
    try:
        hints = typing.get_type_hints(loader)
    except Exception:  # noqa: BLE001  (an annotation that does not evaluate: use defaults)
        hints = {}
    return params, hints


def _check_entry_types(cfg: RunConfig) -> None:
    """Refuse a ``data.options`` or ``model.overrides`` entry whose value has the wrong type
    for the loader's keyword (its annotation, else its default) or the model config's field
    (its default's type): ``data.options.test_fraction=abc`` failed after training was
    announced with "'<' not supported between instances of 'float' and 'str'", naming no key
    and no fix. Unknown names, unknown keys and keys of types not checked here are left to the
    loader and the model factory (and to the command line's own checks of the keys)."""
    import inspect

    from ..data._registry import DATASETS
    from ..models import model_config
    from ..models._registry import MODELS

    d = cfg.data
    if d.options and d.name in DATASETS.names("*"):
        params, hints = _loader_signature(inspect.unwrap(DATASETS.get(d.name)))
        for key, value in d.options.items():
            p = params.get(key)
            if p is None or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            default = None if p.default is p.empty else p.default
            hint = _entry_hint(hints[key]) if key in hints else _default_hint(default)
            _refuse_entry(f"data.options.{key}", value, hint, f"the {d.name} loader's {key}",
                          default)
    m = cfg.model
    if m.overrides and m.name in MODELS.names("*"):
        try:
            config = model_config(m.name)
        except Exception:  # noqa: BLE001  (not buildable with its defaults: the builder says why)
            return
        if not dataclasses.is_dataclass(config):
            return
        names = {f.name for f in dataclasses.fields(config)}
        for key, value in m.overrides.items():
            if key in names:
                default = getattr(config, key)
                _refuse_entry(f"model.overrides.{key}", value, _default_hint(default),
                              f"{m.name}'s {key}", default)


def _refuse_entry(key: str, value: Any, hint: Any, owner: str, default: Any) -> None:
    """A ``TypeError`` naming ``key``, the type ``hint`` asks for and the fix, unless
    ``value`` has that type (or ``hint`` is None: not checked)."""
    if hint is None:
        return
    try:
        _check_type(key, value, hint)
    except TypeError:
        names = ["None" if o is type(None) else _type_name(o)
                 for o, _, _ in _options.__wrapped__(hint)]
        # a number meant as text (a tokenizer named 123) is read as a number on the command line
        text = " (quoted, for a number meant as text)" if names[0] == "str" else ""
        raise TypeError(f"{key}={value!r}: {owner} takes {' or '.join(names)} (default "
                        f"{default!r}), not {type(value).__name__}; give {key} a value of type "
                        f"{names[0]}{text}, or drop it for the default") from None


def apply_overrides(cfg: C, assignments: list[str]) -> C:
    """Apply ``["optim.lr=0.05", ...]`` (or an experiment's ``["steps=200", ...]``) to the
    dataclass ``cfg`` in order, with :func:`set_option`; returns ``cfg``, changed in place."""
    for item in assignments:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value, e.g. "
                             f"{_example(cfg)}")
        key, value = item.split("=", 1)
        set_option(cfg, key.strip(), value)
    return cfg


def _example(cfg: Any) -> str:
    """``key=value`` for the first numeric field of ``cfg`` (its current value)."""
    flat = _flatten(dataclasses.asdict(cfg))  # type: ignore[call-overload]
    numeric = [(k, v) for k, v in flat.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)]
    key, value = (numeric or list(flat.items()))[0]
    return f"{key}={value!r}"


# -- which configurations describe the same run --------------------------------------------------

#: settings that change only where the metrics are sent, or how many checkpoints stay on disk,
#: never what is trained or measured: a run directory is the same run whatever they say
#: (docs/run-directory.md#same-configuration). ``train.keep_checkpoints`` lowered to resume a
#: run on a full disk was refused as "a run with a different configuration"
LOGGING_ONLY: frozenset[str] = frozenset({"track.report_to", "train.keep_checkpoints"})


_ABSENT = object()


def json_form(obj: Any) -> Any:
    """``obj`` as it reads back from JSON (tuples → lists, int keys → str...)."""
    return json.loads(json.dumps(obj, default=str))


def defaults_of(cls: type) -> dict[str, Any]:
    """The default of every field of the dataclass ``cls`` as config.json would hold it (a
    nested dataclass as a dict); a field without a default is left out."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return json_form(out)


def _leaves(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix[:-1]: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def config_differences(old: dict[str, Any], new: dict[str, Any],
                       defaults: dict[str, Any] | None = None,
                       ignore: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """The dotted keys in which configuration ``new`` differs from ``old`` (both as dicts, e.g.
    a run directory's config.json and the configuration about to run it); ``[]``: the same run.

    Two rules keep recorded run directories valid as the configuration grows:

    * a key absent from ``old`` whose value in ``new`` equals its value in ``defaults`` is no
      difference — a field added after ``old`` was written, left at its default, changes nothing
      that run did;
    * a key in ``ignore`` (:data:`LOGGING_ONLY` for :class:`RunConfig`) is never a difference.

    Everything is compared as JSON reads it back (a tuple equals a list)."""
    a, b = _leaves(json_form(old)), _leaves(json_form(new))
    d = _leaves(json_form(defaults)) if defaults is not None else {}
    keys = (set(a) | set(b)) - set(ignore)
    # a key missing from `old` reads as its default there (as absent when it has none)
    return sorted(k for k in keys if a.get(k, d.get(k, _ABSENT)) != b.get(k, _ABSENT))


def dumps(cfg: RunConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True)
