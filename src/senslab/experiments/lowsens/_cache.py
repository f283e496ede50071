"""Caches of measurements taken once on a finished run's final checkpoint (``sigma_sweep.json``
of the vision comparisons, ``final_measure.json`` of :class:`~._posthoc.FinalMeasureExperiment`).

A cache file is one JSON object: the key the measurement was taken under (the checkpoint step,
the settings: JSON values only, compared exactly, :func:`key_json`), the digests of the run's
config.json (:meth:`~senslab.train.rundir.RunDir.config_digests`) and the stored result under
one field.
The result is reused only when every entry of the key is stored exactly as it would be written
now and the digests describe the run's config.json now
(:meth:`~senslab.train.rundir.RunDir.config_matches`: a config.json re-indented or with its
keys reordered keeps its caches, one with any setting changed does not); anything else — no
file yet, another key, a file of an older senslab without some key, entries of the wrong type,
a damaged file — is measured again, since a cache only saves recomputation. A damaged file (not
valid JSON) is set aside with a warning rather than written over.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...train.rundir import RunDir

#: suffix of a damaged cache file set aside (``final_measure.json.damaged``, ``…damaged-2``)
DAMAGED = ".damaged"


def read_cache(rd: RunDir, name: str, key: dict[str, Any], field: str, what: str,
               valid: Callable[[Any], bool] = lambda value: isinstance(value, dict)) -> Any:
    """The stored ``field`` of the cache ``name`` in ``rd`` when it was taken under ``key``;
    None when it has to be measured again.

    ``key`` matches when each of its entries is in the file with the same value and the same
    JSON types as :meth:`~senslab.train.rundir.RunDir.write_json` would write it now (a step
    stored as ``30.0`` or ``true`` is not step 30) and the file's config.json digests match
    ``rd``'s config.json (:meth:`~senslab.train.rundir.RunDir.config_matches`); ``valid`` then
    checks the stored value's shape (default: a JSON object). A file that is not valid JSON is
    moved to ``<name>.damaged`` (``<name>.damaged-2``, … when that name is taken), with a
    warning naming both files and saying that ``what`` is measured again. A key entry without
    an exact JSON form is refused (:func:`key_json`).
    """
    want = key_json(key)
    path = rd.path / name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        stored = json.loads(data)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError
        why = (f"{err.msg}, line {err.lineno}" if isinstance(err, json.JSONDecodeError)
               else "not UTF-8 text" if isinstance(err, UnicodeDecodeError)
               else "nested too deeply")
        kept = "" if rd.readonly else f"; moved it to {set_aside(path)}"
        warnings.warn(f"{path} is not valid JSON ({why}): the cache is truncated or "
                      f"damaged{kept}; measuring {what} again", stacklevel=3)
        return None
    if not isinstance(stored, dict) or field not in stored:
        return None
    if not all(k in stored and _same(stored[k], v) for k, v in want.items()):
        return None
    if not rd.config_matches(stored):
        return None
    return stored[field] if valid(stored[field]) else None


def write_cache(rd: RunDir, name: str, key: dict[str, Any], field: str, value: Any) -> None:
    """Store ``value`` as the cache ``name`` of ``rd`` under ``key`` (what :func:`read_cache`
    reads back), with the digests of the run's config.json. A key entry without an exact JSON
    form is refused (:func:`key_json`)."""
    rd.write_json(name, {**key_json(key), **rd.config_digests(), field: value})


def key_json(key: dict[str, Any]) -> dict[str, Any]:
    """``key`` as the JSON it is stored as, entry for entry: strings, numbers, bools, None,
    lists (a tuple is one) and objects with string keys; a NumPy or torch scalar (zero
    dimensions) as the number it holds, a path as its text, a NaN or inf as the text
    ``"float nan"`` (JSON has none). Anything else is refused with a
    ``TypeError`` naming the entry: stored as its ``str()``, a tensor or array of
    more than a thousand values was abbreviated with "...", so two masks differing inside read
    as one key and one's measurement was served for the other, and an object whose text holds
    its memory address matched another object that happened to get that address. A numeric
    dict key is refused too (stored as its text, ``{1: …}`` was ``{"1": …}``)."""
    def exact(value: Any, where: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            # JSON has no NaN or inf (write_json writes them as null): as text, so that a NaN
            # and an inf setting stay two keys
            return f"float {value!r}"
        if value is None or isinstance(value, (str, bool, int, float)):
            return value
        if isinstance(value, (list, tuple)):
            return [exact(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, dict):
            bad = [k for k in value if not isinstance(k, str)]
            if bad:
                raise TypeError(
                    f"cache key entry {where} has the non-string key {bad[0]!r} "
                    f"({type(bad[0]).__name__}), which JSON would store as the string "
                    f"{str(bad[0])!r}, the same as that string key; use string keys")
            return {k: exact(v, f"{where}[{k!r}]") for k, v in value.items()}
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        shape = getattr(value, "shape", None)
        if shape is not None and tuple(shape) == () and callable(getattr(value, "item", None)):
            return exact(value.item(), where)  # np.int64(7), torch.tensor(0.5)
        what = (f"a {type(value).__name__} of shape {tuple(shape)}" if shape is not None
                else f"a {type(value).__name__} object")
        raise TypeError(
            f"cache key entry {where} is {what}, which has no exact JSON form: stored as its "
            "str() it could match another value with the same text (a long tensor's is "
            "abbreviated with '...', an object's holds its memory address). Pass plain values "
            "(numbers, strings, lists, dicts), e.g. a tensor's or array's .tolist(), or a "
            "digest of its contents (hashlib.sha256(t.numpy().tobytes()).hexdigest())")

    if not isinstance(key, dict):
        raise TypeError(f"a cache key is a dict of its entries, got {type(key).__name__}")
    return json.loads(json.dumps(exact(key, "key"), sort_keys=True))  # as write_json writes it


def set_aside(path: Path) -> Path:
    """Move ``path`` to the first free name of ``<path>.damaged``, ``<path>.damaged-2``, …
    (never over an earlier one); returns the new path."""
    n = 1
    while (aside := path.with_name(path.name + DAMAGED + ("" if n == 1 else f"-{n}"))).exists():
        n += 1
    path.replace(aside)
    return aside


def _same(a: Any, b: Any) -> bool:
    """Whether the JSON values ``a`` and ``b`` are equal with the same types throughout (Python's
    ``==`` has ``True == 1 == 1.0``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True  # a NaN setting is the setting it was stored as
    return bool(a == b)
