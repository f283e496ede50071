"""Caches of measurements taken once on a finished run's final checkpoint (``sigma_sweep.json``
of the vision comparisons, ``final_measure.json`` of :class:`~._posthoc.FinalMeasureExperiment`).

A cache file is one JSON object: the key the measurement was taken under (the checkpoint step,
the settings), the digests of the run's config.json
(:meth:`~senslab.train.rundir.RunDir.config_digests`) and the stored result under one field.
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
    warning naming both files and saying that ``what`` is measured again.
    """
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
    want = json.loads(json.dumps(key, sort_keys=True, default=str))  # as write_json stores it
    if not isinstance(stored, dict) or field not in stored:
        return None
    if not all(k in stored and _same(stored[k], v) for k, v in want.items()):
        return None
    if not rd.config_matches(stored):
        return None
    return stored[field] if valid(stored[field]) else None


def write_cache(rd: RunDir, name: str, key: dict[str, Any], field: str, value: Any) -> None:
    """Store ``value`` as the cache ``name`` of ``rd`` under ``key`` (what :func:`read_cache`
    reads back), with the digests of the run's config.json."""
    rd.write_json(name, {**key, **rd.config_digests(), field: value})


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
    return bool(a == b)
