"""Bad input and faults around run directories: nothing lost, nothing silently wrong.

Each case names the fault, then checks the error type, that the message names the field / value
/ file at fault and the fix (or the exact behaviour that replaces the error). Command-line cases
run a real ``senslab`` process and check a non-zero exit with one line and no traceback.

Names added by the fixes (``validate``, ``RunDirInUse``, ``TrainingInterrupted``, …) are
imported inside the tests, so that this file also runs against the code before them
(``tests/badinput/record_before.py`` counts the cases that failed there).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import typing
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cliproc
import pytest
import torch

from senslab.cli import main
from senslab.experiments import run_experiment
from senslab.train.config import RunConfig, apply_overrides, valid_keys
from senslab.train.loop import fit
from senslab.train.looprun import LoopRun
from senslab.train.rundir import RunDir, RunDirError
from senslab.train.trainers import get_trainer, list_trainers, train_run

# the CLI runs in the child as it would for a user; PYTHONPATH is inherited (record_before.py
# points it at the old code), tracebacks stay hidden unless asked for
ENV = {k: v for k, v in os.environ.items() if k != "SENSLAB_DEBUG"} | {"OMP_NUM_THREADS": "1"}
MLP = ["model.name=mlp", "data.name=digits", "track.num_examples=32"]
# the demo experiment in seconds (the old code trains it where the new one refuses to)
FAST_DEMO = ["train.epochs=1", "data.train_subset=200", "track.num_examples=16",
             "track.eval_examples=100"]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    """In-process training on one thread, as the subprocesses (``--threads 1``): these models
    are tiny, and a second thread only fights other work for the two cores (conftest restores
    the count afterwards)."""
    torch.set_num_threads(1)


def tiny(epochs: int = 2, extra: list[str] | None = None) -> RunConfig:
    """mlp on digits: 15 steps of 100 examples per epoch, a checkpoint after each."""
    return apply_overrides(RunConfig(name="tiny"), MLP + [f"train.epochs={epochs}"]
                           + (extra or []))


def train_cmd(out: Path, *sets: str) -> list[str]:
    """The arguments of ``senslab train`` for the mlp on digits into ``out``."""
    args = ["train", "--model", "mlp", "--data", "digits", "--out", str(out), "--threads", "1"]
    for s in sets:
        args += ["--set", s]
    return args


def popen(args: list[str], cwd: Path, name: str) -> cliproc.Process:
    """Start the command ``senslab ARGS`` in its own process (``tests/cliproc.py``); its stdout
    and stderr go to files (a full pipe would block the child), read back with :func:`output`."""
    out, err = (open(cwd / f"{name}.{s}", "w") for s in ("out", "err"))  # noqa: SIM115
    with out, err:
        return cliproc.start(args, cwd=cwd, env=ENV, stdout=out, stderr=err)


def output(proc: cliproc.Process, cwd: Path, name: str) -> tuple[int, str, str]:
    code = proc.wait(timeout=300)
    return code, (cwd / f"{name}.out").read_text(), (cwd / f"{name}.err").read_text()


def checkpoint_files(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("step-*")) if (run / "checkpoints").exists() else []


def wait_for_checkpoints(proc: cliproc.Process, run: Path, n: int) -> None:
    deadline = time.time() + 60
    while len([p for p in checkpoint_files(run) if not p.name.endswith(".sha256")]) < n:
        assert proc.poll() is None, "the run ended before it wrote its checkpoints"
        assert time.time() < deadline, "no checkpoint within 60 s"
        time.sleep(0.01)


def steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_one_line_error(stderr: str, *needles: str) -> None:
    assert "Traceback" not in stderr, stderr
    for needle in needles:
        assert needle in stderr, f"{needle!r} not in {stderr!r}"


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    rd = RunDir(run)
    return RunDir.load_checkpoint(rd.checkpoints()[-1])["model"]


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- configuration values out of range ---------------------------------------------------------

# (override, the valid range or choices the message must state); every numeric field of the
# config appears at least once (checked by test_every_numeric_field_declares_a_range)
OUT_OF_RANGE = [
    ("train.epochs=-1", "≥ 1"), ("train.epochs=0", "≥ 1"),
    ("train.batch_size=-5", "≥ 1"), ("train.batch_size=0", "≥ 1"),
    ("train.max_steps=0", "≥ 1"), ("train.target_train_acc=1.5", "in [0, 1]"),
    ("train.reg_alpha=2", "in [0, 1]"), ("train.reg_sigma=-1", "≥ 0"),
    ("train.reg_patch=0", "≥ 1"), ("train.checkpoint_every=-1", "≥ 0"),
    ("train.keep_checkpoints=-1", "≥ 0"), ("train.eval_batch_size=0", "≥ 1"),
    ("track.every=0", "≥ 1"), ("track.sigma=-0.1", "≥ 0"), ("track.repeats=0", "≥ 1"),
    ("track.num_examples=0", "≥ 1"), ("track.chunk_size=0", "≥ 1"),
    ("track.sharpness_sigma=0", "> 0"), ("track.loss_sharpness_sigma=-1", "> 0"),
    ("track.eval_examples=0", "≥ 1"), ("data.train_subset=0", "≥ 1"),
    ("optim.lr=0", "> 0"), ("optim.lr=1e999", "> 0"), ("optim.momentum=1", "in [0, 1)"),
    ("optim.weight_decay=-0.1", "≥ 0"), ("optim.eta_max=0", "> 0"),
    ("optim.step_epochs=0", "≥ 1"), ("optim.gamma=0", "> 0"), ("seed=-1", "in [0, 4294967296)"),
    ("optim.name=sgdd", "one of sgd, adam, adamw, ngd, sngd, sps"),
    ("optim.schedule=linear", "one of constant, step, cosine"),
    ("train.loss=hinge", "one of auto, ce, bce, mse"),
    ("train.regularizer=dropout", "one of none, noise, patch_mse"),
    ("track.unit=batch", "one of epoch, step"),
    ("device=gpu", "auto, cpu, cuda, cuda:N or mps"),
]


@pytest.mark.parametrize(("override", "valid"), OUT_OF_RANGE, ids=[o for o, _ in OUT_OF_RANGE])
def test_config_value_out_of_range(override: str, valid: str) -> None:
    key, value = override.split("=")
    with pytest.raises(ValueError) as err:
        apply_overrides(RunConfig(), [override])
    msg = str(err.value)
    assert msg.startswith(f"{key} must be") and valid in msg
    got = msg.split(", got ", 1)[1]
    assert value.strip("'") in got or (value == "1e999" and got == "inf")


def _numeric_fields(cfg: Any, prefix: str = "") -> list[tuple[str, dataclasses.Field[Any]]]:
    out = []
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out += _numeric_fields(value, f"{prefix}{f.name}.")
        elif {int, float} & set(typing.get_args(hints[f.name]) or (hints[f.name],)):
            out.append((f"{prefix}{f.name}", f))
    return out


def test_every_numeric_field_declares_a_range() -> None:
    fields = _numeric_fields(RunConfig())
    undeclared = [key for key, f in fields if "range" not in f.metadata]
    assert not undeclared, f"numeric config fields without a declared range: {undeclared}"
    tested = {o.split("=")[0] for o, _ in OUT_OF_RANGE}
    assert {key for key, _ in fields} <= tested, "a numeric field has no out-of-range case"
    assert set(valid_keys(RunConfig())) >= tested


def test_validate_checks_a_config_built_in_code(tmp_path: Path) -> None:
    from senslab.train.config import validate

    cfg = tiny()
    cfg.train.batch_size = 0  # not through set_option
    with pytest.raises(ValueError, match=r"train.batch_size must be ≥ 1, got 0"):
        validate(cfg)
    with pytest.raises(ValueError, match=r"train.batch_size must be ≥ 1, got 0"):
        fit(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists(), "a rejected config must write nothing"


# the bad values of the report: today's command line trains nothing and says "finished", or
# fails with a traceback and leaves a directory that refuses the corrected command
CLI_BAD = ["train.epochs=-1", "train.batch_size=-5", "train.max_steps=0", "train.batch_size=0",
           "track.every=0", "data.train_subset=0", "track.num_examples=0"]


@pytest.mark.parametrize("override", CLI_BAD)
def test_cli_rejects_bad_value_then_corrected_command_succeeds(
        override: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    base = ["train", "--model", "mlp", "--data", "digits", "--out", str(out),
            "--set", "train.epochs=1", "--set", "track.num_examples=32"]
    assert main(base + ["--set", override]) != 0
    key, value = override.split("=")
    err = capsys.readouterr().err
    assert f"{key} must be ≥ 1, got {value}" in err and len(err.strip().splitlines()) == 1
    assert not (out / "config.json").exists()
    assert main(base) == 0, capsys.readouterr().err  # the corrected command is not blocked
    assert (out / "summary.json").exists()


def test_cli_bad_value_in_a_real_process(tmp_path: Path) -> None:
    # the interpreter's own start, ``python -m senslab.cli`` (the others fork a started one)
    r = subprocess.run([sys.executable, "-m", "senslab.cli",
                        *train_cmd(tmp_path / "run", "train.epochs=-1")], cwd=tmp_path, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert_one_line_error(r.stderr, "train.epochs must be ≥ 1, got -1")
    assert not (tmp_path / "run" / "summary.json").exists()


def test_unavailable_device_names_the_fix(tmp_path: Path) -> None:
    from senslab.train.loop import resolve_device

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="CUDA is not available.*device=cpu"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="device=cpu"):
        fit(tiny(extra=["device=cuda:0"]), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


# -- a start that failed never blocks the corrected command ------------------------------------


def test_failed_start_is_replaced_by_the_corrected_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    from senslab.train import track

    def boom(self: Any, loss_kind: str) -> dict[str, Any]:
        raise RuntimeError("tracking failed")

    with monkeypatch.context() as m:  # fails after config.json and env.json are written
        m.setattr(track.Tracker, "measure", boom)
        with pytest.raises(RuntimeError, match="tracking failed"):
            fit(tiny(), tmp_path, progress=False)
    assert (tmp_path / "config.json").exists()
    summary = fit(tiny(extra=["optim.lr=0.05"]), tmp_path, progress=False)
    assert "stopped before its first checkpoint" in capfd.readouterr().err
    assert summary["steps"] == 30
    assert RunDir(tmp_path).read_json("config.json")["optim"]["lr"] == 0.05


def test_nan_loss_keeps_its_hint_and_the_corrected_lr_runs(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(FloatingPointError, match=r"became nan; lower optim.lr \(now 1e\+30\)"):
        fit(tiny(extra=["optim.lr=1e30"]), tmp_path, progress=False)
    assert fit(tiny(), tmp_path, progress=False)["steps"] == 30


# -- damaged JSON, foreign directories, read-only directories ----------------------------------


def test_truncated_config_json_names_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from senslab.report import load_runs

    fit(tiny(), tmp_path / "run", progress=False)
    cfg_file = tmp_path / "run" / "config.json"
    cfg_file.write_text(cfg_file.read_text()[:200])
    with pytest.raises(ValueError, match=r"config.json is not valid JSON.*restore it"):
        fit(tiny(), tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        load_runs([tmp_path / "run"])
    assert main(["measure", "--checkpoint", str(tmp_path / "run")]) != 0
    assert_one_line_error(capsys.readouterr().err, "config.json", "not valid JSON")


def test_a_truncated_summary_is_rewritten_by_its_own_advice(tmp_path: Path) -> None:
    """summary.json damaged after training: the error's fix (delete the file, re-run) keeps the
    training — the run resumes from its last checkpoint and writes the same summary."""
    run = tmp_path / "run"
    first = fit(tiny(), run, progress=False)
    log = (run / "metrics.jsonl").read_text()
    summary = run / "summary.json"
    summary.write_text(summary.read_text()[:40])
    with pytest.raises(ValueError, match=r"summary.json is not valid JSON.*delete this file and "
                                         r"re-run.*keeping the training"):
        fit(tiny(), run, progress=False)
    summary.unlink()
    again = fit(tiny(), run, progress=False)
    assert again["final"] == first["final"]
    assert (run / "metrics.jsonl").read_text() == log


def _foreign(tmp_path: Path) -> Path:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "metrics.jsonl").write_text("my own numbers\n")
    return d


# every writer of a run or experiment directory, called on directory ``d``
def _fit(d: Path) -> Any:
    return fit(tiny(), d, progress=False)


def _loop_run(d: Path) -> Any:
    with LoopRun(d, {"lr": 0.1}) as run:
        return run.restore()


def _trainer(name: str) -> Any:
    def train(d: Path) -> Any:
        return train_run(name, get_trainer(name).example(), d, progress=False,
                         log=lambda _: None)

    return train


def _run_experiment(d: Path) -> Any:
    return run_experiment("demo", d, overrides=FAST_DEMO, log=lambda _: None)


FOREIGN_WRITERS = {"fit": _fit, "LoopRun": _loop_run, "run_experiment": _run_experiment}


@pytest.mark.parametrize("writer", sorted(FOREIGN_WRITERS))
def test_foreign_nonempty_out_is_refused(writer: str, tmp_path: Path) -> None:
    d = _foreign(tmp_path)
    with pytest.raises(ValueError) as err:
        FOREIGN_WRITERS[writer](d)
    msg = str(err.value)
    assert str(d) in msg and "is not empty" in msg and "metrics.jsonl" in msg
    assert "choose an empty or new directory" in msg
    assert (d / "metrics.jsonl").read_text() == "my own numbers\n"
    assert sorted(p.name for p in d.iterdir()) == ["metrics.jsonl"]


def test_run_and_experiment_directories_are_not_mixed_up(tmp_path: Path) -> None:
    fit(tiny(epochs=1), tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match="is a senslab run directory, not an? experiment"):
        run_experiment("demo", tmp_path / "run", overrides=FAST_DEMO, log=lambda _: None)
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "experiment.json").write_text('{"name": "demo", "runs": []}')
    with pytest.raises(ValueError, match="is a senslab experiment directory, not a run"):
        fit(tiny(), tmp_path / "exp", progress=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        fit(tiny(), tmp_path / "file", progress=False)


def test_read_only_out_is_a_clear_permission_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root can write a read-only directory")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match=f"cannot write to {ro / 'run'}|{ro}"):
            fit(tiny(), ro / "run", progress=False)
    finally:
        ro.chmod(0o700)


# -- one writer at a time -----------------------------------------------------------------------

_HOLDER = """
import sys, time
from senslab.train.rundir import RunDir
for kind, path in zip(sys.argv[1::2], sys.argv[2::2]):
    RunDir(path, kind=kind).acquire()
print("locked", flush=True)
time.sleep(300)
"""

# writer → the kind of directory it writes, and the writer
LOCKED_WRITERS: dict[str, tuple[str, Any]] = {
    "fit": ("run", _fit), "LoopRun": ("run", _loop_run),
    **{f"trainer_{name}": ("run", _trainer(name)) for name in list_trainers() if name != "fit"},
    "run_experiment": ("experiment", _run_experiment),
}


@pytest.fixture(scope="module")
def holder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One other process holding the lock of one directory per writer of LOCKED_WRITERS."""
    root = tmp_path_factory.mktemp("locked")
    dirs = {name: root / name.replace(".", "_") for name in LOCKED_WRITERS}
    args = [a for name, (kind, _) in LOCKED_WRITERS.items() for a in (kind, str(dirs[name]))]
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, *args], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if line.strip() != "locked":
        proc.kill()
        pytest.fail(f"the lock holder did not start: {proc.communicate()}")
    yield proc, dirs
    proc.kill()
    proc.communicate()  # closes the pipes: left to the garbage collector, they warn in a later test


@pytest.mark.parametrize("writer", list(LOCKED_WRITERS))
def test_second_writer_fails_at_once(writer: str, holder: Any) -> None:
    proc, dirs = holder
    d = dirs[writer]
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        LOCKED_WRITERS[writer][1](d)
    msg = str(err.value)
    assert f"{d} is in use by another senslab process (pid {proc.pid} on host" in msg
    assert "wait for it to finish, or use another --out" in msg
    assert time.perf_counter() - start < 10, "the second writer must not wait"
    assert not (d / "config.json").exists() and not (d / "metrics.jsonl").exists()


@pytest.mark.heavy
def test_two_real_train_processes_one_wins(tmp_path: Path) -> None:
    from senslab.report import load_runs

    run = tmp_path / "run"
    # 15 epochs, ~4 s: the loser starts (a fork) and fails well within the winner's run
    cmd = train_cmd(run, "train.epochs=15", "train.batch_size=20")
    procs = [popen(cmd, tmp_path, "a"), popen(cmd, tmp_path, "b")]
    first_exit = None
    while any(p.poll() is None for p in procs):
        if first_exit is None and any(p.poll() is not None for p in procs):
            first_exit = next(p for p in procs if p.poll() is not None)
            other = next(p for p in procs if p is not first_exit)
            assert other.poll() is None, "both ended together: the runs did not overlap"
        time.sleep(0.01)
    results = [output(p, tmp_path, name) for p, name in zip(procs, "ab", strict=True)]
    codes = sorted(code for code, _, _ in results)
    assert codes[0] == 0 and codes[1] != 0, results
    loser = next(r for r in results if r[0] != 0)
    assert first_exit is not None and first_exit.returncode != 0, "the loser must fail at once"
    assert_one_line_error(loser[2], f"{run} is in use by another senslab process", "pid ",
                          "use another --out")
    got = steps(run)
    assert got == sorted(set(got)), f"duplicated or out-of-order steps: {got}"
    assert load_runs([run])[0].summary is not None


@pytest.mark.heavy
def test_sigkilled_holder_releases_the_lock_and_the_rerun_resumes(tmp_path: Path) -> None:
    from senslab.report import load_runs

    run = tmp_path / "run"
    cmd = train_cmd(run, "train.epochs=10", "train.batch_size=20")
    proc = popen(cmd, tmp_path, "killed")
    wait_for_checkpoints(proc, run, 2)
    # while it trains: readers are not blocked, a second writer is refused at once
    assert RunDir(run).latest_checkpoint() is not None
    assert load_runs([run])[0].summary is None
    with pytest.raises(ValueError, match="in use by another senslab process"):
        fit(tiny(), run, progress=False)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run / "summary.json").exists(), "the run finished before it was killed"
    r = cliproc.run(cmd, cwd=tmp_path, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"resuming {run} from step" in r.stderr and "(checkpoint step-" in r.stderr
    got = steps(run)
    assert got == sorted(set(got)) and got[-1] == 10 * 72  # 1438 digits / 20 → 72 steps
    assert json.loads((run / "summary.json").read_text())["steps"] == 10 * 72


def test_sigint_in_a_real_process_says_how_to_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = popen(train_cmd(run, "train.epochs=40", "train.batch_size=20"), tmp_path, "int")
    wait_for_checkpoints(proc, run, 1)
    proc.send_signal(signal.SIGINT)
    code, _, err = output(proc, tmp_path, "int")
    assert code != 0
    assert_one_line_error(err, "interrupted at step", "re-run the same command to resume")
    assert not (run / ".senslab.owner").exists()


def test_interrupt_releases_the_lock_and_resume_is_bit_identical(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    from senslab.train import loop
    from senslab.train.loop import TrainingInterrupted

    fit(tiny(epochs=3), tmp_path / "ref", progress=False)
    real, calls = loop._train_step, []

    def step_then_ctrl_c(*args: Any) -> float:
        calls.append(1)
        if len(calls) == 40:  # during step 40: steps 1-39 done, checkpoint at 30
            raise KeyboardInterrupt
        return real(*args)

    run = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(loop, "_train_step", step_then_ctrl_c)
        with pytest.raises(TrainingInterrupted) as err:
            fit(tiny(epochs=3), run, progress=False)
    assert isinstance(err.value, KeyboardInterrupt) and err.value.step == 39
    assert str(err.value).startswith("interrupted at step 39; re-run the same command to resume")
    assert "step 30" in str(err.value)
    assert not RunDir(run).holds_lock() and not (run / ".senslab.owner").exists()
    capfd.readouterr()
    fit(tiny(epochs=3), run, progress=False)
    assert f"resuming {run} from step 30 (checkpoint step-00000030.safetensors)" in \
        capfd.readouterr().err
    assert same_weights(final_weights(run), final_weights(tmp_path / "ref"))
    assert steps(run) == steps(tmp_path / "ref") == [0, 15, 30, 45]


def test_ctrl_c_inside_a_finalizer_still_stops_training(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT that lands while a weakref finalizer runs (an object dying mid-step, as the
    tracked sensitivity's memory bookkeeping does) would raise its KeyboardInterrupt there, and
    Python would swallow it ("Exception ignored" and a traceback): the handler records it there
    without raising, and training must stop all the same, at the end of that step. Without the
    check it ran to its end (a flaky CLI Ctrl-C test caught it in CI)."""
    import weakref

    from senslab.train import loop
    from senslab.train.loop import TrainingInterrupted

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed from the main thread only")
    real, calls = loop._train_step, []

    def ctrl_c_in_a_finalizer() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # the handler runs here, inside the finalizer
            pass

    def step(*args: Any) -> float:
        calls.append(1)
        if len(calls) == 20:
            dying = type("Dying", (), {})()
            weakref.finalize(dying, ctrl_c_in_a_finalizer)
            del dying  # the finalizer runs now, and the Ctrl-C lands in it
        return real(*args)

    swallowed: list[type] = []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with monkeypatch.context() as m:
            m.setattr(loop, "_train_step", step)
            m.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))
            with pytest.raises(TrainingInterrupted) as err:
                fit(tiny(epochs=3), tmp_path / "run", progress=False)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, previous)
    assert err.value.step == 20 and len(calls) == 20
    assert swallowed == []  # nothing raised inside the finalizer: no "Exception ignored" print


def test_orphan_temp_files_of_dead_writers_are_removed(tmp_path: Path) -> None:
    fit(tiny(), tmp_path, progress=False)
    orphans = [tmp_path / "checkpoints" / ".step-00000099.safetensors.tmp-999999",
               tmp_path / ".metrics.jsonl.tmp-999999"]
    for f in orphans:
        f.write_bytes(b"half a file")
    fit(tiny(), tmp_path, progress=False)  # finished: reused, but the writer took the lock
    assert not any(f.exists() for f in orphans)


# -- checkpoints -------------------------------------------------------------------------------


def _flip(path: Path, at: int, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for i in range(at, at + n):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_bytes_in_a_checkpoint_are_detected(tmp_path: Path) -> None:
    fit(tiny(epochs=3, extra=["train.keep_checkpoints=3"]), tmp_path, progress=False)
    rd = RunDir(tmp_path)
    newest = rd.checkpoints()[-1]
    _flip(newest, len(newest.read_bytes()) - 4096)  # inside the tensors, not the header
    with pytest.raises(ValueError, match=f"{newest} does not match its checksum"):
        RunDir.load_checkpoint(newest)
    with pytest.warns(UserWarning, match="falling back to the previous checkpoint"):
        state = rd.latest_checkpoint()
    assert state is not None and state["position"]["step"] == 30


def _legacy_checkpoint(path: Path, state: Any, sidecar: bool = True) -> None:
    """A checkpoint as senslab wrote it before the safetensors format: torch.save + sidecar."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    if sidecar:
        path.with_suffix(".sha256").write_text(hashlib.sha256(path.read_bytes()).hexdigest())


def test_legacy_checkpoint_with_flipped_bytes_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints" / "step-00000010.pt"
    _legacy_checkpoint(path, {"model": {"w": torch.arange(4096.0)}})
    _flip(path, len(path.read_bytes()) // 2)
    with pytest.raises(ValueError, match="does not match its checksum"):
        RunDir.load_checkpoint(path)


def test_legacy_checkpoint_without_sidecar_is_refused_unless_trusted(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints" / "step-00000010.pt"
    _legacy_checkpoint(path, {"model": {"w": torch.arange(8.0)}}, sidecar=False)
    with pytest.raises(ValueError, match="cannot be verified.*allow_unverified=True"):
        RunDir.load_checkpoint(path)
    with pytest.warns(UserWarning, match="cannot be verified"):
        assert RunDir(tmp_path).latest_checkpoint() is None
    state = RunDir.load_checkpoint(path, allow_unverified=True)
    assert torch.equal(state["model"]["w"], torch.arange(8.0))


def test_checkpoint_without_digest_is_refused_unless_trusted(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "checkpoints" / "step-00000010.safetensors"
    path.parent.mkdir(parents=True)
    save_file({"w": torch.arange(8.0)}, str(path), metadata={
        "format": "senslab-checkpoint", "version": "1",
        "structure": json.dumps({"dict": [["w", {"tensor": "w"}]]})})
    with pytest.raises(ValueError, match="carries no checksum.*allow_unverified=True"):
        RunDir.load_checkpoint(path)
    assert torch.equal(RunDir.load_checkpoint(path, allow_unverified=True)["w"],
                       torch.arange(8.0))


class _RunsCode:
    """Unpickling this runs ``exec``: what a checkpoint from elsewhere could do."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.target)!r}, 'w').close()",))


@pytest.mark.parametrize("sidecar", [True, False], ids=["with-sidecar", "without-sidecar"])
def test_pickle_checkpoint_never_executes_code(tmp_path: Path, sidecar: bool) -> None:
    pwned = tmp_path / "pwned"
    path = tmp_path / "run" / "checkpoints" / "step-00000001.pt"
    _legacy_checkpoint(path, {"model": _RunsCode(pwned)}, sidecar=sidecar)
    for trust in ({}, {"allow_unverified": True}):
        with pytest.raises(ValueError, match=str(path)):
            RunDir.load_checkpoint(path, **trust)
        assert not pwned.exists(), "loading a checkpoint executed code from it"
    with pytest.warns(UserWarning):
        assert RunDir(tmp_path / "run").latest_checkpoint() is None
    assert not pwned.exists()


ROUND_TRIP = [(o, s) for o in ("sgd", "adam", "adamw", "ngd", "sngd")
              for s in ("constant", "step", "cosine")] + [("sps", "constant")]


def _same(a: Any, b: Any) -> bool:
    """Equal in value *and* type: int keys, tuples, None, bools, float bits (nan, -0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) ==
                                                      math.copysign(1, b))
    if isinstance(a, dict):
        return (list(a) == list(b) and all(type(x) is type(y) for x, y in zip(a, b, strict=True))
                and all(_same(a[k], b[k]) for k in a)
                and _same(getattr(a, "_metadata", None), getattr(b, "_metadata", None)))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize(("optim", "schedule"), ROUND_TRIP,
                         ids=[f"{o}-{s}" for o, s in ROUND_TRIP])
def test_checkpoint_round_trip_is_exact(optim: str, schedule: str, tmp_path: Path) -> None:
    from senslab.train.loop import build_optimizer, build_scheduler

    extra = {"sgd": ["optim.momentum=0.9"], "ngd": ["optim.eta_max=0.5"],
             "sps": ["optim.eta_max=1.0"]}.get(optim, [])
    cfg = apply_overrides(RunConfig(), [f"optim.name={optim}", f"optim.schedule={schedule}",
                                        "optim.lr=0.01", "optim.step_epochs=1"] + extra)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),
                                torch.nn.Linear(3, 3))
    opt = build_optimizer(cfg, model)
    sched = build_scheduler(cfg, opt)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    for _ in range(3):
        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss
        if optim == "sps":
            opt.step(closure)
        else:
            closure()
            opt.step()
        if sched is not None:
            sched.step()
    state = {
        "model": model.state_dict(), "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict() if sched is not None else None,
        "torch_rng": torch.get_rng_state(), "cuda_rng": None,
        "reg_rng": torch.Generator().manual_seed(7).get_state(),
        "position": {"epoch": 1, "batch": 2, "step": 3}, "time": 1.25,
        "odd": {3: (1, [2.5, None, True]), "inf": math.inf, "-inf": -math.inf, "nan": math.nan,
                "neg0": -0.0, "big": 2**70, "empty": torch.zeros(0, 2),
                "od": OrderedDict(a=torch.ones(2, dtype=torch.bfloat16))},
    }
    rd = RunDir(tmp_path)
    path = rd.save_checkpoint(state, 3)
    assert path is not None
    back = RunDir.load_checkpoint(path)
    assert _same(state, back)
    fresh = build_optimizer(cfg, model)
    fresh.load_state_dict(back["optimizer"])
    assert _same(opt.state_dict(), fresh.state_dict())
    if sched is not None:
        again = build_scheduler(cfg, fresh)
        again.load_state_dict(back["scheduler"])
        assert _same(sched.state_dict(), again.state_dict())


def test_tied_weights_are_saved_and_restored(tmp_path: Path) -> None:
    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight  # tied, as in a language model
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    path = RunDir(tmp_path).save_checkpoint({"model": model.state_dict()}, 1)
    assert path is not None
    back = RunDir.load_checkpoint(path)["model"]
    assert torch.equal(back["emb.weight"], emb.weight) and torch.equal(back["head.weight"],
                                                                      emb.weight)


# -- schema versions ---------------------------------------------------------------------------


def _write_marker(d: Path, kind: str, schema: int) -> None:
    (d / "senslab.json").write_text(json.dumps({"kind": kind, "schema": schema,
                                                "senslab": "9.0"}))


def test_newer_schema_is_refused_by_writers_and_readers(tmp_path: Path) -> None:
    from senslab.report import load_runs

    fit(tiny(epochs=1), tmp_path / "run", progress=False)
    _write_marker(tmp_path / "run", "run", 3)
    needle = r"written by a newer senslab \(schema 3.*upgrade senslab"
    with pytest.raises(ValueError, match=needle):
        fit(tiny(epochs=1), tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match=needle):
        load_runs([tmp_path / "run"])
    with pytest.raises(ValueError, match=needle):
        RunDir(tmp_path / "run").latest_checkpoint()
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "experiment.json").write_text('{"name": "demo", "runs": []}')
    _write_marker(exp, "experiment", 3)
    with pytest.raises(ValueError, match=needle):
        run_experiment("demo", exp, overrides=FAST_DEMO, log=lambda _: None)
    with pytest.raises(ValueError, match=needle):
        load_runs([exp])


def _make_legacy(run: Path) -> None:
    """Turn a run directory into what senslab wrote before schema 2: no marker, ``.pt``
    checkpoints with ``.sha256`` sidecars."""
    (run / "senslab.json").unlink(missing_ok=True)
    for path in sorted((run / "checkpoints").glob("step-*.safetensors")):
        _legacy_checkpoint(path.with_suffix(".pt"), RunDir.load_checkpoint(path))
        path.unlink()


def test_old_schema_is_read_as_is_and_migrated_when_resumed(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from senslab.report import load_runs

    cfg = tiny(epochs=3, extra=["train.keep_checkpoints=5"])
    fit(cfg, tmp_path / "ref", progress=False)
    run = tmp_path / "old"
    shutil.copytree(tmp_path / "ref", run)
    _make_legacy(run)
    # an interrupted old run: the last checkpoint and the summary were never written
    (run / "checkpoints" / "step-00000045.pt").unlink()
    (run / "checkpoints" / "step-00000045.sha256").unlink()
    (run / "summary.json").unlink()
    before = sorted(p.name for p in run.rglob("*"))
    # reading it (report, measure) works and writes nothing
    assert RunDir(run).latest_checkpoint()["position"]["step"] == 30
    assert load_runs([run])[0].metrics[-1]["step"] == 45
    assert sorted(p.name for p in run.rglob("*")) == before
    capfd.readouterr()
    fit(cfg, run, progress=False)  # resuming migrates it
    err = capfd.readouterr().err
    assert f"{run}: upgraded a run directory of an older senslab to schema 2" in err
    assert "2 checkpoint(s) converted" in err and f"resuming {run} from step 30" in err
    assert json.loads((run / "senslab.json").read_text())["schema"] == 2
    left = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert not any(n.endswith((".pt", ".sha256")) for n in left), left
    assert same_weights(final_weights(run), final_weights(tmp_path / "ref"))
    assert steps(run) == steps(tmp_path / "ref")


def test_reproduction_records_carry_a_schema(tmp_path: Path) -> None:
    from senslab.reproduction import load_records

    rec = {"name": "demo", "scale": "cpu", "runs": 3, "verdict": "holds", "reason": "r"}
    (tmp_path / "demo.json").write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
    assert load_records(tmp_path)["demo"]["schema"] == 1  # no field: schema 1, same fields
    (tmp_path / "demo.json").write_text(json.dumps(rec | {"schema": 99}))
    with pytest.raises(ValueError, match=r"demo.json was written by a newer senslab.*upgrade"):
        load_records(tmp_path)


def test_committed_reproduction_records_carry_the_schema() -> None:
    from senslab.reproduction import RECORD_SCHEMA

    root = Path(__file__).resolve().parents[2] / "reproduction"
    if not root.is_dir():
        pytest.skip("no records in this checkout")
    for path in root.glob("*.json"):
        assert json.loads(path.read_text()).get("schema") == RECORD_SCHEMA, path


# -- a metric log written by two processes ------------------------------------------------------

BAD_LOGS = {"duplicated step": 30, "step out of order": 15}


@pytest.mark.parametrize("case", list(BAD_LOGS))
def test_report_refuses_duplicated_or_out_of_order_steps(
        case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from senslab.report import load_runs

    fit(tiny(), tmp_path / "run", progress=False)  # logs steps 0, 15, 30
    metrics = tmp_path / "run" / "metrics.jsonl"
    with open(metrics, "a") as f:
        f.write(json.dumps({"step": BAD_LOGS[case], "epoch": 1.0, "train/loss": 0.1}) + "\n")
    how = "repeats" if case == "duplicated step" else "goes back to"
    needle = f"{metrics}: line 4 {how} step {BAD_LOGS[case]} after step 30"
    with pytest.raises(ValueError) as err:
        load_runs([tmp_path / "run"])
    assert needle in str(err.value)
    assert main(["report", str(tmp_path / "run")]) != 0
    assert_one_line_error(capsys.readouterr().err, needle)


@pytest.mark.heavy
def test_an_experiment_directory_keeps_no_verdict_of_other_runs(tmp_path: Path) -> None:
    """Another experiment into a finished experiment's directory is refused before anything is
    written; the same experiment with other settings, stopped before its verdict, leaves no
    verdict.json of the old settings (which `senslab report`/`reproduction` would take for the
    new runs'): it is moved to verdict.superseded.json. Stopped before any new run wrote a
    file, the directory is as the verdict describes it: the verdict is put back."""
    from senslab.experiments.base import SUPERSEDED

    exp = tmp_path / "exp"
    first = run_experiment("demo", exp, overrides=[*FAST_DEMO, "seeds=1"], log=lambda _: None)
    before = {p.name: p.read_bytes() for p in exp.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match=r"holds the runs of experiment 'demo', not 'ib_joint'"
                                         r".*choose another --out"):
        run_experiment("ib_joint", exp, overrides=["steps=20", "seeds=1"], log=lambda _: None)
    assert {p.name: p.read_bytes() for p in exp.iterdir() if p.is_file()} == before

    def stop_at(start: str) -> Callable[[str], None]:
        def stop(line: str) -> None:
            if line.startswith(start):
                raise KeyboardInterrupt
        return stop

    # runs 1-3 are the finished seed-0 runs, reused; run 4 is the first new one
    with pytest.raises(KeyboardInterrupt):
        run_experiment("demo", exp, overrides=[*FAST_DEMO, "seeds=2"], log=stop_at("[2/"))
    assert json.loads((exp / "verdict.json").read_text()) == first  # nothing trained
    assert not (exp / SUPERSEDED).exists()
    with pytest.raises(KeyboardInterrupt):
        run_experiment("demo", exp, overrides=[*FAST_DEMO, "seeds=2"], log=stop_at("[5/"))
    assert not (exp / "verdict.json").exists()  # run 4 trained: the old verdict is set aside
    assert json.loads((exp / SUPERSEDED).read_text()) == first
    again = run_experiment("demo", exp, overrides=[*FAST_DEMO, "seeds=2"], log=lambda _: None)
    assert json.loads((exp / "verdict.json").read_text()) == again


def test_a_frame_inside_a_finalizer_or_del_is_told_apart() -> None:
    """The SIGINT handler raises nothing where Python would swallow the exception (a weakref
    finalizer, a ``__del__``), and raises everywhere else."""
    import weakref

    from senslab._sigint import _in_finalizer

    seen: list[bool] = []

    class Dying:
        def __del__(self) -> None:
            seen.append(_in_finalizer(sys._getframe()))

    Dying()  # dies at once: __del__
    other = type("Other", (), {})()
    weakref.finalize(other, lambda: seen.append(_in_finalizer(sys._getframe())))
    del other
    assert seen == [True, True] and not _in_finalizer(sys._getframe())


def test_a_damaged_experiment_json_is_refused_not_read_as_no_experiment(tmp_path: Path) -> None:
    """experiment.json names the experiment whose runs a directory holds: damaged, it was read
    as "none", and another experiment trained into the directory beside the first one's runs
    (moving their verdict aside)."""
    exp = tmp_path / "exp"
    exp.mkdir()
    whole = json.dumps({"name": "demo", "runs": ["vit-s0"]})
    (exp / "experiment.json").write_text(whole[:20])
    (exp / "verdict.json").write_text(json.dumps({"verdict": "supported"}))
    before = {p.name: p.read_bytes() for p in exp.iterdir()}
    with pytest.raises(RunDirError, match=r"experiment\.json cannot be read \(JSONDecodeError"
                                          r".*restore it, or choose another --out"):
        run_experiment("ib_joint", exp, overrides=["steps=20", "seeds=1"], log=lambda _: None)
    after = {p.name: p.read_bytes() for p in exp.iterdir()}
    assert {k: after.get(k) for k in before} == before  # nothing moved or rewritten
    assert set(after) - set(before) <= {".senslab.lock", "senslab.json"}  # no run trained
