"""Run directories under a full disk, inside a git hook, and across sittings on other setups.

* A write that fails for room (the file-size limit here, ``ulimit -f``; a full disk fails the
  same way) names the file it was writing and keeps what was written before: the error was a
  bare ``[Errno 27] File too large``, the whole message of a run that stopped at a checkpoint.
* The commit recorded is senslab's checkout's, also where git's variables point at another
  repository (a hook of the user's project exports GIT_DIR and GIT_INDEX_FILE): that project's
  HEAD was recorded as senslab's commit.
* A resume compares its setup with the sitting that wrote the checkpoint it resumes from, not
  with the last sitting, which may have stopped before writing one: a run whose first sitting
  ran on 2 threads, its second (stopped by a full disk before its first checkpoint) and third on
  1, was resumed on 1 thread without a word; and back on 2 it was warned about for nothing.
  A resume on another GPU model is said as well.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from senslab.cli import explain
from senslab.train._provenance import write_env
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
from senslab.train.rundir import RunDir, checkpoint_step, git_commit

try:
    import resource
except ImportError:  # Windows: no RLIMIT_FSIZE
    resource = None  # type: ignore[assignment]

ARGS = ["data.name=digits", "device=cpu", "train.batch_size=256", "train.epochs=2",
        "train.keep_checkpoints=0", "optim.lr=0.05", "track.num_examples=16",
        "track.eval_examples=64", "seed=5", "model.name=mlp", "model.overrides.widths=[16]"]


def config() -> RunConfig:
    return apply_overrides(RunConfig(name="audit80"), list(ARGS))


def train(path: Path, threads: int) -> list[str]:
    """Train (or resume) ``path`` on ``threads`` torch threads; the warnings it gave."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit(config(), path, progress=False)
    finally:
        torch.set_num_threads(before)
    return [str(w.message) for w in caught if "another setup" in str(w.message)]


class FileSizeLimit:
    """This process's file-size limit (RLIMIT_FSIZE) lowered to ``size`` bytes inside the block:
    a write past it fails with EFBIG (Python ignores SIGXFSZ), as a full disk fails with ENOSPC."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __enter__(self) -> None:
        if resource is None:
            pytest.skip("this platform has no file-size limit to fill")
        self.old = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.size, self.old[1]))

    def __exit__(self, *exc: Any) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, self.old)


def state(size: int) -> dict[str, Any]:
    return {"w": torch.arange(size, dtype=torch.float32), "step": 0}


# -- a full disk ------------------------------------------------------------------------------


def test_a_checkpoint_the_disk_has_no_room_for_names_its_file_and_keeps_the_last(
        tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.write_json("config.json", {"seed": 0})
    rd.log({"step": 4, "loss": 1.0})
    first = rd.save_checkpoint(state(100), 4)
    path = rd.ckpt_dir / "step-00000008.safetensors"
    with FileSizeLimit(20_000), pytest.raises(OSError) as err:
        rd.save_checkpoint(state(10_000), 8)  # 40 kB of weights
    assert err.value.filename == str(path)  # was None: "[Errno 27] File too large"
    assert "file-size limit (ulimit -f)" in str(err.value) and "not written" in str(err.value)
    status, message = explain(err.value)  # the command line's one line
    assert status == 1 and message.startswith(f"{path}: file too large")
    assert rd.checkpoints() == [first] and not path.exists()
    assert torch.equal(RunDir.load_checkpoint(first)["w"], state(100)["w"])
    assert [f.name for f in rd.ckpt_dir.iterdir()] == [first.name]  # no temporary file left


def test_a_record_the_disk_has_no_room_for_names_the_log_and_keeps_the_earlier(
        tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.write_json("config.json", {"seed": 0})
    rd.log({"step": 1, "loss": 0.5})
    size = rd.metrics_path.stat().st_size
    with FileSizeLimit(size + 10), pytest.raises(OSError) as err:
        rd.log({"step": 2, "loss": 0.25, "note": "x" * 200})
    assert err.value.filename == str(rd.metrics_path)
    assert "records logged before are kept" in str(err.value)
    assert rd.metrics() == [{"step": 1, "loss": 0.5}]  # the torn part is read as a crash's
    rd.log({"step": 2, "loss": 0.25})  # with room again: the torn part is removed first
    assert rd.metrics() == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}]


# -- provenance -------------------------------------------------------------------------------


def test_the_commit_is_senslab_s_inside_another_repository_s_git_hook(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = git_commit()
    if here is None or shutil.which("git") is None:
        pytest.skip("not a git checkout of senslab: no commit to record")
    project = tmp_path / "project"
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=a", "-C", str(project)]
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    theirs = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    # what git exports to a pre-commit hook run in a worktree of the user's project
    monkeypatch.setenv("GIT_DIR", str(project / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(project / ".git" / "index"))
    got = git_commit()
    assert got is not None and theirs not in got  # was the project's HEAD
    assert got.partition("+")[0] == here.partition("+")[0]


# -- the setup of the sitting that wrote the checkpoint ---------------------------------------


def stopped_at_first_checkpoint(path: Path, threads: int) -> None:
    """A sitting of ``path`` on ``threads`` threads that the disk stops at its first checkpoint
    (trained, logged, saved nothing that a resume keeps)."""
    limit = max(f.stat().st_size for f in RunDir(path).checkpoints()) // 2
    with FileSizeLimit(limit), pytest.raises(OSError):
        train(path, threads)


@pytest.mark.parametrize("back_on", [1, 2], ids=["stays-on-1", "back-on-2"])
def test_a_resume_compares_with_the_sitting_that_wrote_its_checkpoint(
        tmp_path: Path, back_on: int) -> None:
    ref, run = tmp_path / "ref", tmp_path / "run"
    assert train(ref, 2) == []
    shutil.copytree(ref, run)  # as a kill after the first epoch's checkpoint leaves it
    (run / "summary.json").unlink()
    for p in RunDir(run).checkpoints()[1:]:
        p.unlink()
    at = checkpoint_step(RunDir(run).checkpoints()[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its own (correct) warning: threads 2 → 1
        stopped_at_first_checkpoint(run, 1)
    said = train(run, back_on)  # resumes from the checkpoint the 2-thread sitting wrote
    if back_on == 1:  # said nothing: env.json's last sitting ran on 1 thread too
        assert len(said) == 1 and f"at step {at} on another setup" in said[0], said
        assert "(threads 2 → 1)" in said[0]
    else:  # said "threads 1 → 2", for a checkpoint of 2 threads
        assert said == []
        rows = [[{k: v for k, v in r.items() if k != "time"} for r in RunDir(p).metrics()]
                for p in (ref, run)]
        assert rows[0] == rows[1]  # exact, as an uninterrupted run
    sittings = json.loads((run / "env.json").read_text())["sittings"]
    assert [s["setup"]["threads"] for s in sittings] == [2, 1, back_on]
    assert [s["from_step"] for s in sittings] == [None, at, at]


def _env(device: str, gpu: str | None, threads: int = 4) -> dict[str, Any]:
    return {"git_commit": None, "torch": torch.__version__, "device": device, "cuda": gpu,
            "threads": threads, "started": "t"}


@pytest.mark.parametrize(("device", "warned"), [("cuda", True), ("cpu", False)])
def test_a_resume_on_another_gpu_model_is_said(tmp_path: Path, device: str,
                                               warned: bool) -> None:
    rd = RunDir(tmp_path / "r")
    write_env(rd, _env(device, "NVIDIA A100-SXM4-80GB"), None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_env(rd, _env(device, "NVIDIA H100 80GB HBM3"), 40)
    said = [str(w.message) for w in caught]
    if warned:  # a requeued job landing on another GPU model rounds otherwise
        assert len(said) == 1, said
        assert "cuda NVIDIA A100-SXM4-80GB → NVIDIA H100 80GB HBM3" in said[0]
    else:  # a CPU run names the machine's GPU, which it did not use: no difference
        assert said == []


def test_a_sitting_of_an_older_env_json_is_compared_as_before(tmp_path: Path) -> None:
    """env.json written before sittings recorded their setup: the top level's is compared."""
    rd = RunDir(tmp_path / "r")
    env = _env("cpu", None, threads=3)
    rd.write_json("env.json", {**env, "sittings": [
        {"git_commit": None, "senslab": "x", "started": "t", "from_step": None}]})
    with pytest.warns(UserWarning, match=r"another setup than the sitting before \(threads 3 → 4"):
        write_env(rd, _env("cpu", None, threads=4), 12)
