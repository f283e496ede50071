"""Shared plumbing for the small-model experiments: settings with dotted overrides and run
directories written by a custom training loop (format: docs/run-directory.md).

These experiments train tiny models with their own loops (full batch, Boolean sensitivity,
attention metrics), so they do not use :func:`senslab.train.loop.fit`; instead each run goes
through :class:`ManualRun`, which writes the same files. Runs have no checkpoints (each takes
seconds to minutes): a finished run (``summary.json`` present) is reused, an unfinished one is
restarted from scratch with its partial metric log discarded.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from ...train.config import apply_overrides
from ...train.rundir import RunDir, environment

S = TypeVar("S")


def resolve_settings(settings: S, overrides: list[str]) -> S:
    """Apply ``key=value`` overrides to a flat settings dataclass (a copy; types are checked and
    an unknown key names the closest valid one, as for ``senslab train --set``)."""
    out = dataclasses.replace(settings)  # type: ignore[type-var]
    text_fields = {f.name for f in dataclasses.fields(out) if f.type in (str, "str")}
    items = []
    for item in overrides:
        key, sep, value = item.partition("=")
        # a text field takes the text as written: only=0 means the string "0", not the int 0
        items.append(f"{key}={value!r}" if sep and key.strip() in text_fields else item)
    apply_overrides(out, items)  # type: ignore[arg-type]
    return out


def pick_scale(scale: str, table: dict[str, S]) -> S:
    if scale not in table:
        raise ValueError(f"unknown scale {scale!r}; use one of {', '.join(map(repr, table))}")
    return table[scale]


class ManualRun:
    """One run directory written by a hand-written loop.

    Usage: ``run.start(config)`` (config.json, env.json, a fresh metrics.jsonl), ``run.log``
    once per evaluation, ``run.finish(final, **extra)`` (summary.json, returned).
    """

    def __init__(self, path: Path, label: str, name: str) -> None:
        self.dir = RunDir(path)
        self.label, self.name = label, name
        self.t0 = time.perf_counter()

    def start(self, config: dict[str, Any], device: torch.device | str = "cpu") -> None:
        self.dir.write_json("config.json", {**config, "label": self.label, "name": self.name})
        self.dir.write_json("env.json", environment(device))
        # a restarted run must not append to the log of the attempt that was interrupted
        self.dir.metrics_path.unlink(missing_ok=True)
        self.t0 = time.perf_counter()

    def log(self, record: dict[str, Any]) -> None:
        self.dir.log({**record, "time": round(time.perf_counter() - self.t0, 3)})

    def finish(self, final: dict[str, Any], **extra: Any) -> dict[str, Any]:
        summary = {"label": self.label, "name": self.name, "final": final,
                   "seconds": round(time.perf_counter() - self.t0, 2), **extra}
        self.dir.write_json("summary.json", summary)
        return summary


def run_all(out: Path, names: list[str], body: Callable[[int, str], dict[str, Any]],
            log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Call ``body(i, name)`` for every run that has no summary yet; reuse the others."""
    summaries = []
    for i, name in enumerate(names):
        run_dir = RunDir(out / name)
        if (run_dir.path / "summary.json").exists():
            log(f"[{i + 1}/{len(names)}] {name}: finished earlier, reusing its summary")
            summaries.append(run_dir.read_json("summary.json"))
            continue
        log(f"[{i + 1}/{len(names)}] {name}")
        summaries.append(body(i, name))
    return summaries
