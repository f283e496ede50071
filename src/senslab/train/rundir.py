"""A run directory (format: docs/run-directory.md): config, environment, metric log, checkpoints.

Three guarantees, so that nothing is lost and nothing is silently wrong:

* **one writer** — a process that writes a run (or experiment) directory holds its lock
  (:meth:`RunDir.writing`) for the run's whole life; a second writer fails at once with a
  message naming the holder, be it another process or another thread of this one (only the
  holding thread may take the lock again, nested). Readers (``senslab measure``, ``senslab
  report``) and the other ranks of one torchrun job never take it. The lock is an OS file lock:
  it goes away with the process that held it, however that process ended.
* **verified checkpoints** — written atomically (temporary file, fsync, rename) in the format of
  :mod:`senslab.train.checkpoint`; a damaged one is detected, and a resume uses the previous good
  one, while the final model (:meth:`RunDir.final_checkpoint`) is never replaced by an earlier
  one. A checkpoint of a newer senslab is no damaged one: the run is refused, and the file left
  as it is (:meth:`RunDir.check_formats`).
* **a schema version** — ``senslab.json`` says what a directory is and which format it follows;
  a directory of an older format is migrated when it is opened for writing, one of a newer
  format is refused.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import platform
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from .checkpoint import (
    LEGACY_SUFFIX,
    SUFFIX,
    VERSION,
    CheckpointError,
    NewerCheckpointError,
    decode,
    encode,
    load_legacy,
    newer_format,
)

__all__ = ["CheckpointError", "RunDir", "RunDirError", "RunDirInUse", "SCHEMA",
           "commit_relation", "load_model_state"]

#: the run/experiment directory format this code writes (1: before senslab.json existed)
SCHEMA = 2
MARKER = "senslab.json"
LOCK_FILE = ".senslab.lock"
OWNER_FILE = ".senslab.owner"
#: the fix of a damaged marker: without it a run or experiment directory is read as one of
#: schema 1, and the marker is written again when the directory is next opened for writing
MARKER_FIX = ("delete that file alone (the runs, their records and checkpoints are kept): it "
              "only says the directory's kind and format, and is written again the next time "
              "the directory is opened for writing")
#: the file whose presence marks a schema-1 directory of each kind
LEGACY_MARKERS = {"run": "config.json", "experiment": "experiment.json"}


class RunDirError(ValueError):
    """A run or experiment directory that cannot be used as asked (the message says why and
    what to do)."""


class ForeignCheckpointError(CheckpointError):
    """A checkpoint written beside another config.json than its directory's (another run's)."""


class RunDirInUse(RunDirError):
    """Another process is writing the directory."""


def notice(message: str) -> None:
    """A one-line message to the user, on stderr (stdout stays the command's result)."""
    print(f"senslab: {message}", file=sys.stderr, flush=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file (fsync, rename): a reader sees the old
    file or the new one, never part of one. The temporary name carries the process and the
    thread, so that two writers never share it."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise write_error(err, path, "it was not written; the file there before, if "
                                         "any, is kept as it was") from None
        raise
    _fsync_dir(path.parent)


def write_error(err: OSError, path: Path, kept: str) -> OSError:
    """``err``, raised while writing ``path``, as an OSError that names ``path`` and says what
    is ``kept``. A full disk or the file-size limit fails the write itself, whose error names no
    file (``[Errno 27] File too large``, the whole message of a run that stopped at a
    checkpoint); an error opening the temporary file named that file, not the one written."""
    reason = err.strerror or str(err)
    if err.errno == errno.EFBIG:
        reason += ": over this process's file-size limit (ulimit -f); raise the limit"
    return OSError(err.errno, f"{reason} ({kept})", str(path))


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def read_json_file(path: Path) -> Any:
    """``json.loads`` of ``path``; a damaged file is a :class:`RunDirError` naming it."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        where = f" ({err.msg}, line {err.lineno})" if isinstance(err, json.JSONDecodeError) else ""
        if path.name == "summary.json":  # the training is in the checkpoints: nothing to redo
            fix = ("delete this file and re-run the run's command: it resumes from the last "
                   "checkpoint and writes the summary again, keeping the training")
        elif path.name == MARKER:  # deleting the directory lost a run for its format's marker
            fix = MARKER_FIX
        else:
            fix = f"restore it, or delete {path.parent} to start over"
        raise RunDirError(
            f"{path} is not valid JSON{where}: the file is truncated or damaged; {fix}"
        ) from None


def _json_number(obj: Any) -> Any:
    """A one-element NumPy or torch value (``np.float32(0.5)``, ``torch.tensor(0.5)``,
    ``np.int64(7)``, ``np.bool_(True)``) as the Python number it holds, for ``json.dumps``; None
    for anything else. Such values are what a loop's record easily holds (a loss not
    ``.item()``-ed): written with ``default=str`` they became the strings ``"0.25"`` and
    ``"tensor(0.7500)"`` in summary.json, which its check against metrics.jsonl let through,
    and with ``default=float`` an integer step became ``1.0``."""
    item = getattr(obj, "item", None)
    if callable(item) and getattr(obj, "shape", None) is not None:
        try:
            return item()
        except (ValueError, RuntimeError):  # more than one element: not a scalar
            return None
    return None


def _json_default_str(obj: Any) -> Any:
    """``json.dumps`` default of :meth:`RunDir.write_json`: a NumPy/torch scalar as its number
    (:func:`_json_number`), anything else (a path) as its text."""
    number = _json_number(obj)
    return str(obj) if number is None else number


def _json_default_float(obj: Any) -> Any:
    """``json.dumps`` default of :meth:`RunDir.log`: a NumPy/torch scalar as its number (ints
    stay ints, bools bools), anything else through ``float``; not finite, None (JSON has no
    NaN: :func:`_known_values`)."""
    number = _json_number(obj)
    number = float(obj) if number is None else number
    return None if isinstance(number, float) and not math.isfinite(number) else number


def _known_values(value: Any, where: str, unknown: list[str]) -> Any:
    """``value`` (an entry of a record, named ``where``) with every number in it that is not
    finite — NaN, inf, a NumPy or torch scalar holding one — as None, metrics.jsonl's "not
    known" (as the tracker writes it), each such place appended to ``unknown``. ``json.dumps``
    wrote them as bare ``NaN`` and ``Infinity``, which are not JSON: a strict reader
    (JavaScript, serde_json, DuckDB) refused the whole line."""
    if isinstance(value, dict):
        return {k: _known_values(v, f"{where}.{k}", unknown) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_known_values(v, f"{where}[{i}]", unknown) for i, v in enumerate(value)]
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and len(getattr(value, "shape", None) or ()) > 0:
        # a NumPy array or torch tensor of several numbers (a per-position profile): its list,
        # as a Python list is written. It made log() fail with torch's "only one element
        # tensors can be converted", naming neither the metric nor the file, and write_json
        # wrote its text ("[0.5  0.25]", "tensor([1, 2])") as a string in place of the numbers
        return _known_values(tolist(), where, unknown)
    number = value if isinstance(value, float) else _json_number(value)
    if isinstance(number, float) and not math.isfinite(number):
        unknown.append(f"{where}={number}")
        return None
    return value


def nan_for_null(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` (of :meth:`RunDir.metrics`) with every null entry as NaN, for a reader of a
    loop's own records (one that logs numbers, never None): :meth:`RunDir.log` writes a NaN or
    inf as null, and a reader comparing numbers reads it as the NaN it logged (which compares
    False) instead of failing on None (``None >= 0.9``: TypeError). Lists keep their nulls."""
    return [{k: math.nan if v is None else v for k, v in r.items()} for r in records]


def _numbers_differ(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are two numbers (not bools) that differ; NaN equals NaN, and a
    null (None, a NaN or inf as written) is NaN: a null against a number differs (it let a
    summary.json whose final loss was set to null, or the log's, pass its check)."""
    a, b = (math.nan if x is None else x for x in (a, b))
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b)):
        return False
    return a != b and not (math.isnan(a) and math.isnan(b))


def metric_order_problem(path: Path, numbered: Iterable[tuple[int, dict[str, Any]]]) -> str | None:
    """Why the metric log ``path`` cannot be trusted — a step logged twice or out of order, as
    when two processes wrote one run — or None. ``numbered``: (line number, record) pairs."""
    prev: tuple[int, Any] | None = None
    for lineno, row in numbered:
        step = row.get("step")
        if not isinstance(step, (int, float)) or isinstance(step, bool):
            continue
        if prev is not None and step <= prev[1]:
            how = "repeats" if step == prev[1] else "goes back to"
            return (f"{path}: line {lineno} {how} step {step} after step {prev[1]} (line "
                    f"{prev[0]}); the log holds duplicated or out-of-order records, as when two "
                    "processes write one run at once, so its numbers cannot be trusted: delete "
                    f"{path.parent} and train it again")
        prev = (lineno, step)
    return None


#: the variables by which git finds a repository other than the one at ``-C``'s path: a git hook
#: exports them (GIT_DIR, GIT_INDEX_FILE, …) for the repository that runs it, so a run started
#: from a hook of the user's project recorded that project's HEAD as senslab's commit
GIT_REPO_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                 "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_IMPLICIT_WORK_TREE",
                 "GIT_GRAFT_FILE", "GIT_NO_REPLACE_OBJECTS", "GIT_REPLACE_REF_BASE",
                 "GIT_SHALLOW_FILE", "GIT_PREFIX", "GIT_NAMESPACE")


def git_commit() -> str | None:
    """The commit of the senslab checkout in use, with ``+dirty`` appended when tracked files
    under its ``src/`` differ from that commit (the code that ran is then not the commit's), and
    ``+unknown`` when ``git status`` fails, so that cannot be told:
    None outside a checkout, and None for an installed package that merely sits inside some
    other git repository (a virtual environment in a user's project), whose commit says nothing
    about senslab's code."""
    here = Path(__file__).resolve()
    root = here.parents[3]
    if here.parents[2].name != "src" or not (root / "pyproject.toml").is_file():
        return None  # not src/senslab/… of a checkout: an installed copy
    env = {k: v for k, v in os.environ.items() if k not in GIT_REPO_VARS}
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True, text=True, timeout=5, env=env,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    if len(out) != 2 or Path(out[0]).resolve() != root:
        return None
    try:
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
             "src"], capture_output=True, text=True, timeout=5, env=env,
        )
    except (OSError, subprocess.SubprocessError):
        status = None
    if status is None or status.returncode != 0:
        # git could not say whether src/ is edited (a locked or unreadable index): not "clean"
        return out[1] + "+unknown"
    return out[1] + ("+dirty" if status.stdout.strip() else "")


def commit_relation(recorded: str, now: str) -> str:
    """Whether the commit ``recorded`` (a sitting's, as :func:`git_commit` gave it) is the
    code of ``now``: ``"same"`` (the same string), ``"other"`` (another commit, or the same one
    with and without edits under ``src/``) or ``"unknown"``: the same commit where one of the
    two is ``+unknown`` — git status failed, so whether ``src/`` was edited cannot be told, and
    neither can a difference."""
    sha, _, mark = recorded.partition("+")
    sha_now, _, mark_now = now.partition("+")
    if sha == sha_now and "unknown" in (mark, mark_now):  # both +unknown: still not known
        return "unknown"
    return "same" if recorded == now else "other"


def environment(device: torch.device | str) -> dict[str, Any]:
    """Versions, git commit, device and command line, for env.json."""
    commit = git_commit()
    gpu = None
    if torch.cuda.is_available():
        # the GPU trained on (cuda:1's, not the current device's), else the machine's first
        try:
            on: torch.device | None = torch.device(device)
        except (RuntimeError, TypeError):  # a name torch does not know ("auto")
            on = None
        gpu = torch.cuda.get_device_name(on if on is not None and on.type == "cuda" else None)
    import numpy

    import senslab

    return {
        "senslab": senslab.__version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "git_commit": commit,
        "device": str(device),
        "cuda": gpu,
        "threads": torch.get_num_threads(),
        "command": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


#: the directory locks this process holds: resolved path → [lock, nesting depth, owning thread]
_HELD: dict[Path, list[Any]] = {}
#: guards :data:`_HELD` while a thread checks it and takes a lock
_HELD_GUARD = threading.Lock()


def checkpoint_step(path: Path) -> int:
    """``step-00000100.safetensors`` → 100 (-1 for a name of another form)."""
    try:
        return int(path.name.split(".")[0].removeprefix("step-"))
    except ValueError:
        return -1


class RunDir:
    """Paths and I/O of one run directory (``kind="experiment"``: of an experiment directory,
    which shares the marker, the lock and the JSON writer)."""

    def __init__(self, path: str | os.PathLike[str], readonly: bool = False,
                 kind: str = "run") -> None:
        #: a read-only RunDir (ranks > 0 of a distributed run) silently skips every write
        self.readonly = readonly
        self.kind = kind
        self.path = Path(path)
        self.ckpt_dir = self.path / "checkpoints"
        self.metrics_path = self.path / "metrics.jsonl"
        #: the metrics :meth:`log` has warned of a value that is not finite
        self._said_unknown: set[str] = set()

    # -- config / env / summary ----------------------------------------------------------------
    def write_json(self, name: str, obj: Any) -> None:
        """Write ``obj`` as the record ``name``, every number in it that is not finite as None
        (:func:`_known_values`), as :meth:`log` writes metrics.jsonl: ``json.dumps`` wrote a NaN
        or inf (a diverged run's final loss, an undefined standard error) as bare ``NaN`` or
        ``Infinity``, which is not JSON, so a strict reader (jq, JavaScript, serde_json, DuckDB)
        refused the whole file. senslab's readers take a null for a value not known. No warning:
        a record's NaN is a value not known by design (a metric's NaN was warned of by
        :meth:`log`)."""
        if self.readonly:
            return
        unknown: list[str] = []
        obj = _known_values(obj, "", unknown)
        if name == "config.json" and unknown:
            # a record's null is "not known"; a setting's would be another setting: read back,
            # None is not the inf or NaN the run used, and every resume or reuse of the run was
            # refused as "a different configuration" (differs in that key)
            shown = ", ".join(u.lstrip(".") for u in unknown[:4]) + (", …" if len(unknown) > 4
                                                                      else "")
            raise RunDirError(
                f"{self.path / name} cannot record the configuration's {shown}: JSON has no "
                "NaN or infinity, so config.json would hold null there, not the value this run "
                "uses, and every resume or reuse of the run would be refused as a different "
                "configuration; give a finite number instead (or None where the setting can "
                "be off)")
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path / name, json.dumps(obj, indent=2, sort_keys=True,
                                                         default=_json_default_str,
                                                         allow_nan=False))

    def read_json(self, name: str) -> Any:
        """``name``'s JSON; summary.json is checked against the metric log first
        (:meth:`check_summary`), so that every reader of a finished run — a trainer reusing it,
        a measurement of its final model — gets a summary its records agree with."""
        data = read_json_file(self.path / name)
        if name == "summary.json":
            self.check_summary(data)
        return data

    def check_summary(self, summary: Any) -> None:
        """Refuse a summary.json whose ``final`` disagrees with the last record of metrics.jsonl.

        Every trainer's ``final`` is that record (plus numbers measured after training, which
        the log lacks), and a finished run is reused without training; a hand-edited or damaged
        summary.json would change the run's result, and the verdict resting on it, without a
        word. Cheap: the log's last line only, and the numbers both hold (equal as their JSON
        text reads back; NaN equals NaN). A finished run's log ends with the record its
        summary was written from, so a log that is empty, or whose last line is torn, beside a
        summary with final numbers was damaged after the run ended: refused too (a crash tears
        a line only before the summary exists, and :meth:`metrics` reads such a line as a
        crash's)."""
        final = summary.get("final") if isinstance(summary, dict) else None
        if isinstance(final, dict) and final and not self.metrics_path.exists():
            # the records the experiments' after-run steps read too: without them one was
            # judged "froze before 3 logged steps" instead of naming the lost file
            raise RunDirError(
                f"{self.path / 'summary.json'} gives the run's final numbers, but "
                f"{self.metrics_path}, the records they come from, is missing: restore it, or "
                f"delete {self.path} and train the run again")
        last = self._last_record()
        if isinstance(final, dict) and final and last is None:
            raise RunDirError(
                f"{self.path / 'summary.json'} gives the run's final numbers, but "
                f"{self.metrics_path}, the records they come from, "
                f"{'is empty' if self._log_empty() else 'ends in a torn line'}: it was damaged "
                f"after the run ended (records are missing from it), so what is read from it "
                f"cannot be trusted; restore it, or delete {self.path} and train the run again")
        if not isinstance(final, dict) or last is None:
            return
        differ = [k for k in final if k in last and _numbers_differ(final[k], last[k])]
        if not differ:
            return
        shown = "; ".join(f"{k}: {final[k]!r} in summary.json, {last[k]!r} in the log"
                          for k in differ[:3]) + ("; …" if len(differ) > 3 else "")
        summary_path = self.path / "summary.json"
        raise RunDirError(
            f"{summary_path}: its final numbers are not those of the last record of "
            f"{self.metrics_path.name} (step {last.get('step', '?')}), which the run ended with "
            f"({shown}): one of the two files was edited or damaged, so the run's result cannot "
            f"be trusted. If summary.json is the damaged one, delete {summary_path} and re-run "
            "the run's command: it resumes from the last checkpoint and writes the summary "
            f"again, keeping the training; otherwise delete {self.path} and train it again")

    def _log_empty(self) -> bool:
        """Whether metrics.jsonl holds nothing but white space."""
        try:
            with open(self.metrics_path, "rb") as fh:
                return not fh.read(1 << 16).strip()
        except OSError:
            return True

    def _last_record(self) -> dict[str, Any] | None:
        """The last line of metrics.jsonl as a record; None when the log is missing or empty,
        or its last line is torn (not JSON)."""
        try:
            with open(self.metrics_path, "rb") as fh:  # the tail only: logs grow long
                size = fh.seek(0, os.SEEK_END)
                back = 1 << 20
                while True:
                    fh.seek(max(0, size - back))
                    data = fh.read()
                    # the whole last line: one longer than the tail read (a per-position list
                    # of 100,000 numbers) was cut, and a finished run refused as torn
                    if back >= size or b"\n" in data.rstrip():
                        break
                    back *= 2
        except OSError:
            return None
        line = data.rstrip().rpartition(b"\n")[2]
        try:
            record = json.loads(line) if line else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        return record if isinstance(record, dict) else None

    def exists(self) -> bool:
        return (self.path / "config.json").exists()

    # -- format version ------------------------------------------------------------------------
    def marker(self) -> dict[str, Any] | None:
        """The contents of ``senslab.json`` (None when the directory has none)."""
        if not (self.path / MARKER).is_file():
            return None
        data = self.read_json(MARKER)
        if not (isinstance(data, dict) and isinstance(data.get("schema"), int)
                and data.get("kind") in LEGACY_MARKERS):
            raise RunDirError(f"{self.path / MARKER} is not a senslab directory marker; "
                              + MARKER_FIX)
        return data

    def schema(self) -> int | None:
        """The format version of the directory: from ``senslab.json``, 1 for a directory written
        before it existed, None when the directory holds no senslab run/experiment."""
        marker = self.marker()
        if marker is not None:
            return int(marker["schema"])
        return 1 if (self.path / LEGACY_MARKERS[self.kind]).is_file() else None

    def check_readable(self) -> None:
        """Refuse a directory written in a newer format than this code knows."""
        schema = self.schema()
        if schema is not None and schema > SCHEMA:
            raise RunDirError(f"{self.path} was written by a newer senslab (schema {schema}; "
                              f"this one reads up to {SCHEMA}); upgrade senslab to use it")

    @property
    def _a_kind(self) -> str:
        return f"{'an' if self.kind[0] in 'aeiou' else 'a'} {self.kind} directory"

    def check_target(self) -> None:
        """Refuse, taking no lock and writing nothing, a directory :meth:`acquire` would refuse:
        not a directory, another kind of senslab directory, a newer format, a foreign non-empty
        directory, or a run's checkpoints or summary without its config.json."""
        self._check_target()
        self._check_config_present()

    def _check_target(self) -> None:
        """Before anything is written: the directory is new, empty, or a senslab directory of
        this kind in a format this code can write."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise RunDirError(f"{p} is a file, not a directory; choose a new directory for --out")
        marker = self.marker()
        if marker is not None and marker["kind"] != self.kind:
            raise RunDirError(f"{p} is a senslab {marker['kind']} directory, not {self._a_kind}; "
                              "choose an empty or new directory for --out")
        self.check_readable()
        if self.schema() is not None:
            return
        other = next((k for k, f in LEGACY_MARKERS.items() if (p / f).is_file()), None)
        if other is not None:
            raise RunDirError(f"{p} is a senslab {other} directory, not {self._a_kind}; choose "
                              "an empty or new directory for --out")
        foreign = sorted(e.name for e in p.iterdir() if not _own_file(e.name)) if p.is_dir() else []
        if foreign:
            shown = ", ".join(foreign[:4]) + (", …" if len(foreign) > 4 else "")
            raise RunDirError(f"{p} is not empty and is not a senslab {self.kind} directory (it "
                              f"holds {shown}); choose an empty or new directory for --out")

    def _check_config_present(self) -> None:
        """Refuse a run directory that holds checkpoints or a summary but no config.json: the
        run that wrote them is unknown, so a new one started in their place would mix with them
        (its checkpoints pruned for the old run's later ones, the old final model taken for its
        own)."""
        if self.kind != "run" or self.exists():
            return
        left = [p.name for p in self.checkpoints()]
        if (self.path / "summary.json").is_file():
            left.append("summary.json")
        if left:
            shown = ", ".join(left[:3]) + (", …" if len(left) > 3 else "")
            raise RunDirError(
                f"{self.path} holds a run ({shown}) but no config.json, so what trained it is "
                f"unknown and a new run cannot start over it; restore {self.path / 'config.json'}"
                f" to resume it, or delete {self.path} (or choose another --out) to train anew")

    # -- the writer's lock ---------------------------------------------------------------------
    def holds_lock(self) -> bool:
        """Whether this thread holds the directory's lock (another thread's hold is no
        permission to write: see :meth:`acquire`)."""
        held = _HELD.get(self.path.resolve())
        return held is not None and held[2] is threading.current_thread()

    def acquire(self) -> None:
        """Take the directory's lock (nested calls in the holding thread only count), after
        checking that the directory can be written; migrate a schema-1 directory, write the
        marker and remove temporary files left by writers that died. :class:`RunDirInUse` if
        another process, or another thread of this one, holds it. Pair with :meth:`release`, or
        use :meth:`writing`."""
        if self.readonly:
            return
        key = self.path.resolve()
        me = threading.current_thread()
        with _HELD_GUARD:  # no other thread of this process slips in between check and take
            held = _HELD.get(key)
            if held is not None and held[2] is not me and not held[2].is_alive():
                # its thread ended without releasing it: nobody can write through it any more,
                # so this thread takes the lock over (the OS lock is this process's already)
                held[1], held[2] = 0, me
            if held is not None:
                if held[2] is not me:
                    raise RunDirInUse(
                        f"{self.path} is in use by another thread of this process (thread "
                        f"{held[2].name!r}, {self._owner()}); wait for it to finish, or use "
                        "another --out directory (one per run: threads that train at once "
                        "need directories of their own)")
                held[1] += 1
                return
            self.check_target()
            lock = self._lock_file()
            _HELD[key] = [lock, 1, me]
        try:
            atomic_write_text(self.path / OWNER_FILE, json.dumps({
                "pid": os.getpid(), "host": socket.gethostname(), "thread": me.name,
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": sys.argv,
            }))
            self._remove_orphans()
            self._upgrade()
        except BaseException:
            self._unlock(key)
            raise

    def _lock_file(self) -> Any:
        """The directory's OS file lock, taken without waiting."""
        from filelock import FileLock, Timeout

        try:
            self.path.mkdir(parents=True, exist_ok=True)
            lock = FileLock(self.path / LOCK_FILE, thread_local=False)
            lock.acquire(timeout=0)
        except Timeout:  # before OSError: filelock's Timeout is a TimeoutError
            raise RunDirInUse(f"{self.path} is in use by another senslab process "
                              f"({self._owner()}); wait for it to finish, or use another "
                              "--out directory") from None
        except PermissionError as err:
            raise PermissionError(f"cannot write to {self.path} ({err.strerror or err}): it is "
                                  "read-only for you; choose a directory you can write for "
                                  "--out") from None
        except OSError as err:
            raise RunDirError(f"cannot create {self.path} ({err.strerror or err}); choose "
                              "another directory for --out") from None
        return lock

    def release(self) -> None:
        """Undo one :meth:`acquire` of this thread (the lock goes with the last); a thread that
        does not hold the lock releases nothing."""
        if self.readonly:
            return
        key = self.path.resolve()
        with _HELD_GUARD:
            held = _HELD.get(key)
            if held is None or held[2] is not threading.current_thread():
                return
            held[1] -= 1
            if held[1] > 0:
                return
        self._unlock(key)

    def _unlock(self, key: Path) -> None:
        lock = _HELD[key][0]
        try:
            (self.path / OWNER_FILE).unlink(missing_ok=True)  # before the release: see _owner
        finally:
            with _HELD_GUARD:
                del _HELD[key]
                lock.release()

    @contextmanager
    def writing(self) -> Iterator[RunDir]:
        """Hold the directory's lock inside the block (see :meth:`acquire`); released however
        the block ends. A read-only RunDir takes no lock."""
        self.acquire()
        try:
            yield self
        finally:
            self.release()

    def _owner(self) -> str:
        try:
            info = json.loads((self.path / OWNER_FILE).read_text())
            return f"pid {info['pid']} on host {info['host']}, since {info['since']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "pid unknown: it is just starting or stopping"

    def _remove_orphans(self) -> None:
        """Temporary files of writers that died mid-write (only a lock holder runs this, so no
        live writer owns one)."""
        for folder in (self.path, self.ckpt_dir):
            if folder.is_dir():
                for f in folder.glob(".*.tmp-*"):
                    f.unlink(missing_ok=True)

    def _upgrade(self) -> None:
        """Write the marker of a new directory; migrate one of schema 1 (convert its verified
        ``.pt`` checkpoints) and say so in one line."""
        schema = self.schema()
        if schema == SCHEMA:
            return
        if schema == 1:
            done = self._migrate_checkpoints() if self.kind == "run" else ""
            notice(f"{self.path}: upgraded a {self.kind} directory of an older senslab to schema "
                   f"{SCHEMA}{done}")
        import senslab

        self.write_json(MARKER, {"kind": self.kind, "schema": SCHEMA,
                                 "senslab": senslab.__version__})

    def _migrate_checkpoints(self) -> str:
        converted, kept = 0, []
        for old in sorted(self.ckpt_dir.glob(f"step-*{LEGACY_SUFFIX}")):
            try:
                state = load_legacy(old)
            except CheckpointError:
                kept.append(old.name)
                continue
            atomic_write_bytes(old.with_suffix(SUFFIX), encode(state))
            old.unlink()
            old.with_suffix(".sha256").unlink(missing_ok=True)
            converted += 1
        if not converted and not kept:
            return ""
        out = f" ({converted} checkpoint(s) converted to {SUFFIX}"
        if kept:
            out += (f"; {', '.join(kept)} could not be verified and stay as they are, loaded only "
                    "with allow_unverified=True")
        return out + ")"

    # -- metrics -------------------------------------------------------------------------------
    def log(self, record: dict[str, Any]) -> None:
        """Append ``record`` to metrics.jsonl as one line. A log whose last line a crash tore
        (no newline) is mended first (:meth:`_end_torn_line`): appended to it, the record was
        glued onto the torn text, and :meth:`metrics` dropped the glued line as a crash's,
        losing the new record without a word."""
        if self.readonly:
            return
        unknown: dict[str, list[str]] = {}
        record = {k: _known_values(v, str(k), unknown.setdefault(str(k), []))
                  for k, v in record.items()}
        # once per metric: a loop logs the same metric at every evaluation
        new = [place for key, places in unknown.items() if key not in self._said_unknown
               for place in places]
        if new:
            self._said_unknown.update(k for k, places in unknown.items() if places)
            warnings.warn(f"{self.metrics_path}: {', '.join(new)} at step "
                          f"{record.get('step', '?')} written as null (not known), as JSON has "
                          "no NaN or inf and a strict reader (JavaScript, serde_json, DuckDB) "
                          "refuses a line holding one; the reports leave a null out of the "
                          "metric's curve and mean. Log None where a value is not known, or "
                          "check what made it non-finite", stacklevel=2)
        line = json.dumps(record, default=_json_default_float, allow_nan=False) + "\n"
        try:
            with open(self.metrics_path, "a+b") as f:
                mended = self._end_torn_line(f)
                f.write(line.encode())
                f.flush()
        except OSError as err:
            raise write_error(err, self.metrics_path, "the records logged before are kept; "
                              "re-running the command resumes from the last checkpoint") from None
        if mended:
            notice(mended)

    def _end_torn_line(self, f: Any) -> str | None:
        """Make metrics.jsonl (``f``, opened ``a+b``) end in a newline: a last line that is a
        whole record (only its newline missing) is kept; a torn one — not a record, which
        :meth:`metrics` drops as a crash's and a resume cuts away — is removed. Returns the
        notice saying so (None: nothing removed)."""
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        f.seek(0)
        tail = f.read().rpartition(b"\n")[2]
        try:
            whole = isinstance(json.loads(tail), dict)
        except (json.JSONDecodeError, UnicodeDecodeError):
            whole = False
        if whole:
            f.write(b"\n")
            return None
        f.truncate(size - len(tail))
        return (f"{self.metrics_path}: removed its torn last line (a run stopped while writing "
                f"it), {tail[:60]!r}{'…' if len(tail) > 60 else ''}; appending after the "
                "last whole record")

    def metrics(self) -> list[dict[str, Any]]:
        """The logged records; an error if a step is logged twice or out of order.

        Read as ``senslab report`` reads the log: blank lines are skipped (one left by an edit
        made the resume refuse the run, whose report read it), and a line that is not UTF-8 or
        not a JSON object is an error naming the line (it was a bare UnicodeDecodeError or
        AttributeError), unless it is the last line, which a killed run leaves partial."""
        if not self.metrics_path.exists():
            return []
        out = []
        numbered = [(i + 1, line) for i, line in
                    enumerate(self.metrics_path.read_bytes().splitlines()) if line.strip()]
        for pos, (lineno, line) in enumerate(numbered):
            try:
                record = json.loads(line.decode("utf-8"))
                why = "is not a JSON object (a metric record)"
            except json.JSONDecodeError:
                record, why = None, "is not valid JSON"
            except UnicodeDecodeError:
                record, why = None, "is not valid JSON (not UTF-8 text)"
            if not isinstance(record, dict):
                if pos == len(numbered) - 1:  # a run killed mid-write leaves a partial last line
                    break
                raise RunDirError(f"{self.metrics_path}:{lineno} {why}; the metric log is "
                                  f"damaged: restore it, or delete {self.path} and train again")
            out.append((lineno, record))
        problem = metric_order_problem(self.metrics_path, out)
        if problem:
            raise RunDirError(problem)
        return [record for _, record in out]

    def truncate_metrics(self, step: int) -> None:
        """Keep only records logged at or before ``step`` (drop what a resume will redo)."""
        if self.readonly:
            return
        kept = [r for r in self.metrics() if r.get("step", 0) <= step]
        # a NaN an older senslab wrote bare is kept as null, not written back as bare NaN
        atomic_write_text(self.metrics_path, "".join(
            json.dumps(_known_values(r, "", []), allow_nan=False) + "\n" for r in kept))

    def config_digest(self) -> str | None:
        """SHA-256 of the run's config.json as written (None without one): the raw digest of
        :meth:`config_digests`."""
        return self.config_digests().get(RAW_DIGEST)

    def config_digests(self) -> dict[str, str]:
        """What a checkpoint (:meth:`save_checkpoint`) and a cached measurement record of the
        config.json of the run that made them, for :meth:`config_matches`: ``config_sha256``,
        the SHA-256 of the file as written, and ``config_canonical_sha256``, that of its parsed
        JSON in one fixed form (keys sorted, no spaces), which a config.json re-indented or with
        its keys reordered by hand keeps. The canonical one is left out when the file is not
        valid JSON; ``{}`` without a config.json."""
        try:
            data = (self.path / "config.json").read_bytes()
        except FileNotFoundError:
            return {}
        out = {RAW_DIGEST: hashlib.sha256(data).hexdigest()}
        try:
            parsed = json.loads(data)
        except (ValueError, RecursionError):  # damaged: the raw digest alone
            return out
        canonical = json.dumps(parsed, sort_keys=True, separators=(",", ":"))
        out[CANONICAL_DIGEST] = hashlib.sha256(canonical.encode()).hexdigest()
        return out

    def config_matches(self, recorded: dict[str, Any]) -> bool:
        """Whether ``recorded`` (:meth:`config_digests` as a checkpoint or a cached measurement
        recorded them) describes the run's config.json now: its raw digest is the file's, or
        its canonical one (when recorded: a record of an older senslab holds the raw one only)
        is that of the file's parsed JSON. False without a config.json, and for a record holding
        neither digest."""
        return _digests_match(recorded, self.config_digests())

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any], step: int, keep: int = 2) -> Path | None:
        """Write ``state`` as ``checkpoints/step-<step>.safetensors`` and keep the newest
        ``keep`` checkpoints (0: all)."""
        if self.readonly:
            return None
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        path = self.ckpt_dir / f"step-{step:08d}{SUFFIX}"
        # the metric log is made durable first and its length recorded: a checkpoint never
        # outlives records logged before it (a torn last line after a crash is detected on
        # resume, :meth:`load_latest`)
        records = 0
        if self.metrics_path.exists():
            with open(self.metrics_path, "rb") as f:
                os.fsync(f.fileno())
            records = len(self.metrics())
        digests = {STATE_KEYS[k]: v for k, v in self.config_digests().items()}
        atomic_write_bytes(path, encode({**state, METRIC_RECORDS: records, **digests}))
        for old in self.checkpoints()[:-keep] if keep > 0 else []:
            if old == path:  # a later one left by another sitting never outlives this sitting's
                continue
            old.unlink(missing_ok=True)
            old.with_suffix(".sha256").unlink(missing_ok=True)
        return path

    def checkpoints(self) -> list[Path]:
        """Checkpoint files, oldest first (schema-1 ``.pt`` files too, until migrated): the
        names senslab writes, ``step-00000100.safetensors``, alone. A file of another name put
        in the folder (``step-00000030-backup.safetensors``) is no checkpoint of the run's: it
        was listed as the oldest, so pruning deleted it and a resume could fall back to it."""
        if not self.ckpt_dir.exists():
            return []
        found = [p for suffix in (SUFFIX, LEGACY_SUFFIX)
                 for p in self.ckpt_dir.glob(f"step-*{suffix}")
                 if p.name == f"step-{checkpoint_step(p):08d}{suffix}"]
        return sorted(found, key=lambda p: (checkpoint_step(p), p.suffix == SUFFIX))

    @staticmethod
    def load_checkpoint(path: Path, allow_unverified: bool = False) -> dict[str, Any]:
        """Load one checkpoint after verifying its checksum; :class:`CheckpointError` if it is
        damaged or (unless ``allow_unverified``) carries no checksum. Nothing is unpickled."""
        return RunDir._load(path, allow_unverified)[0]

    @staticmethod
    def _load(path: Path, allow_unverified: bool) -> tuple[dict[str, Any], int | None]:
        """A checkpoint's state as saved, and the metric records logged before it (None for a
        checkpoint written before they were recorded)."""
        path = Path(path)
        if path.suffix == LEGACY_SUFFIX:
            return load_legacy(path, allow_unverified), None
        try:
            data = path.read_bytes()
        except OSError as err:
            raise CheckpointError(f"{path} cannot be read ({err.strerror or err})") from None
        state = decode(data, path, allow_unverified)
        records = state.pop(METRIC_RECORDS, None)
        written = {k: v for k, key in STATE_KEYS.items() if (v := state.pop(key, None)) is not None}
        # one without the raw digest was written before checkpoints recorded their config.json
        here = (RunDir(path.parent.parent, readonly=True).config_digests()
                if RAW_DIGEST in written else {})
        if here and not _digests_match(written, here):
            # one of an older senslab records the file's bytes only: a config.json re-indented
            # by hand, same settings, is another to it
            raw_only = ("; it records config.json byte for byte (an older senslab wrote it), so "
                        "if config.json was only re-indented or its keys reordered, put back the "
                        "file as senslab wrote it instead"
                        if CANONICAL_DIGEST not in written else "")
            raise ForeignCheckpointError(
                f"{path} was written beside another config.json than "
                f"{path.parent.parent / 'config.json'} (copied in from another run, or "
                "config.json replaced): its weights belong to that run, and resuming or "
                "measuring them here would mix two runs; move it back to the run directory "
                f"that wrote it, or delete it{raw_only}")
        return state, None if records is None else int(records)

    def load_latest(self, allow_unverified: bool = False, resume: bool = False
                    ) -> tuple[Path, dict[str, Any]] | None:
        """(path, state) of the newest checkpoint that verifies; the ones that do not are
        reported and skipped. With ``resume``, also one whose metric records are no longer all
        in metrics.jsonl (its last line torn by a crash after the checkpoint was written):
        resuming from it would leave those records out for good; and when none can be resumed
        from, the writer (the lock holder) moves them aside (:meth:`_set_aside`), so that the
        run starting over never mixes with them.

        A checkpoint that vanishes between listing and reading was pruned by the run training
        in the directory (readers may read a run while it trains): the list is read again,
        not the file reported as damaged."""
        self.check_readable()
        self.check_formats()
        for attempt in range(VANISHED_RETRIES + 1):
            listed = self.checkpoints()
            found, problems, vanished = self._newest_usable(listed, allow_unverified, resume,
                                                            last=attempt == VANISHED_RETRIES)
            if not vanished:
                break
        for problem in problems:
            warnings.warn(problem, stacklevel=3)
        if found is None and resume and listed and self.holds_lock():
            self._set_aside()
        return found

    def _newest_usable(self, listed: list[Path], allow_unverified: bool, resume: bool,
                       last: bool) -> tuple[tuple[Path, dict[str, Any]] | None, list[str], bool]:
        """One pass of :meth:`load_latest` over ``listed``: (the result, the warnings to give,
        whether a file vanished so that the list must be read again — never on the ``last``
        pass)."""
        problems: list[str] = []
        kept: list[dict[str, Any]] | None = None
        for path in reversed(listed):
            try:
                state, records = self._load(path, allow_unverified)
            except ForeignCheckpointError as err:
                raise RunDirError(str(err)) from None  # never a fall-back past another run's
            except NewerCheckpointError:
                # not damaged: never a fall-back past it (the resumed run would overwrite it)
                raise self._newer(path, newer_format(path)) from None
            except CheckpointError as err:
                if not path.exists():
                    if not last:
                        return None, [], True
                    problems.append(f"{path} vanished while being read (pruned by the run "
                                    "training in the directory); falling back to the previous "
                                    "checkpoint")
                    continue
                problems.append(f"{err}; falling back to the previous checkpoint")
                continue
            if resume and records is not None:
                if kept is None:
                    kept = self.metrics()
                # records are appended in order and only the last line can be torn, so the
                # first ``records`` lines are intact exactly when that many are complete
                have = len(kept)
                if have < records:
                    problems.append(
                        f"{self.metrics_path} holds {have} of the {records} metric records "
                        f"logged before checkpoint {path.name} (its end was lost in a crash); "
                        "falling back to the previous checkpoint so that no record goes missing")
                    continue
            return (path, state), problems, False
        return None, problems, False

    def check_formats(self) -> None:
        """Refuse a run directory holding a checkpoint written by a newer senslab (its header's
        format version above :data:`~senslab.train.checkpoint.VERSION`; only the headers are
        read). Such a checkpoint is not damaged: the run went on under that version. Skipped as
        a damaged one is, a resume would fall back to an earlier checkpoint (or set them all
        aside and start over) and train again, over the newer senslab's files, what it trained."""
        for path in reversed(self.checkpoints()):  # the newest such one is named
            if path.suffix == SUFFIX and (version := newer_format(path)) is not None:
                raise self._newer(path, version)

    def _newer(self, path: Path, version: str | None) -> RunDirError:
        """The refusal of the checkpoint ``path`` of a newer senslab (format ``version``)."""
        form = f"checkpoint format {version}; " if version is not None else ""
        return RunDirError(
            f"{path} was written by a newer senslab ({form}this one reads checkpoint format "
            f"{VERSION} and older): the run in {self.path} went on under that version, and "
            "this one can neither resume it nor read its checkpoints. Upgrade senslab to use "
            "it, or choose another run directory (--out) to train the run anew; its checkpoints "
            "are left as they are")

    def _set_aside(self) -> None:
        """Move every checkpoint into a new ``checkpoints/unusable[-N]/`` folder (a run that
        starts over: none of them can be resumed from, and left in place they would outrank the
        new run's own — in pruning, and as its final model)."""
        if self.readonly:
            return
        listed = self.checkpoints()
        if not listed:
            return
        n = 1
        while (folder := self.ckpt_dir / ("unusable" if n == 1 else f"unusable-{n}")).exists():
            n += 1
        folder.mkdir()
        for path in listed:
            path.replace(folder / path.name)
            sidecar = path.with_suffix(".sha256")
            if sidecar.exists():
                sidecar.replace(folder / sidecar.name)
        _fsync_dir(self.ckpt_dir)
        notice(f"{self.ckpt_dir}: none of its {len(listed)} checkpoint(s) can be resumed from "
               f"(see the warnings above); moved them to {folder} and starting the run over "
               "(delete that folder once you no longer need them)")

    def latest_checkpoint(self, allow_unverified: bool = False) -> dict[str, Any] | None:
        """The newest checkpoint that verifies; damaged ones are reported and skipped."""
        found = self.load_latest(allow_unverified)
        return found[1] if found is not None else None

    def final_checkpoint(self, allow_unverified: bool = False
                         ) -> tuple[Path, dict[str, Any]] | None:
        """(path, state) of the checkpoint a finished run ended with — the model its
        ``summary.json`` describes — for measurements of the final model.

        That is the newest checkpoint, which must be at the step summary.json says the run
        finished at (``steps``; any step, for a summary without it). Unlike :meth:`load_latest`
        (right for resuming) nothing falls back to an earlier checkpoint: a damaged or missing
        final checkpoint is a :class:`RunDirError` naming the file and the fix. None for a run
        that finished at step 0 without a checkpoint (its final model is its initial one)."""
        self.check_readable()
        summary_path = self.path / "summary.json"
        if not summary_path.is_file():
            raise RunDirError(f"{self.path} has not finished (no summary.json), so it has no final "
                              "model yet; re-run the command that trained it to finish it")
        summary = self.read_json("summary.json")
        steps = summary.get("steps") if isinstance(summary, dict) else None
        if not isinstance(steps, int) or isinstance(steps, bool):
            steps = None
        found = self.checkpoints()
        newest = found[-1] if found else None
        at = f" (the run finished at step {steps})" if steps is not None else ""

        def fix(also: str = "") -> str:
            return (f"delete {summary_path}{also} and re-run the command that trained the run "
                    "(`senslab run` of its experiment, or `senslab train`): it resumes from its "
                    "last good checkpoint, retrains the rest and writes the final checkpoint "
                    "again")

        if newest is not None and steps is not None and checkpoint_step(newest) > steps:
            raise RunDirError(
                f"{self.ckpt_dir}: the newest checkpoint {newest.name} is past the step the run "
                f"finished at ({steps}, {summary_path.name}), so it is not this run's final "
                "model: checkpoints of another run were left in the directory (as when a run "
                f"started over there after config.json was lost); delete {self.path} and train "
                "the run again")
        if newest is None or (steps is not None and checkpoint_step(newest) < steps):
            if newest is None and not steps:
                return None
            name = f"step-{steps:08d}{SUFFIX}" if steps is not None else "any checkpoint"
            have = f"the newest is {newest.name}" if newest is not None else "it has none"
            raise RunDirError(
                f"{self.ckpt_dir}: the final checkpoint {name}{at} is missing ({have}), so the "
                "final model cannot be measured and an earlier one does not stand in for it; "
                + fix())
        try:
            state, _ = self._load(newest, allow_unverified)
        except ForeignCheckpointError as err:  # not damaged: deleting it would lose that run's
            raise RunDirError(str(err)) from None
        except NewerCheckpointError:
            raise self._newer(newest, newer_format(newest)) from None
        except CheckpointError as err:
            raise RunDirError(
                f"{err}: it is the final checkpoint of {self.path}{at}, so the final model "
                "cannot be measured and an earlier one does not stand in for it; "
                + fix(f" and {newest}")) from None
        return newest, state

    def reset(self) -> None:
        """Remove what a run wrote when it started (config, environment, metrics, summary,
        checkpoints), so that a new configuration can start in its place."""
        if self.readonly:
            return
        # checkpoints and summary first: a reset cut short never leaves them without config.json
        for path in self.checkpoints():
            path.unlink(missing_ok=True)
        for name in ("summary.json", "metrics.jsonl", "env.json", "config.json"):
            (self.path / name).unlink(missing_ok=True)


def load_model_state(model: torch.nn.Module, state: dict[str, Any], path: Path) -> None:
    """``model.load_state_dict(state)`` for the checkpoint ``path``; a checkpoint of another
    model (other sizes or parameters than the run's config.json builds) is a
    :class:`RunDirError` naming the file, the first mismatches and the fix, not torch's
    RuntimeError."""
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        lines = str(err).splitlines()
        if not lines or not lines[0].startswith("Error(s) in loading state_dict"):
            raise
        detail = [line.strip().rstrip(".") for line in lines[1:] if line.strip()]
        shown = "; ".join(d if len(d) < 240 else d[:237] + "…" for d in detail[:3])
        more = f"; and {len(detail) - 3} more" if len(detail) > 3 else ""
        run = Path(path).parent.parent
        raise RunDirError(
            f"{path} holds a model that does not match the one {run / 'config.json'} describes "
            f"({shown}{more}): the checkpoint was written for another model (config.json "
            "edited, or the checkpoint copied in from another run); restore config.json, point "
            f"at the run directory that wrote the checkpoint, or delete {run} and train it "
            "again") from None


#: the key a checkpoint records the metric log's length under (:meth:`RunDir.save_checkpoint`)
METRIC_RECORDS = "_metric_records"
#: the names of :meth:`RunDir.config_digests`: of config.json as written, and of its parsed JSON
RAW_DIGEST, CANONICAL_DIGEST = "config_sha256", "config_canonical_sha256"
#: the keys a checkpoint records its run's :meth:`RunDir.config_digests` under: one copied into
#: another run's directory was resumed without a word (a seed-1 checkpoint in a seed-0 run).
#: A checkpoint written before the canonical one was recorded holds the raw one only.
CONFIG_DIGEST = "_" + RAW_DIGEST
STATE_KEYS = {RAW_DIGEST: CONFIG_DIGEST, CANONICAL_DIGEST: "_" + CANONICAL_DIGEST}
#: how often :meth:`RunDir.load_latest` reads the list again when a checkpoint vanished
VANISHED_RETRIES = 5


def _digests_match(recorded: dict[str, Any], now: dict[str, str]) -> bool:
    """Whether the config.json digests ``recorded`` are of the config.json whose digests are
    ``now`` (:meth:`RunDir.config_matches`)."""
    return any(key in now and recorded.get(key) == now[key]
               for key in (RAW_DIGEST, CANONICAL_DIGEST))


def _own_file(name: str) -> bool:
    """Files senslab leaves in a directory it has not yet written a run to."""
    return name in (LOCK_FILE, OWNER_FILE) or (name.startswith(".") and ".tmp-" in name)
