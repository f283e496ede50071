"""Run configuration: dataclasses, dotted command-line overrides, JSON round-trip.

``--set optim.lr=0.05`` sets one field; values are parsed as Python/JSON literals and checked
against the field's type; an unknown key is an error that names the closest valid key.
``model.overrides`` and ``data.options`` are free-form dicts passed on to the model factory and
the dataset loader (which check their own keys).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any


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
    train_subset: int | None = None  # keep a seeded random subset of this many training examples


@dataclass
class OptimConfig:
    name: str = "sgd"  # sgd | adam | adamw | ngd | sps
    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    eta_max: float | None = None  # cap for ngd / sps
    schedule: str = "constant"  # constant | step (×gamma every step_epochs) | cosine
    step_epochs: int = 8
    gamma: float = 0.5


@dataclass
class TrainConfig:
    epochs: int = 10
    batch_size: int = 100
    max_steps: int | None = None
    target_train_acc: float | None = None  # stop once reached (comparable train accuracy)
    loss: str = "auto"  # auto | ce | bce | mse
    regularizer: str = "none"  # none | noise (augmentation) | patch_mse (SPEC §5)
    reg_alpha: float = 0.5
    reg_sigma: float = 1.0
    reg_patch: int = 4
    checkpoint_every: int = 0  # steps; 0 = at the end of every epoch
    keep_checkpoints: int = 2
    eval_batch_size: int = 500


@dataclass
class TrackConfig:
    every: int = 1  # evaluate every `every` epochs (unit=epoch) or steps (unit=step)
    unit: str = "epoch"
    sigma: float = 0.1  # noise standard deviation of token-wise sensitivity
    repeats: int = 1
    num_examples: int = 256  # fixed, seeded subset of the training set
    val: bool = False  # also measure on the same number of test examples
    chunk_size: int | None = None
    sharpness: bool = False  # ShOp / ShPred (SPEC §5) at every evaluation
    sharpness_sigma: float = 0.05
    loss_sharpness: bool = False  # Hahn & Rofin's E[L(θ+Δ)] − L(θ), positional params excluded
    loss_sharpness_sigma: float = 0.02
    weight_norm: bool = True
    eval_examples: int | None = None  # accuracy/loss on this many examples (None: all)


@dataclass
class RunConfig:
    name: str = "run"
    label: str = ""  # curve/bar this run belongs to in reports (default: the model name)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
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


def valid_keys(cfg: Any, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            keys += valid_keys(v, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


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


def _check_type(key: str, value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    options = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    for opt in options:
        if opt is type(None) and value is None:
            return None
        base = typing.get_origin(opt) or opt
        if base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if base is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if base in (str, bool, dict) and isinstance(value, base):
            return value
    names = " or ".join(getattr(o, "__name__", str(o)) for o in options)
    raise TypeError(f"{key} must be {names}, got {value!r}")


def set_option(cfg: RunConfig, key: str, value: Any, parse: bool = True) -> None:
    """Set dotted ``key`` (e.g. ``"optim.lr"``, ``"model.overrides.depth"``) on ``cfg``."""
    if parse and isinstance(value, str):
        value = parse_value(value)
    parts = key.split(".")
    obj: Any = cfg
    for i, part in enumerate(parts):
        if isinstance(obj, dict):  # free-form dicts: model.overrides.*, data.options.*
            if i != len(parts) - 1:
                raise KeyError(f"{key}: {'.'.join(parts[:i])} entries are single values")
            obj[part] = value
            return
        names = [f.name for f in dataclasses.fields(obj)]
        if part not in names:
            keys = valid_keys(cfg)
            close = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise KeyError(f"unknown config key {key!r}.{hint} Valid keys: {', '.join(keys)}")
        if i == len(parts) - 1:
            hints = typing.get_type_hints(type(obj))
            current = getattr(obj, part)
            if dataclasses.is_dataclass(current):
                raise KeyError(f"{key} is a section; set one of its fields, e.g. {key}.name")
            setattr(obj, part, _check_type(key, value, hints[part]))
            return
        obj = getattr(obj, part)


def apply_overrides(cfg: RunConfig, assignments: list[str]) -> RunConfig:
    """Apply ``["optim.lr=0.05", ...]`` in order."""
    for item in assignments:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value, e.g. optim.lr=0.05")
        key, value = item.split("=", 1)
        set_option(cfg, key.strip(), value)
    return cfg


def dumps(cfg: RunConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True)
