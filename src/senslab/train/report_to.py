"""Every metrics.jsonl record sent to TensorBoard and W&B as well (``track.report_to``).

metrics.jsonl stays the canonical record; a reporter receives the same records, each numeric
scalar under its metrics.jsonl key (``train/loss``, ``sens/train``, ``epoch``, ``time``...) at the
record's ``step`` (lists such as ``sens/train_ci`` are left out). Only rank 0 of a distributed run
reports.

* ``"tensorboard"``: event files in ``RUN/tensorboard/`` (``torch.utils.tensorboard``; needs the
  ``tensorboard`` package: ``pip install senslab[tensorboard]``). They are rebuilt from
  metrics.jsonl whenever the run starts or resumes: a resumed run cuts metrics.jsonl back to its
  checkpoint, so the event files never hold a step twice, nor a record that metrics.jsonl dropped.
* ``"wandb"``: one W&B run, ``wandb.init(dir=RUN, name=<config name>, config=<config.json>)``;
  project, entity and mode come from W&B's own settings (``WANDB_PROJECT``, ``WANDB_ENTITY``,
  ``WANDB_MODE=offline``...), the project defaulting to ``senslab``. Its id is kept in
  ``RUN/wandb.json`` with the last step W&B holds for sure, so a resumed run continues the same
  W&B run (``resume="allow"``). W&B's history cannot be rewound: the records a resumed run redoes
  up to that step are not sent again (a resume at the same thread count redoes them bit for bit,
  so W&B still holds metrics.jsonl's values). That step moves only when a sitting's W&B run has
  finished (``run.finish()`` flushes it): a row W&B was handed is buffered, in its own process
  too, so a sitting killed (SIGKILL, out of memory) may leave none of it, and the next sitting
  sends again every record after the last finished sitting's (W&B drops a step it already has).
  A fresh start begins a new W&B run.

A run that is re-run after it finished sends what its reporters have not received yet (its
TensorBoard files are rebuilt), without retraining.
"""

from __future__ import annotations

import numbers
import os
import shutil
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Protocol

from .rundir import RunDir, _json_number

#: the reporters ``track.report_to`` can name
REPORTERS = ("tensorboard", "wandb")
TENSORBOARD_DIR = "tensorboard"
WANDB_STATE = "wandb.json"


class _InUse(RuntimeError):
    """W&B holds the run's id (:meth:`Wandb._init`)."""


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric scalars of a metrics.jsonl record under their keys; ``step`` is the x axis,
    not a scalar, and lists, strings and None are left out. A NumPy or torch scalar
    (``torch.tensor(0.5)``, ``np.array(0.5)``) counts as the number it holds, as in
    metrics.jsonl (:meth:`RunDir.log` writes it as one): left out of the live record, it
    reached TensorBoard only when the event files were rebuilt on a resume."""
    out = {}
    for k, v in record.items():
        if k == "step":
            continue
        if not isinstance(v, numbers.Real) and getattr(v, "shape", None) == ():
            v = _json_number(v)  # a 0-d tensor or array (one element: never a list)
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            out[k] = float(v)
    return out


def _seconds(record: dict[str, Any]) -> float | None:
    """A record's ``time`` (seconds since the run started, resumes included), if it has one."""
    t = record.get("time")
    return float(t) if isinstance(t, numbers.Real) and not isinstance(t, bool) else None


class Reporter(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...
    def close(self, failed: bool = False) -> None: ...


#: reporter → (the package it needs, how to install it, the module it imports)
_INSTALL = {
    "tensorboard": ("tensorboard", "pip install 'senslab[tensorboard]'",
                    "torch.utils.tensorboard"),
    "wandb": ("wandb", "pip install 'senslab[wandb]'", "wandb"),
}


def check(names: Iterable[str]) -> None:
    """An error naming the install command when a reporter in ``names`` lacks its package, or
    its package cannot be imported (``fit`` asks before it writes anything: a broken install,
    such as a protobuf that the package's generated code does not match, failed only once the
    run directory was written and the data loaded, with the package's own error)."""
    import importlib
    import importlib.util

    for n in names:
        if n not in _INSTALL:
            raise ValueError(f"unknown reporter {n!r} in track.report_to; use "
                             f"{' or '.join(REPORTERS)}")
        package, how, module = _INSTALL[n]
        if importlib.util.find_spec(package) is None:
            raise ImportError(f"track.report_to names {n}, but the {package} package is not "
                              f"installed; install it with {how}, or drop {n} from "
                              "track.report_to")
        try:
            importlib.import_module(module)
        except Exception as err:
            raise ImportError(f"track.report_to names {n}, but {module} cannot be imported "
                              f"({type(err).__name__}: {err}): the {package} install is broken "
                              f"or clashes with another package; reinstall it with {how}, or "
                              f"drop {n} from track.report_to") from err


class TensorBoard:
    """Event files in ``RUN/tensorboard/``, rebuilt from ``records`` (the run's metrics.jsonl).

    Each point's wall time is the record's ``time`` (seconds of training) after a base fixed
    when the files are built, so that TensorBoard's "Relative" axis is the run's training time,
    also across a resume: with the time of writing, every point rebuilt from metrics.jsonl sat
    at the instant of the rebuild, hours of training shown as 0 s."""

    def __init__(self, rd: RunDir, records: list[dict[str, Any]]) -> None:
        check(["tensorboard"])
        from torch.utils.tensorboard import SummaryWriter
        path = rd.path / TENSORBOARD_DIR
        shutil.rmtree(path, ignore_errors=True)  # metrics.jsonl is the record; rebuild from it
        self.writer = SummaryWriter(log_dir=str(path))
        # the last record kept lands at about now; the records logged next follow at their time
        last = _seconds(records[-1]) if records else None
        self.base = time.time() - (last or 0.0)
        for record in records:
            self._write(record)
        self.writer.flush()

    def _write(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        seconds = _seconds(record)
        wall = None if seconds is None else self.base + seconds  # None: the time of writing
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, step, walltime=wall)

    def log(self, record: dict[str, Any]) -> None:
        self._write(record)
        self.writer.flush()  # records are rare (one per evaluation): readable while training

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class Wandb:
    """One W&B run per run directory (see module). On a run that is about to train (no
    summary.json yet) it starts when it opens, so that W&B settings it cannot start with are
    an error before training: started at the first record to send, a resumed run met them only
    at its first new evaluation, often an epoch later, and lost that epoch on every retry. On a
    finished run it starts at the first record it has to send, and with none no W&B run is
    touched."""

    def __init__(self, rd: RunDir, config: dict[str, Any], name: str,
                 records: list[dict[str, Any]]) -> None:
        check(["wandb"])
        import wandb
        self.wandb, self.rd, self.config, self.name = wandb, rd, config, name
        self.run: Any = None
        state = rd.read_json(WANDB_STATE) if (rd.path / WANDB_STATE).exists() and records else {}
        # no records yet: a fresh start, which is a new W&B run
        self.id: str | None = state.get("id")
        #: the last step a finished sitting's W&B run holds; the last step handed to W&B
        self.held: int = state.get("step", -1)
        self.sent: int = self.held
        for record in records:
            self.log(record)
        if self.run is None and not (rd.path / "summary.json").exists():
            self._start()

    def _start(self) -> None:
        try:
            self.run = self._init()
        except _InUse:
            raise
        except Exception as err:
            raise RuntimeError(
                f"track.report_to names wandb, but W&B could not start the run of "
                f"{self.rd.path} ({type(err).__name__}: {err}); metrics.jsonl is unaffected. "
                "Fix W&B's settings (wandb login; WANDB_MODE=offline to log without a network, "
                "then wandb sync), or drop wandb from track.report_to") from err
        if _disabled(self.run):
            # WANDB_MODE=disabled: a run that keeps nothing. Recorded as a W&B run, its steps
            # read as held, and a later sitting with W&B on sent none of them (its W&B run
            # stayed empty, without a word); the state of the last real W&B run is kept
            return
        self.id = self.run.id
        # the id at once, the step W&B holds as before: a sitting killed before it finishes
        # continues the same W&B run and sends again what this one was handing over
        self.rd.write_json(WANDB_STATE, {"id": self.id, "step": self.held})

    def _init(self) -> Any:
        """``wandb.init`` of this run; where W&B says its id is in use, an error that says why
        and what to do. A sitting killed (SIGKILL, out of memory) inside a process tree whose W&B
        service outlives it — started by a parent that had run W&B itself, which leaves
        ``WANDB_SERVICE`` in the environment its children inherit — leaves that service holding
        the run, and the resume was refused with advice about W&B's settings."""
        try:
            return self.wandb.init(
                dir=str(self.rd.path), project=os.environ.get("WANDB_PROJECT", "senslab"),
                name=self.name, id=self.id, resume="allow", config=self.config)
        except Exception as err:
            if "is in use" not in str(err):
                raise
            shared = ("; WANDB_SERVICE in this process's environment names a W&B service "
                      "started by a parent process, which holds it until that process ends"
                      if os.environ.get("WANDB_SERVICE") else "")
            raise _InUse(
                f"W&B still holds the run {self.id} of {self.rd.path}: a sitting of it was "
                f"stopped without finishing its W&B run{shared}. Resume once the process that "
                "started it has ended, or start this run without WANDB_SERVICE in its "
                "environment (env -u WANDB_SERVICE …); metrics.jsonl is unaffected, and the "
                "steps W&B lacks are sent on the resume") from err

    def log(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        if step <= self.sent:  # sent before an interruption; W&B's history cannot be rewound
            return
        if self.run is None:
            self._start()
        self.run.log(scalars(record), step=step)
        self.sent = step

    def close(self, failed: bool = False) -> None:
        if self.run is not None:
            disabled = _disabled(self.run)
            self.run.finish(exit_code=1 if failed else 0)
            self.run = None
            if disabled:  # W&B received nothing: the steps it holds are those it held
                self.sent = self.held
                return
            # finished: W&B holds every row handed to it (marked sent when handed over, a
            # killed sitting's rows, still buffered, were lost from W&B for good: steps 0–40
            # of a run killed at 40, with no warning)
            self.held = self.sent
            self.rd.write_json(WANDB_STATE, {"id": self.id, "step": self.held})


def _disabled(run: Any) -> bool:
    """Whether the W&B run ``run`` is a no-op (``WANDB_MODE=disabled``): it sends nothing."""
    if getattr(run, "disabled", False) is True:
        return True
    return getattr(getattr(run, "settings", None), "mode", None) == "disabled"


class Reporters:
    """The reporters of one run, a context manager that closes them; empty until :meth:`open`."""

    def __init__(self) -> None:
        self.active: list[Reporter] = []

    def open(self, names: Iterable[str], rd: RunDir, config: dict[str, Any], name: str) -> None:
        """Start the reporters ``names`` on run directory ``rd`` (its metrics.jsonl as it is now
        is sent first); ``config`` is the run's config.json, ``name`` its name."""
        names = list(dict.fromkeys(names))
        if not names:
            return
        records = rd.metrics()
        check(names)
        for n in names:
            if n == "tensorboard":
                self.active.append(TensorBoard(rd, records))
            else:
                self.active.append(Wandb(rd, config, name, records))

    def log(self, record: dict[str, Any]) -> None:
        for r in self.active:
            r.log(record)

    def close(self, failed: bool = False) -> None:
        while self.active:
            self.active.pop().close(failed)

    def __enter__(self) -> Reporters:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(failed=kind is not None)


def clear(rd: RunDir) -> None:
    """Remove what reporters wrote into ``rd`` (a fresh start of the run directory)."""
    if rd.readonly:
        return
    shutil.rmtree(rd.path / TENSORBOARD_DIR, ignore_errors=True)
    (rd.path / WANDB_STATE).unlink(missing_ok=True)
