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
            run.at(step)                    # where a Ctrl-C would stop it
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
* Ctrl-C inside the block raises :class:`~senslab.train.loop.TrainingInterrupted`, as ``fit``
  does: the step the loop reached (:meth:`LoopRun.at`) and the checkpoint a re-run resumes
  from, which ``senslab`` prints ("interrupted at step N; re-run the same command to resume").
  A Ctrl-C whose KeyboardInterrupt is swallowed where it lands (a weakref finalizer or
  ``__del__``, a library's ``except BaseException``) is recorded all the same
  (:class:`senslab._sigint.SigintWatch`, in the main thread): the loop stops at its next
  :meth:`LoopRun.at` or :meth:`LoopRun.checkpoint` (after that checkpoint is written), or when
  the block ends.
* :meth:`LoopRun.check` (and :func:`check_dir`, a trainer's ``check_dir``) refuses what the
  block would refuse, before anything is written and without the lock.

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

from .._sigint import SigintWatch
from ._provenance import check_reused, write_env
from .config import config_differences, defaults_of, json_form
from .loop import TrainingInterrupted
from .rundir import RunDir, checkpoint_step, environment, notice


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
        #: where the loop is (:meth:`at`; None before :meth:`restore`), for an interruption
        self.step: int | None = None
        self.epoch: int | None = None
        self._t0 = time.perf_counter()
        self._took_lock = False
        #: this block's SIGINT watch (:meth:`_watch_sigint`)
        self._sigint: SigintWatch | None = None

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
        self._watch_sigint()
        return self

    def _watch_sigint(self) -> None:
        """Record a Ctrl-C while the block runs, also one whose KeyboardInterrupt is swallowed
        (:class:`~senslab._sigint.SigintWatch`: from the main thread only, where signals are
        delivered; inside an enclosing watch, an enclosing LoopRun's or ``fit``'s, that one
        records it and :meth:`at` reads it there; under a handler the user installed, nothing
        is read)."""
        self._sigint = SigintWatch()
        self._sigint.__enter__()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        watch, self._sigint = self._sigint, None
        try:
            if watch is not None:
                watch.__exit__(kind)  # the block ended, a Ctrl-C was swallowed: raises it
        except KeyboardInterrupt as late:
            err = late
        finally:
            self._release()
        if isinstance(err, KeyboardInterrupt) and not isinstance(err, TrainingInterrupted):
            # a bare KeyboardInterrupt told the user only "interrupted": where, and that a
            # re-run resumes, as fit says it (the lock is released already)
            saved = self.dir.checkpoints()
            resumes = checkpoint_step(saved[-1]) if saved else None
            step = self.step if self.step is not None else resumes or 0
            raise TrainingInterrupted(step, resumes, self.epoch) from None

    def _release(self) -> None:
        if self._took_lock:
            self.dir.release()
            self._took_lock = False

    def _check_config(self) -> None:
        rd = self.dir
        if not rd.exists():
            return
        if self._changes():
            rd.reset()  # stopped before its first checkpoint: nothing worth keeping
            return
        if (self.path / "summary.json").exists():
            check_reused(self.path)
            self.summary = rd.read_json("summary.json")

    def _changes(self) -> list[str]:
        """The keys in which the run directory's config.json (there is one) differs from this
        run's configuration; a ValueError when they differ and that run trained (finished, or a
        checkpoint): it is kept, never replaced."""
        old = self.dir.read_json("config.json")
        changed = config_differences(old, self.config, self.defaults, self.logging_only)
        if changed and ((self.path / "summary.json").exists() or self.dir.checkpoints()):
            from .trainers import held_run

            what = held_run(self.path, old, set(self.config)
                            if isinstance(self.config, dict) else set())
            raise ValueError(
                f"{self.path} holds {what} (differs in {', '.join(changed)}); use another "
                "--out directory, or delete that run directory to train it again")
        return changed

    def check(self) -> None:
        """Refuse, taking no lock and writing nothing, what the block refuses before the loop
        trains: a directory it cannot write (:meth:`~senslab.train.rundir.RunDir.
        check_target`), a run of another configuration that trained there, a finished run
        whose summary its metric log contradicts, a checkpoint of a newer senslab. (A
        checkpoint's contents are checked when :meth:`restore` loads it.)"""
        rd = self.dir
        rd.check_target()
        if not rd.exists() or self._changes():
            return  # a fresh start, or over a run that stopped before its first checkpoint
        if (self.path / "summary.json").exists():
            rd.read_json("summary.json")  # reused: refused when its metric log disagrees
        else:
            rd.check_formats()  # resumed

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
            self.step = 0
            return None
        path, state = found
        rd.truncate_metrics(int(state["step"]))
        self.step = int(state["step"])
        self._t0 = time.perf_counter() - float(state.get("elapsed", 0.0))
        notice(f"resuming {self.path} from step {state['step']} (checkpoint {path.name})")
        return state

    def at(self, step: int, epoch: int | None = None) -> None:
        """The loop has done ``step`` steps: what a Ctrl-C reports (:class:`~senslab.train.
        loop.TrainingInterrupted`). ``epoch``: a loop that calls this once per epoch gives the
        epoch it starts, and an interruption says "in epoch E, after step N" rather than claim
        a step it may have passed. :meth:`log` and :meth:`checkpoint` set it too.

        A Ctrl-C seen since the block began whose KeyboardInterrupt was swallowed stops the
        loop here, "at step N" (exactly: this is a step boundary)."""
        self.step, self.epoch = step, epoch
        if self._sigint is not None:
            try:
                self._sigint.check()
            except KeyboardInterrupt:
                self.epoch = None
                raise  # TrainingInterrupted when the block ends (__exit__)

    @property
    def elapsed(self) -> float:
        """Seconds of training so far, earlier attempts of this run included."""
        return time.perf_counter() - self._t0

    def log(self, record: dict[str, Any]) -> dict[str, Any]:
        """Append ``record`` (with ``"time"``: :attr:`elapsed`) to metrics.jsonl; returns the
        line as written (a summary's ``final`` is the last one, as in ``fit``)."""
        line = {**record, "time": round(self.elapsed, 3)}
        self.dir.log(line)
        if isinstance(record.get("step"), int):
            # where the loop is, without stopping: a swallowed Ctrl-C stops it at the checkpoint
            # that follows, so the record's work is kept
            self.step, self.epoch = record["step"], None
        return line

    def checkpoint(self, step: int, state: dict[str, Any]) -> None:
        """Save ``state`` (tensors, plain values, generator states) as the checkpoint of
        ``step``; :meth:`restore` returns it with ``"step"`` and ``"elapsed"`` added. A
        swallowed Ctrl-C stops the loop once it is saved (:meth:`at`)."""
        self.dir.save_checkpoint({**state, "step": step, "elapsed": self.elapsed}, step,
                                 keep=self.keep)
        self.at(step)

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write summary.json (``"seconds"`` added unless given) and return it."""
        summary = {"seconds": round(self.elapsed, 3), **summary}
        self.dir.write_json("summary.json", summary)
        return summary


def check_dir(config: Any, path: Path) -> None:
    """A trainer's ``check_dir`` (:class:`~senslab.train.trainers.Trainer`) for a loop that
    writes ``config`` (a dataclass) through :class:`LoopRun`: :meth:`LoopRun.check`."""
    LoopRun(path, config).check()


def generator_states(**gens: torch.Generator) -> dict[str, torch.Tensor]:
    """``{name: state}`` of CPU generators, for a checkpoint."""
    return {k: g.get_state() for k, g in gens.items()}


def set_generator_states(states: dict[str, torch.Tensor], **gens: torch.Generator) -> None:
    """Restore generators saved by :func:`generator_states`; a generator the checkpoint holds
    no state for is an error naming it (it was a bare ``KeyError: 'measure'``)."""
    missing = [k for k in gens if k not in states]
    if missing:
        raise ValueError(
            f"the checkpoint holds no state for the random generator(s) {', '.join(missing)} "
            f"(it holds {', '.join(states) or 'none'}): it was written by a version of this loop "
            "that drew from other generators, so a resume would not continue its random "
            "streams; train the run anew in another --out directory (or delete the run "
            "directory)")
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
