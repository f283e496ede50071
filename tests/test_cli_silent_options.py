"""What the ``senslab`` command prints and does is what was asked: no number rounded into
another meaning, no option accepted and then ignored, no run written under a misleading name or
in a folder called ``~``, no failure reported as a bug or with the wrong status."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from cliproc import QUICK_TRAIN

from senslab.cli import main
from senslab.measure._stats import fixed as _fixed


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of one training step of mlp on digits."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train", "--model", "mlp", "--data", "digits", "--out", str(out),
                 *QUICK_TRAIN]) == 0
    return out


def _error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("senslab: error: ")]
    assert len(lines) == 1, err
    return lines[0]


# -- the table's numbers -------------------------------------------------------------------------


def test_a_rare_flip_is_not_printed_as_none(capsys: pytest.CaptureFixture[str]) -> None:
    """At sigma 0.0006 one copy of ~23,000 flips (a rate of ~4e-05; 0.0004 before the noise
    had a seed of its own): the row read
    ``0.0000 0.0000 0.0000–0.0001``, no flip at all with an exact standard error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the few-flips warning is not what is tested
        assert main(["measure", "--model", "mlp", "--data", "digits", "--num-examples", "2000",
                     "--repeats", "4", "--sigma", "0.0006", "--precision", "float32",
                     "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    examples = int(re.search(r"split, (\d+) examples", err).group(1))
    sigma, estimate, stderr, ci, forwards, _ = out.splitlines()[1].split()
    copies = int(forwards.replace(",", "")) - examples  # every forward but the clean ones
    assert copies == examples * 4 * 4  # 4 patches of 4×4 pixels, 4 draws each
    flips = float(estimate) * copies
    assert float(estimate) > 0 and float(stderr) > 0, out
    # the printed rate is a whole number of flips over the copies (to its two digits)
    assert round(flips) >= 1 and abs(flips - round(flips)) < 0.05 * round(flips), out
    assert float(ci.split("–")[1]) > float(estimate)


@pytest.mark.parametrize(("value", "text"), [
    (0.0, "0.0000"), (0.0458, "0.0458"), (0.0012, "0.0012"), (1.0, "1.0000"),
    (4.3463e-05, "0.000043"), (0.00087, "0.00087"), (0.99996, "0.99996"),
    (0.999996, "0.999996"), (0.5, "0.5000"),
])
def test_fixed_keeps_what_four_decimals_would_lose(value: float, text: str) -> None:
    assert _fixed(value) == text


# -- options accepted and ignored ----------------------------------------------------------------


def test_train_names_the_run_after_the_seed_it_trains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--set seed=3`` trained seed 3 into runs/mlp-digits-s0 (the name took --seed's 0),
    where ``--set seed=4`` was then refused as "a different configuration"."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--set", "seed=3", *QUICK_TRAIN]) == 0
    assert main(["train", "--set", "seed=4", *QUICK_TRAIN]) == 0, capsys.readouterr().err
    for seed in (3, 4):
        config = json.loads((tmp_path / "runs" / f"mlp-digits-s{seed}" / "config.json")
                            .read_text())
        assert config["seed"] == seed
    assert not (tmp_path / "runs" / "mlp-digits-s0").exists()


def test_measure_refuses_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["measure", "--name", "mine", "--num-examples", "4", "--threads", "1"]) == 2
    out, err = capsys.readouterr()
    assert "--name mine" in _error_line(err) and "drop --name" in err and out == ""


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("vit")
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        image_size=16, patch_size=4, num_channels=3, num_labels=10)).save_pretrained(path)
    return path


@pytest.mark.parametrize(("option", "says"), [
    ("model.overrides.dim=4", "--set model.overrides.dim configures senslab's own models"),
    ("model.name=vit_small", "--set model.name configures senslab's own models"),
    ("seed=3", "--set seed has no effect on --hf"),
])
def test_measure_hf_refuses_set_keys_it_would_ignore(
        vit_dir: Path, capsys: pytest.CaptureFixture[str], option: str, says: str) -> None:
    """The model is loaded as saved and seeded from --seed: these printed the very table of the
    command without them."""
    assert main(["measure", "--hf", str(vit_dir), "--num-examples", "4", "--set", option,
                 "--threads", "1"]) == 2
    out, err = capsys.readouterr()
    assert says in _error_line(err) and out == ""


def _other_experiments_dir(tmp_path: Path) -> Path:
    """An --out that run_experiment refuses (it holds another experiment's runs) after the
    command's own checks: what the command says before any training, without training."""
    out = tmp_path / "exp"
    out.mkdir()
    (out / "experiment.json").write_text(json.dumps({"name": "another"}))
    return out


def test_run_says_when_threads_is_overruled(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """demo trains its cpu-scale runs on one thread whatever --threads said, without a word."""
    out = _other_experiments_dir(tmp_path)
    with pytest.warns(UserWarning, match=r"--threads 2 is overruled: demo trains and measures "
                                         r"its cpu-scale runs on one thread"):
        assert main(["run", "demo", "--out", str(out), "--threads", "2"]) == 2
    assert "another" in capsys.readouterr().err
    for argv in (["run", "demo", "--threads", "1"],
                 ["run", "hr_sharpness_vs_length", "--threads", "2"]):  # not one-thread
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning fails the test
            assert main([*argv, "--out", str(out)]) == 2
        capsys.readouterr()


def test_reproduction_refuses_a_runs_directory_that_is_not_there(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped --runs recorded nothing and rewrote REPRODUCTION.md, exit status 0."""
    md = tmp_path / "R.md"
    assert main(["reproduction", "--runs", str(tmp_path / "rnus"), "--records",
                 str(tmp_path / "rec"), "--out", str(md)]) == 2
    assert "no such directory" in _error_line(capsys.readouterr().err) and not md.exists()
    # directories given: --runs (the default ones' folder) would do nothing
    assert main(["reproduction", str(tmp_path / "runs" / "demo"), "--runs",
                 str(tmp_path), "--out", str(md)]) == 2
    assert "drop --runs" in _error_line(capsys.readouterr().err) and not md.exists()
    # none finished under an existing --runs: said on stderr, then the records are rendered
    (tmp_path / "empty").mkdir()
    assert main(["reproduction", "--runs", str(tmp_path / "empty"), "--records",
                 str(tmp_path / "rec"), "--out", str(md)]) == 0
    assert "no finished experiment in " in capsys.readouterr().err and md.exists()


# -- paths ---------------------------------------------------------------------------------------


def test_report_out_that_is_a_file_is_bad_input(
        run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It failed after the plots as "FILE: file exists", status 1 (a failure of the work)."""
    afile = tmp_path / "afile"
    afile.write_text("kept")
    assert main(["report", str(run_dir), "--out", str(afile)]) == 2
    assert f"--out {afile} is a file" in _error_line(capsys.readouterr().err)
    assert afile.read_text() == "kept"


def test_a_tilde_path_is_the_home_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--out=~/run`` (which no shell expands) trained into ./~/run."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert main(["train", "--out=~/run", *QUICK_TRAIN]) == 0
    assert (home / "run" / "config.json").is_file() and list(work.iterdir()) == []
    capsys.readouterr()
    assert main(["measure", "--checkpoint=~/run", "--num-examples", "4", "--precision",
                 "float32", "--threads", "1"]) == 0
    assert f"of {home / 'run'}, on digits" in capsys.readouterr().err


# -- a warning made an error ---------------------------------------------------------------------


def test_a_warning_made_an_error_is_not_called_a_bug(capsys: pytest.CaptureFixture[str]) -> None:
    """Under -W error the few-flips warning stopped the command as "unexpected RuntimeWarning …
    (probably a bug: … report it)"."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code = main(["measure", "--model", "mlp", "--num-examples", "64", "--sigma", "0.01",
                     "--precision", "float32", "--threads", "1"])
    line = _error_line(capsys.readouterr().err)
    assert code == 1
    assert "the standard error rests on few flips" in line
    assert "made an error by the warnings filter" in line and "bug" not in line
