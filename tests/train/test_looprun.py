"""LoopRun, the run directory of a trainer's own loop: what a run writes when it starts, logs,
checkpoints and finishes; when a directory is reused, resumed, started over or refused."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
import torch
from newer_checkpoint import rewrite_as_newer

from senslab.train.looprun import (
    LoopRun,
    generator_states,
    set_generator_states,
    single_thread,
)
from senslab.train.rundir import RunDir


def _train(path: Path, config: dict, stop_after: int | None = None,
           ctrl_c_after: int | None = None, epochs: bool = False) -> dict | None:
    """A toy loop: 6 steps of a random walk from a generator, a record and a checkpoint every 2
    steps; ``stop_after`` leaves the block after that many steps, as a killed process would;
    ``ctrl_c_after`` sends this process a real SIGINT after that many steps. ``epochs``: the
    loop tells :meth:`LoopRun.at` its position once per "epoch" of 2 steps only."""
    with LoopRun(path, config) as run:
        if run.summary is not None:
            return run.summary
        gen = torch.Generator().manual_seed(config["seed"])
        state = run.restore()
        step, value = 0, torch.zeros(3)
        if state is not None:
            step, value = state["step"], state["value"]
            set_generator_states(state["gens"], gen=gen)
        while step < 6:
            if stop_after is not None and step == stop_after:
                return None
            if epochs and step % 2 == 0:
                run.at(step, epoch=step // 2 + 1)
            value = value + torch.randn(3, generator=gen)
            step += 1
            if not epochs:
                run.at(step)
            if step == ctrl_c_after:
                os.kill(os.getpid(), signal.SIGINT)  # KeyboardInterrupt raised right here
            if step % 2 == 0:
                run.log({"step": step, "value": value.tolist()})
                run.checkpoint(step, {"value": value, "gens": generator_states(gen=gen)})
        return run.finish({"name": path.name, "final": {"value": value.tolist()}})


def _untimed(path: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time"} for r in RunDir(path).metrics()]


def test_a_fresh_run_writes_config_env_log_checkpoints_and_summary(tmp_path: Path) -> None:
    summary = _train(tmp_path / "a", {"seed": 1, "shape": (2, 3)})
    rd = RunDir(tmp_path / "a")
    assert rd.read_json("config.json") == {"seed": 1, "shape": [2, 3]}  # as JSON reads back
    assert "torch" in rd.read_json("env.json")
    assert [r["step"] for r in rd.metrics()] == [2, 4, 6]
    assert all(r["time"] >= 0 for r in rd.metrics())
    assert [p.name for p in rd.checkpoints()] == ["step-00000004.safetensors",
                                                  "step-00000006.safetensors"]  # newest two
    assert summary == rd.read_json("summary.json") and summary["seconds"] >= 0
    assert not (tmp_path / "a" / ".senslab.owner").exists()  # the lock is released


def test_a_finished_run_is_reused_and_another_config_refused(tmp_path: Path) -> None:
    path = tmp_path / "a"
    first = _train(path, {"seed": 1})
    mtime = (path / "metrics.jsonl").stat().st_mtime_ns
    assert _train(path, {"seed": 1}) == first
    assert (path / "metrics.jsonl").stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match=r"holds a run with a different configuration "
                                         r"\(differs in seed\); use another --out"):
        _train(path, {"seed": 2})


def test_an_interrupted_run_resumes_bit_identically(tmp_path: Path) -> None:
    whole = _train(tmp_path / "whole", {"seed": 3})
    assert _train(tmp_path / "cut", {"seed": 3}, stop_after=5) is None
    assert [r["step"] for r in RunDir(tmp_path / "cut").metrics()] == [2, 4]
    # a record written after the last checkpoint (as by a process killed between the two) is
    # cut back, not doubled
    RunDir(tmp_path / "cut").log({"step": 5, "value": []})
    resumed = _train(tmp_path / "cut", {"seed": 3})
    assert _untimed(tmp_path / "cut") == _untimed(tmp_path / "whole")
    assert resumed["final"] == whole["final"]


def test_a_torn_metric_log_falls_back_to_a_checkpoint_whose_records_survived(
        tmp_path: Path) -> None:
    """A crash may tear the log's last line after the checkpoint of its step was written (the
    line was only flushed). Resuming from that checkpoint would drop the record for good; the
    run falls back to the previous checkpoint, with a warning, and ends with every record."""
    whole = _train(tmp_path / "whole", {"seed": 3})
    cut = tmp_path / "cut"
    assert _train(cut, {"seed": 3}, stop_after=5) is None  # checkpoints at 2 and 4
    log = cut / "metrics.jsonl"
    log.write_bytes(log.read_bytes()[:-20])  # step 4's record torn
    assert [r["step"] for r in RunDir(cut).metrics()] == [2]
    with pytest.warns(UserWarning, match="holds 1 of the 2 metric records.*falling back"):
        resumed = _train(cut, {"seed": 3})
    assert _untimed(cut) == _untimed(tmp_path / "whole")
    assert resumed["final"] == whole["final"]
    # the record count stays out of the state a resume sees
    assert "_metric_records" not in RunDir(cut).load_latest()[1]


def test_a_run_stopped_before_its_first_checkpoint_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "a"
    assert _train(path, {"seed": 1}, stop_after=1) is None
    assert RunDir(path).checkpoints() == []
    summary = _train(path, {"seed": 2})  # nothing worth keeping: another config may start
    assert RunDir(path).read_json("config.json") == {"seed": 2}
    assert summary == json.loads((path / "summary.json").read_text())


def test_single_thread_restores_the_count() -> None:
    before = torch.get_num_threads()
    with single_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def _trained_by(path: Path, commit: str) -> None:
    """Rewrite env.json as if every sitting so far ran at ``commit``."""
    env = json.loads((path / "env.json").read_text())
    env["git_commit"] = commit
    env["sittings"] = [{**s, "git_commit": commit} for s in env["sittings"]]
    (path / "env.json").write_text(json.dumps(env))


def test_the_code_behind_every_sitting_is_kept_and_a_change_of_it_said(tmp_path: Path) -> None:
    """A run resumed by another commit than the one that trained it warns and keeps both
    sittings in env.json; a finished run reused by another commit warns too. Same code: no
    word."""
    from senslab.train._provenance import commits_of
    from senslab.train.rundir import git_commit

    if git_commit() is None:
        pytest.skip("outside a git checkout no commit is recorded, so none can differ")
    path = tmp_path / "a"
    assert _train(path, {"seed": 1}, stop_after=4) is None
    first = json.loads((path / "env.json").read_text())
    assert [s["from_step"] for s in first["sittings"]] == [None]
    _trained_by(path, "0" * 40)
    with pytest.warns(UserWarning, match="trained by commit 0000000000"):
        _train(path, {"seed": 1})
    env = json.loads((path / "env.json").read_text())
    assert [s["from_step"] for s in env["sittings"]] == [None, 4]
    assert env["sittings"][0]["git_commit"] == "0" * 40
    assert commits_of(path) == ["0" * 40, git_commit()]
    with pytest.warns(UserWarning, match="reusing the finished run"):
        _train(path, {"seed": 1})
    same = tmp_path / "b"
    _train(same, {"seed": 1}, stop_after=2)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _train(same, {"seed": 1})  # resumed by the same code
        _train(same, {"seed": 1})  # reused by the same code


def test_an_installed_copy_inside_another_repository_names_no_commit(tmp_path: Path) -> None:
    """senslab installed in a virtual environment inside a user's git project: that project's
    commit says nothing of senslab's code, so none is recorded (and no run warns of one)."""
    import shutil
    import subprocess
    import sys

    import senslab

    proj = tmp_path / "proj"
    site = proj / ".venv" / "lib" / "python3" / "site-packages"
    shutil.copytree(Path(senslab.__file__).parent, site / "senslab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(proj), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    (proj / "README").write_text("a user's project\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    out = subprocess.run(
        [sys.executable, "-c", "from senslab.train.rundir import git_commit; "
                               "print(git_commit())"],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, capture_output=True,
        text=True, check=True).stdout.strip()
    assert out == "None"


@pytest.mark.heavy
def test_a_checkout_with_edited_source_says_so_in_its_commit(tmp_path: Path) -> None:
    """Code run from a checkout whose src/ differs from its commit is not that commit's: the
    recorded commit carries ``+dirty`` (edits outside src/, or untracked files, do not)."""
    import re
    import shutil
    import subprocess
    import sys

    import senslab

    repo = tmp_path / "checkout"
    shutil.copytree(Path(senslab.__file__).parent, repo / "src" / "senslab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "pyproject.toml").write_text("[project]\nname = 'senslab'\n")
    (repo / "README").write_text("x\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)

    def commit() -> str:
        return subprocess.run(
            [sys.executable, "-c", "from senslab.train.rundir import git_commit; "
                                   "print(git_commit())"],
            env={"PYTHONPATH": str(repo / "src"), "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, check=True).stdout.strip()

    clean = commit()
    assert re.fullmatch(r"[0-9a-f]{40}", clean)
    (repo / "README").write_text("edited\n")
    (repo / "src" / "senslab" / "untracked.py").write_text("")
    assert commit() == clean
    with open(repo / "src" / "senslab" / "registry.py", "a") as f:
        f.write("\n# an edit\n")
    assert commit() == clean + "+dirty"
    # a git that cannot read the index cannot say whether src/ is edited: never "clean"
    (repo / ".git" / "index").write_bytes(b"not an index")
    assert commit() == clean + "+unknown"
    from senslab.train._provenance import _short

    assert _short(clean + "+unknown") == clean[:10] + "+unknown"


def test_a_runs_seconds_never_read_below_its_last_logged_time(tmp_path, monkeypatch):
    """summary.json's seconds and the log's times round alike: a run whose last record said
    0.031 s had finished at "0.03" s, and a resumed run's own time was read as negative."""
    import senslab.train.looprun as looprun

    now = [100.0]
    monkeypatch.setattr(looprun.time, "perf_counter", lambda: now[0])
    with LoopRun(tmp_path / "run", {"seed": 0}) as run:
        run.restore()
        now[0] = 100.0314
        logged = run.log({"step": 1})["time"]
        now[0] = 100.0316
        summary = run.finish({"name": "run"})
    assert summary["seconds"] >= logged == 0.031


def _ctrl_c(path: Path, after: int, epochs: bool = False) -> BaseException:
    """The exception that ends :func:`_train` on a real SIGINT after ``after`` steps."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as err:
            _train(path, {"seed": 3}, ctrl_c_after=after, epochs=epochs)
    finally:
        signal.signal(signal.SIGINT, previous)
    return err.value


def test_ctrl_c_says_at_which_step_and_the_rerun_resumes_there(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A loop of its own (every trainer but ``fit``) ended a Ctrl-C with a bare
    KeyboardInterrupt, and ``senslab`` said "interrupted" alone: now the step, and the
    checkpoint a re-run resumes from, as fit says them."""
    from senslab.train.loop import TrainingInterrupted

    whole = _train(tmp_path / "whole", {"seed": 3})
    cut = tmp_path / "cut"
    err = _ctrl_c(cut, after=5)
    assert isinstance(err, TrainingInterrupted)
    assert (err.step, err.checkpoint) == (5, 4)
    assert str(err) == ("interrupted at step 5; re-run the same command to resume (it resumes "
                        "from the checkpoint at step 4)")
    assert not (cut / ".senslab.owner").exists()  # the lock is released
    capfd.readouterr()
    resumed = _train(cut, {"seed": 3})
    assert f"resuming {cut} from step 4 (checkpoint step-00000004" in capfd.readouterr().err
    assert _untimed(cut) == _untimed(tmp_path / "whole")
    assert resumed["final"] == whole["final"]
    # before the first checkpoint: a re-run starts over, and the message says so
    early = _ctrl_c(tmp_path / "early", after=1)
    assert str(early) == ("interrupted at step 1; re-run the same command to resume (it starts "
                          "over: no checkpoint was written yet)")


def test_ctrl_c_in_a_loop_that_reports_once_per_epoch_claims_no_exact_step(
        tmp_path: Path) -> None:
    """The epoch trainers (grokking, sparse_parity, sparse_frequent) know their position at the
    start of each epoch: the message names the epoch and the steps done before it."""
    err = _ctrl_c(tmp_path / "cut", after=5, epochs=True)
    assert str(err) == ("interrupted in epoch 3, after step 4; re-run the same command to "
                        "resume (it resumes from the checkpoint at step 4)")
    assert (err.step, err.epoch, err.checkpoint) == (4, 3, 4)


@pytest.mark.parametrize("which", ["newest", "all"])
def test_a_checkpoint_of_a_newer_senslab_is_refused_not_skipped(tmp_path: Path,
                                                                which: str) -> None:
    """A resume skipped a newer senslab's checkpoint as if damaged: it fell back to the one
    before and trained over the newer one (``newest``), or set them all aside and started over
    (``all``). The run is refused, naming the file and the fix, and nothing is touched."""
    cut = tmp_path / "cut"
    assert _train(cut, {"seed": 3}, stop_after=5) is None  # checkpoints at 2 and 4
    found = RunDir(cut).checkpoints()
    for path in found[-1:] if which == "newest" else found:
        rewrite_as_newer(path)
    files = {p: p.read_bytes() for p in cut.rglob("*") if p.is_file()}
    with pytest.raises(ValueError) as err:
        _train(cut, {"seed": 3})
    assert str(err.value).startswith(
        f"{found[-1]} was written by a newer senslab (checkpoint format 2; this one reads "
        "checkpoint format 1 and older)")
    assert "Upgrade senslab to use it, or choose another run directory (--out)" in str(err.value)
    assert {p: p.read_bytes() for p in cut.rglob("*") if p.is_file()} == files
    # readers refuse it as well, rather than measure an earlier checkpoint in its place
    with pytest.raises(ValueError, match="was written by a newer senslab"):
        RunDir(cut).load_latest()
