"""Run directories written by hand-written training loops (format: docs/run-directory.md).

Most experiments train with :func:`senslab.train.loop.fit`, which writes its own run directory.
The small-model experiments (lowsens, Hahn & Rofin, implicit bias) use their own loops — full
batch, Boolean sensitivity, attention metrics — and write the same files through this module:
``config.json`` and ``env.json`` when a run starts, one ``metrics.jsonl`` line per evaluation,
``summary.json`` when it ends. These runs have no checkpoints (each takes seconds to minutes): a
finished run (``summary.json`` present) is reused, an unfinished one starts over from scratch
with the metric log of the interrupted attempt discarded.

A run directory has one writer at a time: :func:`run_all` holds each run's lock
(:meth:`~senslab.train.rundir.RunDir.writing`) while its body runs, and :func:`start_run` takes
it when its caller does not hold it yet (it is then kept until :meth:`ManualRun.finish` or the
end of the process).

:func:`single_thread` runs a block on one intra-op torch thread (small models on a shared
machine), for hand-written loops and :func:`~senslab.train.loop.fit` alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..train.rundir import RunDir, environment


def finished_summary(path: Path) -> dict[str, Any] | None:
    """The ``summary.json`` of the run in ``path``, or None when it has not finished."""
    if (path / "summary.json").exists():
        return RunDir(path).read_json("summary.json")
    return None


def start_run(path: Path, config: dict[str, Any], device: torch.device | str = "cpu") -> RunDir:
    """Write ``config.json`` and ``env.json`` in ``path`` and start an empty metric log.

    A restarted run must not append to the log of the attempt that was interrupted, so any
    existing ``metrics.jsonl`` is deleted. The directory must be new, empty or a senslab run
    (else an error that names it); another process writing it is an error too.
    """
    rd = RunDir(path)
    if not rd.holds_lock():
        rd.acquire()
    rd.write_json("config.json", config)
    rd.write_json("env.json", environment(device))
    rd.metrics_path.unlink(missing_ok=True)
    return rd


class ManualRun:
    """One run directory written by a hand-written loop.

    Usage: ``run.start(config)`` (config.json with the run's label and name, env.json, a fresh
    metrics.jsonl), ``run.log`` once per evaluation (adds the seconds since ``start``),
    ``run.finish(final, **extra)`` (summary.json, returned).
    """

    def __init__(self, path: Path, label: str, name: str) -> None:
        self.dir = RunDir(path)
        self.label, self.name = label, name
        self.t0 = time.perf_counter()
        self._took_lock = False  # start() took the directory's lock: finish() releases it

    def start(self, config: dict[str, Any], device: torch.device | str = "cpu") -> None:
        self._took_lock = not self.dir.holds_lock()
        start_run(self.dir.path, {**config, "label": self.label, "name": self.name}, device)
        self.t0 = time.perf_counter()

    def log(self, record: dict[str, Any]) -> None:
        self.dir.log({**record, "time": round(time.perf_counter() - self.t0, 3)})

    def finish(self, final: dict[str, Any], **extra: Any) -> dict[str, Any]:
        summary = {"label": self.label, "name": self.name, "final": final,
                   "seconds": round(time.perf_counter() - self.t0, 2), **extra}
        self.dir.write_json("summary.json", summary)
        if self._took_lock:
            self.dir.release()
            self._took_lock = False
        return summary


def run_all(out: Path, names: list[str], body: Callable[[int, str], dict[str, Any]],
            log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Call ``body(i, name)`` for every run below ``out`` that has no summary yet, holding that
    run directory's lock; reuse the others' summaries."""
    summaries = []
    for i, name in enumerate(names):
        done = finished_summary(out / name)
        if done is not None:
            log(f"[{i + 1}/{len(names)}] {name}: finished earlier, reusing its summary")
            summaries.append(done)
            continue
        log(f"[{i + 1}/{len(names)}] {name}")
        with RunDir(out / name).writing():
            summaries.append(body(i, name))
    return summaries


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one intra-op thread inside the block, restoring the old count afterwards.

    Used by experiments whose models are a few kilobytes: per-op thread hand-offs cost far more
    than the arithmetic, and on a busy 2-core machine two threads made each step many times
    slower.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
