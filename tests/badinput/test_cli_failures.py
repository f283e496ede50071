"""Bad input to the ``senslab`` command: one line ``senslab: error: …``, never a traceback.

``CASES`` is the table of command lines that must fail: each row is an id, the arguments
(``{run}`` is a finished tiny run directory, ``{tmp}`` a scratch folder), an optional setup of
files, and substrings that must all appear in the error line (the option, field or value at
fault *and* the fix) or must not appear. Every case runs the real command in a subprocess
(``senslab.cli`` in a child of ``tests/cliproc.py``'s fork server, which spares each command the
import of torch) with the inherited ``PYTHONPATH``, and nothing new is imported from
senslab at the top, so this file also runs against an older senslab
(``tests/badinput/record_before.py``). The other tests cover what a table cannot: a pipe closed
early, Ctrl-C during training and resuming, the NaN loss, and what ``measure`` honours.

Tiny runs throughout (an MLP on the 8×8 digits, one epoch, one thread): ~1 min on 2 cores.
"""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import cliproc
import numpy as np
import pytest
import torch

ENV = {k: v for k, v in os.environ.items() if k != "SENSLAB_DEBUG"} | {"OMP_NUM_THREADS": "1"}
TINY = ["--model", "mlp", "--data", "digits", "--set", "train.epochs=1", "--threads", "1"]
NO_CUDA = "needs a machine without CUDA" if torch.cuda.is_available() else None
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
AS_ROOT = "root may write in a 0o555 directory" if IS_ROOT else None


def senslab(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return cliproc.run(list(args), cwd=cwd, env=ENV, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one ``senslab: error:`` line of a failed command (asserting the failure's form)."""
    assert proc.returncode != 0, f"exit 0 for a bad command; stdout:\n{proc.stdout}"
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("senslab: error: ")]
    assert len(errors) == 1, f"expected one 'senslab: error:' line, stderr:\n{proc.stderr}"
    return errors[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-epoch run directory (mlp on digits)."""
    out = tmp_path_factory.mktemp("cli") / "run"
    proc = senslab("train", *TINY, "--out", str(out), cwd=out.parent)
    assert proc.returncode == 0, proc.stderr
    return out


# setups: make ``path`` (``run`` is the finished run directory)


def _empty_dir(run: Path, path: Path) -> None:
    path.mkdir()


def _file(run: Path, path: Path) -> None:
    path.write_text("not a directory")


def _read_only(run: Path, path: Path) -> None:
    path.mkdir()
    path.chmod(0o555)


def _no_checkpoint(run: Path, path: Path) -> None:
    path.mkdir()
    shutil.copy(run / "config.json", path / "config.json")


def _truncated_config(run: Path, path: Path) -> None:
    shutil.copytree(run, path)
    text = (run / "config.json").read_text()
    (path / "config.json").write_text(text[: len(text) // 2])


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    expect: tuple[str, ...]  #: substrings of the error line, all of them
    absent: tuple[str, ...] = ()  #: substrings the error line must not hold
    #: (name, setup): ``setup(run, {tmp}/name)`` runs before the command
    setup: tuple[str, Callable[[Path, Path], None]] | None = None
    skip: str | None = None  #: why the case cannot run on this machine


CASES = [
    # --- --set: unknown keys, wrong types, out-of-range values --------------------------------
    Case("set-unknown-key", ("train", *TINY, "--set", "optim.lrr=1", "--out", "{tmp}/o"),
         ("optim.lrr", "Did you mean 'optim.lr'")),
    Case("set-not-key-value", ("train", *TINY, "--set", "optim.lr", "--out", "{tmp}/o"),
         ("optim.lr", "key=value")),
    Case("set-wrong-type", ("train", *TINY, "--set", "train.epochs=many", "--out", "{tmp}/o"),
         ("train.epochs", "int", "many")),
    Case("set-negative-lr", ("train", *TINY, "--set", "optim.lr=-1", "--out", "{tmp}/o"),
         ("optim.lr", "-1", "> 0")),
    Case("set-device-foo", ("train", *TINY, "--set", "device=foo", "--out", "{tmp}/o"),
         ("device", "foo", "cpu", "cuda")),
    Case("set-device-cuda-without-cuda",
         ("train", *TINY, "--set", "device=cuda", "--out", "{tmp}/o"),
         ("cuda", "not available", "device=cpu"), skip=NO_CUDA),
    Case("nan-loss", ("train", *TINY, "--set", "optim.lr=1e30", "--out", "{tmp}/o"),
         ("training loss became nan", "lower optim.lr")),
    Case("threads-zero", ("list", "models", "--threads", "0"), ("--threads", "≥ 1", "0")),
    # --- measure's own options ----------------------------------------------------------------
    Case("measure-num-examples-zero", ("measure", "--num-examples", "0"),
         ("--num-examples", "≥ 1", "got 0")),
    Case("measure-num-examples-negative", ("measure", "--num-examples", "-3"),
         ("--num-examples", "≥ 1", "got -3")),
    Case("measure-repeats-zero", ("measure", "--repeats", "0", "--num-examples", "8"),
         ("--repeats", "≥ 1", "got 0")),
    Case("measure-sigma-negative", ("measure", "--sigma", "-1", "--num-examples", "8"),
         ("--sigma", "-1", "positive", "--sigma 0.1")),
    Case("measure-sigma-zero", ("measure", "--sigma", "0.5", "0", "--num-examples", "8"),
         ("--sigma", "got 0", "positive")),
    Case("measure-sigma-nan", ("measure", "--sigma", "nan", "--num-examples", "8"),
         ("--sigma", "nan", "finite")),
    Case("measure-training-only-key", ("measure", "--set", "track.sigma=0.5"),
         ("track.sigma", "no effect", "--sigma")),
    # --- measure --checkpoint: what the checkpoint fixes, and broken run directories -----------
    Case("checkpoint-with-other-model", ("measure", "--checkpoint", "{run}", "--model",
                                         "vit_small"),
         ("--model vit_small", "trained mlp", "drop --model")),
    Case("checkpoint-with-other-data", ("measure", "--checkpoint", "{run}", "--data",
                                        "fashion_mnist"),
         ("--data fashion_mnist", "digits", "drop --data")),
    Case("checkpoint-with-model-override", ("measure", "--checkpoint", "{run}", "--set",
                                            "model.overrides.widths=[4]"),
         ("model.overrides.widths", "checkpoint", "drop --set model.overrides.widths")),
    Case("checkpoint-honours-set-device", ("measure", "--checkpoint", "{run}", "--set",
                                           "device=cuda"),
         ("device=cuda", "not available", "device=cpu"), skip=NO_CUDA),
    Case("checkpoint-missing-dir", ("measure", "--checkpoint", "{tmp}/nope"),
         ("nope", "no such directory", "senslab train --out")),
    Case("checkpoint-not-a-run", ("measure", "--checkpoint", "{tmp}/empty"),
         ("empty", "config.json", "senslab train --out"), setup=("empty", _empty_dir)),
    Case("checkpoint-without-checkpoints", ("measure", "--checkpoint", "{tmp}/bare"),
         ("bare", "checkpoint", "train"), setup=("bare", _no_checkpoint)),
    Case("checkpoint-truncated-config", ("measure", "--checkpoint", "{tmp}/cut"),
         ("cut", "config.json", "not valid JSON", "truncated"),
         setup=("cut", _truncated_config)),
    Case("train-truncated-config", ("train", *TINY, "--out", "{tmp}/cut"),
         ("cut", "config.json", "not valid JSON"), setup=("cut", _truncated_config)),
    # --- output directories that cannot be written --------------------------------------------
    Case("out-under-a-file", ("train", *TINY, "--out", "{tmp}/afile/sub"),
         ("afile", "not a directory", "--out"), setup=("afile", _file)),
    Case("out-read-only", ("train", *TINY, "--out", "{tmp}/ro/sub"),
         ("ro", "--out", "writ"), setup=("ro", _read_only), skip=AS_ROOT),
    Case("run-out-under-a-file", ("run", "demo", "--out", "{tmp}/afile/sub"),
         ("afile", "not a directory", "--out"), setup=("afile", _file)),
    # --- data: missing files, roots that are ignored ------------------------------------------
    Case("fashion-mnist-empty-root", ("train", *TINY[:2], "--data", "fashion_mnist",
                                      "--data-root", "{tmp}/nodata", "--out", "{tmp}/o"),
         ("nodata", "train-images-idx3-ubyte.gz", "--set data.download=true"),
         absent=("(--download)", "--download ")),
    Case("mnist-empty-root-no-wheel-fallback",
         ("measure", "--data", "mnist", "--data-root", "{tmp}/nodata", "--num-examples", "8"),
         ("nodata", "train-images-idx3-ubyte.gz", "mnist.pkl.gz", "--set data.download=true")),
    Case("digits-root-is-ignored", ("measure", "--data", "digits", "--data-root", "{tmp}",
                                    "--num-examples", "8"),
         ("digits", "drop --data-root")),
    # --- empty options (an unset shell variable): not taken for the option left out ------------
    Case("measure-data-root-empty", ("measure", "--data-root", "", "--num-examples", "8"),
         ("--data-root is empty", "drop --data-root", "SENSLAB_DATA")),
    Case("train-data-root-empty", ("train", *TINY, "--data-root", "", "--out", "{tmp}/o"),
         ("--data-root is empty", "drop --data-root", "SENSLAB_DATA")),
    Case("measure-checkpoint-empty", ("measure", "--checkpoint", "", "--num-examples", "8"),
         ("--checkpoint is empty", "drop --checkpoint")),
    # --- a model on a generated set it cannot take, or built for another size -----------------
    Case("measure-image-model-on-bits", ("measure", "--model", "mlp", "--data", "boolean",
                                         "--num-examples", "8"),
         ("mlp takes images", "boolean holds ±1 bit strings", "digits", "boolean_transformer")),
    Case("measure-token-vectors-of-another-length",
         ("measure", "--model", "sparse_attention", "--data", "sparse_frequent",
          "--set", "model.overrides.dim=32", "--num-examples", "8"),
         ("length 32", "length 40", "--set model.overrides.dim=40"),
         absent=("one_hot",)),
]


@pytest.fixture(scope="module")
def outcomes(run: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every case's command, run on all cores at once (each is a separate process)."""

    def one(case: Case) -> subprocess.CompletedProcess[str]:
        tmp = tmp_path_factory.mktemp(case.id)
        if case.setup is not None:
            name, setup = case.setup
            setup(run, tmp / name)
        return senslab(*(a.format(run=run, tmp=tmp) for a in case.args), cwd=tmp)

    todo = [c for c in CASES if c.skip is None]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        return dict(zip([c.id for c in todo], pool.map(one, todo), strict=True))


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_bad_command_line(case: Case, outcomes: dict[str, subprocess.CompletedProcess[str]]
                          ) -> None:
    if case.skip is not None:
        pytest.skip(case.skip)
    line = error_line(outcomes[case.id])
    missing = [s for s in case.expect if s not in line]
    assert not missing, f"{missing} not in: {line}"
    assert not [s for s in case.absent if s in line], line


# -- what the table cannot say -----------------------------------------------------------------


def test_senslab_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "senslab.cli", "measure", "--set", "optim.lrr=1"],
                          cwd=tmp_path, env=ENV | {"SENSLAB_DEBUG": "1"}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "optim.lrr" in proc.stderr


def test_measure_checkpoint_honours_set_device_and_says_what_it_measures(run: Path) -> None:
    proc = senslab("measure", "--checkpoint", str(run), "--set", "device=cpu", "--threads", "1",
                   "--num-examples", "16", "--sigma", "0.5", "1", cwd=run.parent)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    note = next(line for line in proc.stderr.splitlines() if "measuring" in line)
    for part in ("mlp", f"checkpoint step 15 of {run}", "digits", "train split", "16 examples",
                 "patches", "sigma 0.5, 1", "1 noise draw", "cpu", "1 thread"):
        assert part in note, (part, note)
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    assert [r[0] for r in rows] == ["0.5", "1"]  # stdout stays the table alone


def test_measure_untrained_says_so(tmp_path: Path) -> None:
    proc = senslab("measure", "--threads", "1", "--num-examples", "8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "mlp, untrained (seed 0), on digits" in proc.stderr


def _write_idx(path: Path, data: np.ndarray, magic: int) -> None:
    path.write_bytes(gzip.compress(struct.pack(f">I{data.ndim}I", magic, *data.shape)
                                   + data.astype(np.uint8).tobytes()))


def test_explicit_mnist_root_is_used(tmp_path: Path) -> None:
    root = tmp_path / "mnist"
    root.mkdir()
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 6), ("t10k", 3)):
        _write_idx(root / f"{prefix}-images-idx3-ubyte.gz",
                   rng.integers(0, 256, (n, 28, 28)), 2051)
        _write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10, 2049)
    proc = senslab("measure", "--data", "mnist", "--data-root", str(root), "--set",
                   "data.options.verify=false", "--num-examples", "100", "--threads", "1",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "on mnist (train split, 6 examples)" in proc.stderr  # the 6 of root, not 60,000


@pytest.mark.heavy
def test_closed_pipe_is_quiet(tmp_path: Path) -> None:
    # the reader is gone before anything is written: the write fails with EPIPE
    proc = subprocess.Popen([sys.executable, "-m", "senslab.cli", "list", "experiments"],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=120) in (0, 141), err
    assert err == "", err  # no traceback, no "Exception ignored ... BrokenPipeError"
    # as typed in a shell
    shell = subprocess.run(
        f"{sys.executable} -m senslab.cli list experiments | head -1; "
        'echo "status=${PIPESTATUS[0]}"', shell=True, executable="/bin/bash", cwd=tmp_path,
        env=ENV, capture_output=True, text=True, timeout=120)
    assert shell.stderr == "", shell.stderr
    first, status = shell.stdout.splitlines()
    assert first.split()[0] and status in ("status=0", "status=141")


def _start_train(out: Path) -> cliproc.Process:
    return cliproc.start(["train", "--model", "mlp", "--data", "digits", "--set",
                          "train.epochs=300", "--threads", "1", "--out", str(out)],
                         cwd=out.parent, env=ENV, stdout=cliproc.PIPE, stderr=cliproc.PIPE)


def _interrupt(proc: cliproc.Process, ready: Callable[[], bool]) -> str:
    deadline = time.monotonic() + 60
    while not ready():
        assert proc.poll() is None, "training ended before it could be interrupted"
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return err


@pytest.mark.heavy
def test_ctrl_c_during_training(tmp_path: Path) -> None:
    import importlib

    resumable = hasattr(importlib.import_module("senslab.train.loop"), "TrainingInterrupted")
    out = tmp_path / "run"
    proc = _start_train(out)
    # interrupt inside the training loop, once it has written a checkpoint (stderr is left
    # unread until then: an older senslab prints nothing before the end)
    ckpts = out / "checkpoints"
    err = _interrupt(proc, lambda: ckpts.is_dir() and any(ckpts.glob("step-*")))
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "senslab: error: interrupted" in err, err
    if resumable:
        assert "re-run the same command to resume" in err
        # re-running resumes, and says from which step
        again = _start_train(out)
        assert again.stderr is not None
        lines: list[str] = []
        err2 = _interrupt(again, lambda: lines.append(again.stderr.readline()) or any(
            "resuming" in line for line in lines))
        resumed = next(line for line in lines if "resuming" in line)
        assert "from step" in resumed, resumed
        assert again.returncode == 130 and "Traceback" not in err2
