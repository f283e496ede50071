"""The run directory of a registered trainer with its own step loop (format:
docs/run-directory.md), written the way :func:`senslab.train.loop.fit` writes its own.

Usage inside a trainer (see :mod:`senslab.train.trainers`)::

    with LoopRun(path, config) as run:
        if run.summary is not None:         # finished earlier with this configuration
            return run.summary
        state = run.restore()               # None: a fresh start
        ...                                 # build model, optimizer, generators; load state
        for step in ...:
            ...
            run.log(record)                 # one metrics.jsonl line ("time" added)
            run.checkpoint(step, {...})     # everything the loop needs to go on
        return run.finish(summary)

* ``config`` (the trainer's configuration dataclass, or a JSON-able dict) is written to
  ``config.json`` at a fresh start. A directory holding a run of another configuration is refused
  (finished, or with a checkpoint); one that stopped before its first checkpoint starts over.
  A field added to the dataclass after a run was recorded does not make it another
  configuration while it keeps its default (:func:`~senslab.train.config.config_differences`;
  for a dict, pass ``defaults=``); ``logging_only`` keys never do.
* :meth:`restore` returns the newest checkpoint that verifies (a damaged one falls back to the
  previous, with a warning) and cuts ``metrics.jsonl`` back to its step, so the records the
  resumed run writes again are not doubled. Resuming at the same thread count gives the same
  numbers bit for bit as a run that was never interrupted: a checkpoint holds the model,
  the optimizer, every generator and the loop's counters.
* The directory is locked while the block runs (another writer fails at once).

:func:`single_thread` runs a block on one intra-op torch thread (models of a few kilobytes on a
shared machine).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from ._provenance import check_reused, write_env
from .config import config_differences, defaults_of, json_form
from .rundir import RunDir, environment, notice


class LoopRun:
    """One run directory written by a trainer's own loop; a context manager (see module)."""

    def __init__(self, path: str | Path, config: Any,
                 device: torch.device | str = "cpu", keep: int = 2, *,
                 defaults: dict[str, Any] | None = None,
                 logging_only: frozenset[str] | set[str] = frozenset()) -> None:
        self.dir = RunDir(path)
        self.path = self.dir.path
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            defaults = defaults_of(type(config)) if defaults is None else defaults
            config = dataclasses.asdict(config)
        self.config = json_form(config)
        #: field defaults: a key missing from an old config.json reads as its default
        self.defaults = defaults
        self.logging_only = frozenset(logging_only)
        self.device = device
        self.keep = keep
        #: the summary of a run that finished earlier with this configuration
        self.summary: dict[str, Any] | None = None
        self._t0 = time.perf_counter()
        self._took_lock = False

    # -- the block -----------------------------------------------------------------------------
    def __enter__(self) -> LoopRun:
        self._took_lock = not self.dir.holds_lock()
        if self._took_lock:
            self.dir.acquire()
        try:
            self._check_config()
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._release()

    def _release(self) -> None:
        if self._took_lock:
            self.dir.release()
            self._took_lock = False

    def _check_config(self) -> None:
        rd = self.dir
        if not rd.exists():
            return
        old = rd.read_json("config.json")
        finished = (self.path / "summary.json").exists()
        changed = config_differences(old, self.config, self.defaults, self.logging_only)
        if changed:
            if finished or rd.checkpoints():
                raise ValueError(
                    f"{self.path} holds a run with a different configuration (differs in "
                    f"{', '.join(changed)}); use another --out directory, or delete that run "
                    "directory to train it again")
            rd.reset()  # stopped before its first checkpoint: nothing worth keeping
            return
        if finished:
            check_reused(self.path)
            self.summary = rd.read_json("summary.json")

    # -- the run -------------------------------------------------------------------------------
    def restore(self) -> dict[str, Any] | None:
        """The newest usable checkpoint's state (metric log cut back to its step), or None after
        starting the run afresh (config.json, env.json, an empty metric log)."""
        rd = self.dir
        found = rd.load_latest(resume=True) if rd.exists() else None
        write_env(rd, environment(self.device), None if found is None else int(found[1]["step"]))
        if found is None:
            rd.write_json("config.json", self.config)
            rd.metrics_path.unlink(missing_ok=True)
            self._t0 = time.perf_counter()
            return None
        path, state = found
        rd.truncate_metrics(int(state["step"]))
        self._t0 = time.perf_counter() - float(state.get("elapsed", 0.0))
        notice(f"resuming {self.path} from step {state['step']} (checkpoint {path.name})")
        return state

    @property
    def elapsed(self) -> float:
        """Seconds of training so far, earlier attempts of this run included."""
        return time.perf_counter() - self._t0

    def log(self, record: dict[str, Any]) -> dict[str, Any]:
        """Append ``record`` (with ``"time"``: :attr:`elapsed`) to metrics.jsonl; returns the
        line as written (a summary's ``final`` is the last one, as in ``fit``)."""
        line = {**record, "time": round(self.elapsed, 3)}
        self.dir.log(line)
        return line

    def checkpoint(self, step: int, state: dict[str, Any]) -> None:
        """Save ``state`` (tensors, plain values, generator states) as the checkpoint of
        ``step``; :meth:`restore` returns it with ``"step"`` and ``"elapsed"`` added."""
        self.dir.save_checkpoint({**state, "step": step, "elapsed": self.elapsed}, step,
                                 keep=self.keep)

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write summary.json (``"seconds"`` added unless given) and return it."""
        summary = {"seconds": round(self.elapsed, 3), **summary}
        self.dir.write_json("summary.json", summary)
        return summary


def generator_states(**gens: torch.Generator) -> dict[str, torch.Tensor]:
    """``{name: state}`` of CPU generators, for a checkpoint."""
    return {k: g.get_state() for k, g in gens.items()}


def set_generator_states(states: dict[str, torch.Tensor], **gens: torch.Generator) -> None:
    """Restore generators saved by :func:`generator_states`."""
    for k, g in gens.items():
        g.set_state(states[k])


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one intra-op thread inside the block, restoring the old count afterwards.

    For trainers and experiments whose models are a few kilobytes: per-op thread hand-offs
    cost far more than the arithmetic, and on a busy 2-core machine two threads made each step
    many times slower.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
