"""Audit 77 of the ``senslab`` command: lines about what a command does that were printed into
its result (stdout), a run name that trained into ``runs/`` itself, a ``--rungs`` that named no
rung and ran nothing with status 0, and a ``list`` pattern that matched nothing without a word."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cliproc import QUICK_TRAIN

from senslab.cli import main
from senslab.experiments import run_experiment
from senslab.measure import noise_seed

#: ``ib_fixed_v`` at its smallest: three runs of a few steps of the ``attention`` trainer
TINY_IB = ["steps=6", "seeds=1", "fit_from=3", "data.num_samples=8", "data.seq_len=4",
           "data.dim=8"]


@pytest.fixture(scope="module")
def finished_ib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("audit77cli") / "ib_fixed_v"
    run_experiment("ib_fixed_v", out, overrides=TINY_IB, progress=False, log=lambda _: None)
    return out


@pytest.mark.filterwarnings("ignore:.*curve points not drawn")
def test_run_prints_its_progress_on_stderr_not_in_the_result(
        finished_ib: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``senslab run`` printed "[1/3] gd-s0 (attention)" (and notices such as a damaged
    verdict.json set aside) on stdout, which holds only the result: `senslab run … > table.txt`
    mixed them into the table."""
    sets = [a for s in TINY_IB for a in ("--set", s)]
    assert main(["run", "ib_fixed_v", "--out", str(finished_ib), *sets, "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert "[1/3]" not in out and "(attention)" not in out, out
    assert "senslab: [1/3] gd-s0 (attention)" in err, err
    assert "verdict:" in out and "report:" in out  # the result stays on stdout


@pytest.mark.parametrize("option", [["--set", "name="], ["--set", "name=  "],
                                    ["--name", "."], ["--set", "name=.."]])
def test_train_refuses_a_name_that_is_no_directory_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        option: list[str]) -> None:
    """``--set name=`` (an unset shell variable; ``--name ""`` is refused) trained the run into
    runs/ itself, its config.json and checkpoints/ among the other runs' directories, status 0;
    ``--name .`` into runs/ too."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", *option, *QUICK_TRAIN]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "senslab: error: " in err and option[0] in err, err
    assert not (tmp_path / "runs").exists()


def test_train_still_takes_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--set", "name=mine", *QUICK_TRAIN]) == 0
    assert (tmp_path / "runs" / "mine" / "config.json").is_file()


@pytest.mark.parametrize("rungs", [",", " , "])
def test_rungs_that_name_no_rung_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], rungs: str) -> None:
    """``--rungs ,`` (``--rungs "$A,$B"`` with both unset) ran no rung, wrote ladder.json and
    ladder.png, and ended with status 0."""
    out = tmp_path / "ladder"
    assert main(["run", "demo", "--scale", "ladder", "--rungs", rungs, "--out", str(out)]) == 2
    _, err = capsys.readouterr()
    assert "--rungs" in err and "names no rung" in err, err
    assert not out.exists()


@pytest.mark.parametrize(("what", "pattern"), [("models", "vit"), ("datasets", "MNIST"),
                                               ("experiments", "cifar")])
def test_list_says_when_the_pattern_matches_nothing(
        capsys: pytest.CaptureFixture[str], what: str, pattern: str) -> None:
    """``senslab list models vit`` printed an empty line (experiments: nothing) and no word that
    the glob, whole-name and case-sensitive, matched no name: read as "no ViT here"."""
    assert main(["list", what, pattern]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert f"no registered {what[:-1]} matches {pattern!r}" in err, err
    assert f"'*{pattern}*'" in err


def test_measure_seed_help_says_how_hf_draws_the_test_split(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--seed's help said the test split is drawn with seed + 2; with --hf (and --timm) it is
    drawn with seed + 1, as for the train split (numbers pinned by the --hf tests)."""
    transformers = pytest.importorskip("transformers")
    from senslab import token_sensitivity
    from senslab.data import create_dataset
    from senslab.tokens import Patches

    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        image_size=8, patch_size=4, num_channels=1, num_labels=10, initializer_range=0.5)
    ).save_pretrained(tmp_path)
    assert main(["measure", "--hf", str(tmp_path), "--split", "test", "--num-examples", "8",
                 "--sigma", "2", "--precision", "float32", "--threads", "1"]) == 0
    out, _ = capsys.readouterr()
    model = transformers.ViTForImageClassification.from_pretrained(tmp_path).eval()
    data = create_dataset("digits", "test", normalize="none")
    x, _ = data.first(8, generator=torch.Generator().manual_seed(0 + 1)).batch(slice(0, 8))
    want = token_sensitivity(model, x, Patches(4), sigma=2.0,
                             generator=noise_seed(0)).estimate
    assert float(out.splitlines()[1].split()[1]) == pytest.approx(want, abs=5e-5)
    with pytest.raises(SystemExit):
        main(["measure", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert "--hf, --timm: seed + 1 for either split" in helptext, helptext
