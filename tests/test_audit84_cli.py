"""``senslab`` arguments that crashed or started work before they were refused: ``--threads
100000`` (a segmentation fault in torch's thread pool, status 139), ``train --seed -1`` (the
"training …" line, then the error), an unknown ``data.options`` key (the loader's "got an
unexpected keyword argument", naming no fix; with ``--hf``, "does not fit a image model"), and
``measure --checkpoint --seed 2**32`` (seed 0's numbers, without a word)."""

from __future__ import annotations

import os
from pathlib import Path

import cliproc
import pytest

from senslab.cli import MAX_THREADS_PER_CPU, main

ENV = {k: v for k, v in os.environ.items() if k != "SENSLAB_DEBUG"} | {"OMP_NUM_THREADS": "1"}
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("senslab: error: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("args", [
    ["list", "models"], ["train", "--out", "r"], ["measure"], ["run", "demo", "--out", "r"],
    ["report", "r"], ["reproduction"], ["demo", "--out", "r"]])
def test_threads_far_above_the_cpus_are_refused_by_every_command(tmp_path: Path,
                                                                  args: list[str]) -> None:
    done = cliproc.run([*args, "--threads", "100000"], cwd=tmp_path, env=ENV, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)  # was -11 (SIGSEGV)
    message = _error(done.stderr)
    assert f"--threads 100000 is far more than the {CPUS} CPU" in message
    assert f"give --threads {CPUS} or fewer" in message
    assert done.stdout == "" and list(tmp_path.iterdir()) == []  # nothing done, nothing written


def test_the_thread_limit_is_a_multiple_of_the_cpus(tmp_path: Path) -> None:
    most = MAX_THREADS_PER_CPU * CPUS
    over = cliproc.run(["list", "datasets", "--threads", str(most + 1)], cwd=tmp_path, env=ENV)
    assert over.returncode == 2 and f"at most {most}" in _error(over.stderr)
    at = cliproc.run(["list", "datasets", "--threads", str(most)], cwd=tmp_path, env=ENV)
    assert at.returncode == 0 and "digits" in at.stdout.split(), at.stderr


def test_train_refuses_a_bad_seed_before_it_says_it_trains(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["train", "--seed", "-1", "--out", str(out), *cliproc.QUICK_TRAIN]) == 2
    stdout, err = capsys.readouterr()
    assert "training" not in err and stdout == ""
    assert "seed must be in [0, 4294967296), got -1" in _error(err)
    assert not out.exists()


@pytest.mark.parametrize("command", ["train", "measure"])
def test_an_unknown_data_option_names_the_valid_ones(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    out = ["--out", str(tmp_path / "run")] if command == "train" else []
    code = main([command, "--set", "data.options.foo=1", *out, "--threads", "1"])
    stdout, err = capsys.readouterr()
    assert code == 2 and stdout == "" and "training" not in err and "measuring" not in err
    message = _error(err)  # was "digits() got an unexpected keyword argument 'foo'"
    assert "data.options.foo is not an option of the digits data set" in message
    assert "data.options.normalize" in message and "data.options.test_fraction" in message
    assert "drop --set data.options.foo" in message
    assert not (tmp_path / "run").exists()


def test_an_unknown_data_option_with_hf_is_not_called_a_data_mismatch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        image_size=16, patch_size=4, num_channels=3, num_labels=10)).save_pretrained(tmp_path)
    code = main(["measure", "--hf", str(tmp_path), "--set", "data.options.foo=1",
                 "--threads", "1"])
    message = _error(capsys.readouterr().err)
    assert code == 2
    assert "does not fit" not in message  # was "--data digits does not fit a image model"
    assert "data.options.foo is not an option of the digits data set" in message


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("audit84") / "run"
    assert main(["train", "--out", str(out), *cliproc.QUICK_TRAIN]) == 0
    return out


def _measure(run: Path, seed: int, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["measure", "--checkpoint", str(run), "--seed", str(seed), "--sigma", "3",
                 "--num-examples", "32", "--threads", "1", "--precision", "float32"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("seed", [2**32, -1, 2**64])
def test_checkpoint_seeds_out_of_range_are_refused(
        run_dir: Path, capsys: pytest.CaptureFixture[str], seed: int) -> None:
    # 2**32 printed seed 0's row, -1 measured, 2**64 was "Overflow when unpacking long long"
    code, out, err = _measure(run_dir, seed, capsys)
    assert code == 2 and out == ""
    assert f"--seed must be in [0, 4294967296), got {seed}" in _error(err)


def test_checkpoint_seeds_in_range_still_measure(run_dir: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _measure(run_dir, 2**32 - 1, capsys)
    assert code == 0 and out.splitlines()[1].split()[0] == "3"


def test_an_unknown_model_override_is_refused_before_the_run_directory_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = main(["train", "--set", "model.overrides.widht=[8]", "--out", str(out),
                 *cliproc.QUICK_TRAIN])
    stdout, err = capsys.readouterr()
    assert code == 2 and stdout == "" and "training" not in err
    message = _error(err)
    assert "model.overrides.widht is not an option of mlp" in message
    assert "did you mean model.overrides.widths?" in message
    assert not out.exists()  # was made, holding a lock and senslab.json
