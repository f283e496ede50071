"""The engine: configs and overrides, run directories, resume after SIGKILL, CLI."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from senslab.cli import main
from senslab.train.config import RunConfig, apply_overrides, set_option
from senslab.train.loop import fit
from senslab.train.rundir import RunDir, checkpoint_step

TINY_VIT = [
    "model.name=vit_small", "data.name=digits", "model.overrides.patch_size=2",
    "model.overrides.depth=1", "model.overrides.dim=16", "model.overrides.heads=2",
    "model.overrides.dim_head=8", "model.overrides.mlp_dim=16",  # dropout 0.1 stays: RNG state
    "train.batch_size=16", "optim.lr=0.05", "track.num_examples=32", "track.eval_examples=64",
]


def tiny(epochs: int = 2, extra: list[str] | None = None) -> RunConfig:
    return apply_overrides(RunConfig(name="tiny"), TINY_VIT + [f"train.epochs={epochs}"]
                           + (extra or []))


# -- configuration ---------------------------------------------------------------------------


def test_dotted_overrides_are_typed_and_checked():
    cfg = apply_overrides(RunConfig(), ["optim.lr=0.05", "train.epochs=3",
                                        "model.overrides.widths=[8, 4]", "data.root=none",
                                        "train.max_steps=7"])
    assert cfg.optim.lr == 0.05 and cfg.train.epochs == 3 and cfg.train.max_steps == 7
    assert cfg.model.overrides == {"widths": [8, 4]} and cfg.data.root is None
    with pytest.raises(KeyError, match="unknown config key 'optim.lrr'.*Did you mean 'optim.lr'"):
        apply_overrides(cfg, ["optim.lrr=0.1"])
    with pytest.raises(TypeError, match="train.epochs must be int"):
        set_option(cfg, "train.epochs", "many")
    with pytest.raises(TypeError, match="optim.lr must be float"):
        set_option(cfg, "optim.lr", True)
    with pytest.raises(ValueError, match="key=value"):
        apply_overrides(cfg, ["optim.lr"])
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


# -- a run directory ---------------------------------------------------------------------------


def test_fit_writes_a_complete_run_directory(tmp_path):
    summary = fit(tiny(), tmp_path / "run", progress=False)
    rd = RunDir(tmp_path / "run")
    records = rd.metrics()
    assert [r["step"] for r in records] == [0, 90, 180]  # 1438 digits / 16 = 90 steps per epoch
    expected = {"train/acc", "test/acc", "sens/train", "sens/train_se", "weight_norm"}
    assert expected <= set(records[-1])
    assert len(records[-1]["sens/train_per_position"]) == 16  # 8×8 image, 2×2 patches
    assert rd.read_json("config.json") == tiny().to_dict() | {"label": "vit_small"}
    env = rd.read_json("env.json")
    assert env["torch"] == torch.__version__ and "git_commit" in env
    assert summary["final"]["train/acc"] == records[-1]["train/acc"]
    assert len(rd.checkpoints()) == 2
    # running the same command again does not retrain
    mtime = rd.metrics_path.stat().st_mtime_ns
    assert fit(tiny(), tmp_path / "run", progress=False) == summary
    assert rd.metrics_path.stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match="different configuration"):
        fit(tiny(epochs=3), tmp_path / "run", progress=False)


def test_fit_leaves_the_callers_config_alone(tmp_path):
    """The label is resolved on the run's own copy: config.json holds it filled in, the
    caller's config keeps its empty label, and the same object resumes the finished run."""
    cfg = tiny(epochs=1, extra=["train.max_steps=3"])
    before = cfg.to_dict()
    summary = fit(cfg, tmp_path, progress=False)
    assert cfg.to_dict() == before and cfg.label == ""
    assert RunDir(tmp_path).read_json("config.json") == before | {"label": "vit_small"}
    assert summary["label"] == "vit_small"
    assert fit(cfg, tmp_path, progress=False) == summary  # same run: nothing retrained
    assert cfg.to_dict() == before


@pytest.mark.heavy
def test_target_train_accuracy_stops_early(tmp_path):
    summary = fit(tiny(epochs=30, extra=["train.target_train_acc=0.5"]), tmp_path, progress=False)
    assert summary["stopped"] == "target_train_acc" and summary["epochs"] < 30
    assert summary["final"]["train/acc"] >= 0.5


# the child uses the parent's thread count: float reductions split across a different number of
# threads round differently, and the test is about resuming, not about thread counts
_CHILD = """
import sys
import torch
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
torch.set_num_threads(int(sys.argv[2]))
cfg = apply_overrides(RunConfig(name="tiny"), sys.argv[3:])
fit(cfg, sys.argv[1], progress=False)
"""


def _final_state(path: Path) -> dict:
    rd = RunDir(path)
    return RunDir.load_checkpoint(rd.checkpoints()[-1])["model"]


def _newest_step(path: Path) -> int:
    found = RunDir(path).checkpoints()
    return checkpoint_step(found[-1]) if found else -1


def _metrics_without_time(path: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time"} for r in RunDir(path).metrics()]


@pytest.mark.heavy
def test_sigkill_then_resume_is_bit_identical(tmp_path):
    # on the CPU: bit-identity is a CPU guarantee, and on a GPU this tiny run ends before the kill
    args = TINY_VIT + ["train.epochs=4", "train.checkpoint_every=7", "device=cpu"]
    ref = tmp_path / "uninterrupted"
    fit(apply_overrides(RunConfig(name="tiny"), list(args)), ref, progress=False)

    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(run),
                             str(torch.get_num_threads()), *args])
    # kill once the third checkpoint (step 21) is on disk; only the newest two are kept, so
    # count by step, not by files
    deadline = time.time() + 120
    while time.time() < deadline and _newest_step(run) < 21:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (run / "summary.json").exists(), "the child finished before it was killed"

    fit(apply_overrides(RunConfig(name="tiny"), list(args)), run, progress=False)
    a, b = _final_state(ref), _final_state(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _metrics_without_time(ref) == _metrics_without_time(run)


def test_corrupted_checkpoint_falls_back_to_previous(tmp_path):
    cfg = tiny(epochs=3, extra=["train.keep_checkpoints=3"])
    fit(cfg, tmp_path, progress=False)
    rd = RunDir(tmp_path)
    newest = rd.checkpoints()[-1]
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated, as by a full disk
    with pytest.raises(Exception, match="checksum"):
        RunDir.load_checkpoint(newest)
    with pytest.warns(UserWarning, match="falling back to the previous checkpoint"):
        state = rd.latest_checkpoint()
    assert state["position"]["epoch"] == 2
    # resume from the good one redoes the last epoch and reaches the same end
    (tmp_path / "summary.json").unlink()
    with pytest.warns(UserWarning, match="falling back"):
        fit(cfg, tmp_path, progress=False)
    assert [r["step"] for r in rd.metrics()] == [0, 90, 180, 270]


# -- the command line --------------------------------------------------------------------------


def test_cli_list_and_errors(capsys):
    assert main(["list", "models", "vit_*"]) == 0
    assert capsys.readouterr().out.split() == ["vit_simple", "vit_small"]
    assert main(["list", "experiments"]) == 0
    assert "demo" in capsys.readouterr().out
    assert main(["train", "--model", "mlp", "--set", "optim.lrr=1"]) == 2
    assert "Did you mean 'optim.lr'" in capsys.readouterr().err
    assert main(["train", "--model", "mpl"]) == 2
    assert "unknown model 'mpl'" in capsys.readouterr().err


def test_an_unknown_model_or_dataset_leaves_no_run_directory(tmp_path, monkeypatch, capsys):
    """The unknown name was refused after runs/<name> was made (a lock file and senslab.json
    left in the working directory)."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--model", "mpl"]) == 2
    assert main(["train", "--model", "mlp", "--data", "digitz"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'mpl'" in err and "unknown dataset 'digitz'" in err
    assert list(tmp_path.iterdir()) == []


def test_cli_train_then_measure_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--model", "mlp", "--data", "digits", "--out", str(out),
                 "--set", "train.epochs=1", "--set", "model.overrides.widths=[16]",
                 "--set", "model.overrides.sens_patch=2"]) == 0
    printed = capsys.readouterr().out
    assert "mlp" in printed and "sens/train" in printed
    assert main(["measure", "--checkpoint", str(out), "--sigma", "0.5", "2.0",
                 "--num-examples", "64"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [r[0] for r in rows] == ["0.5", "2"]
    low, high = float(rows[0][1]), float(rows[1][1])
    assert 0 <= low <= high <= 1  # more noise, more flips (same noise draws, scaled)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model"]["overrides"]["widths"] == [16]
    # reduced precision: same noise draws, the estimate within the float32 one's interval
    assert main(["measure", "--checkpoint", str(out), "--sigma", "2.0", "--num-examples", "64",
                 "--autocast", "bf16"]) == 0
    bf16 = capsys.readouterr().out.splitlines()[1].split()
    assert bf16[0] == "2" and abs(float(bf16[1]) - high) <= 4 * max(float(bf16[2]), 1e-3)
    with pytest.raises(SystemExit):
        main(["measure", "--checkpoint", str(out), "--autocast", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err


@pytest.mark.parametrize("regularizer", ["noise", "patch_mse"])
def test_regularized_training_with_sharpness_tracking(tmp_path, regularizer):
    patch = ["train.reg_patch=2"] if regularizer == "patch_mse" else []  # noise reads no patch
    cfg = tiny(epochs=1, extra=[f"train.regularizer={regularizer}", *patch,
                                "track.sharpness=true", "track.loss_sharpness=true"])
    summary = fit(cfg, tmp_path, progress=False)
    final = summary["final"]
    assert final["sharpness/shop"] > 0 and 0 <= final["sharpness/shpred"] <= 1
    assert "sharpness/loss" in final
    plain = fit(tiny(epochs=1), tmp_path / "plain", progress=False)
    assert final["weight_norm"] != plain["final"]["weight_norm"]  # the regularizer did act


def test_cli_report(tmp_path, capsys):
    fit(tiny(epochs=1), tmp_path / "a", progress=False)
    assert main(["report", str(tmp_path / "a")]) == 0
    assert (tmp_path / "a" / "report.html").exists()
    assert "vit_small" in capsys.readouterr().out


def test_mse_loss_reads_one_column_against_one_half():
    """With loss="mse" a one-column model regresses the {0, 1} label: accuracy and the tracked
    sensitivity use the boundary 0.5, not the sign (which would call every prediction class 1)."""
    from senslab.measure.outputs import predictions
    from senslab.train.loop import correct, output_rule

    out = torch.tensor([0.1, 0.4, 0.6, 0.9])
    y = torch.tensor([0, 0, 1, 1])
    model = torch.nn.Linear(2, 1)
    rule = output_rule("mse", model, out)
    assert rule == ("scores", 0.5)
    assert int(correct(out, y, *rule)) == 4
    assert int(correct(out, y)) == 2  # read as logits: all class 1
    assert output_rule("auto", model, out) == ("logits", None)
    assert output_rule("mse", model, torch.zeros(4, 3)) == ("logits", None)  # argmax
    assert predictions(out, *rule).tolist() == [False, False, True, True]


def test_tracker_measures_an_mse_run_with_its_own_rule(tmp_path):
    cfg = apply_overrides(RunConfig(name="mse"), [
        "model.name=mlp", "model.overrides.num_classes=1", "data.name=digits",
        "data.options.digits=[3, 8]", "train.loss=mse", "train.epochs=20", "track.num_examples=32",
        "track.eval_examples=64", "device=cpu"])
    summary = fit(cfg, tmp_path / "r", progress=False)
    assert 0.0 <= summary["final"]["sens/train"] <= 1.0
    assert summary["final"]["train/acc"] > 0.9  # by sign it would be the share of 8s


def test_the_data_folder_read_is_recorded_and_a_resume_on_another_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A text set found through SENSLAB_DATA: config.json records the folder (it recorded none,
    so a resume under another SENSLAB_DATA went on, silently, on other text with a tokenizer
    trained on it); the command line's default held-out split of a text set is its
    validation split (text sets have no labelled test split)."""
    rows = "".join(f"{w} film {i}\t{i % 2}\n" for i, w in enumerate(["good", "bad"] * 12))
    for home in ("a", "b"):
        (tmp_path / home / "sst2").mkdir(parents=True)
        for split in ("train.tsv", "dev.tsv"):
            extra = "" if home == "a" else "another film\t1\n"
            extra += "a held out film\t0\n" if split == "dev.tsv" else ""  # not a train copy
            (tmp_path / home / "sst2" / split).write_text("sentence\tlabel\n" + rows + extra)
    monkeypatch.setenv("SENSLAB_DATA", str(tmp_path / "a"))
    monkeypatch.setenv("SENSLAB_CACHE", str(tmp_path / "cache"))
    args = ["train", "--model", "lstm", "--data", "sst2", "--threads", "1", "--out",
            str(tmp_path / "run"), "--set", "train.epochs=1", "--set", "data.options.max_len=8",
            "--set", "data.options.vocab_size=300", "--set", "track.num_examples=4",
            "--set", "model.overrides.dim=8"]
    assert main(args) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data"]["root"] == str((tmp_path / "a" / "sst2").resolve())
    assert config["data"]["test_split"] == "validation"
    monkeypatch.setenv("SENSLAB_DATA", str(tmp_path / "b"))
    capsys.readouterr()
    assert main(args) == 2
    assert "data.root" in capsys.readouterr().err
    cfg = RunConfig.from_dict(config)
    cfg.data.root = None
    fit(cfg, tmp_path / "lib", progress=False)  # the caller's config is left as it was
    assert cfg.data.root is None
    assert json.loads((tmp_path / "lib" / "config.json").read_text())["data"]["root"] == str(
        (tmp_path / "b" / "sst2").resolve())
    capsys.readouterr()  # measuring the run names the split it held out: validation
    assert main(["measure", "--checkpoint", str(tmp_path / "run"), "--num-examples", "4",
                 "--threads", "1", "--split", "test"]) == 0
    assert "sst2 (validation split, 4 examples" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["ngd", "sngd", "sps"])
def test_momentum_or_weight_decay_with_a_normalised_or_polyak_step_is_refused(name):
    """NGD/SNGD/SPS have no momentum or weight decay: the settings were recorded in config.json
    and never applied."""
    from senslab.train.config import validate

    for key in ("optim.momentum=0.9", "optim.weight_decay=0.1"):
        cfg = apply_overrides(RunConfig(), [f"optim.name={name}", key])
        with pytest.raises(ValueError, match=rf"{key}: optim.name={name} has no momentum"):
            validate(cfg)
    validate(apply_overrides(RunConfig(), [f"optim.name={name}"]))


def test_a_regularizer_setting_the_chosen_regularizer_ignores_is_refused():
    """train.reg_alpha/reg_sigma/reg_patch were accepted with a regularizer that never reads
    them (none; noise reads reg_sigma only): recorded in config.json, never applied."""
    from senslab.train.config import validate

    for reg, key in (("none", "train.reg_sigma=0.3"), ("none", "train.reg_alpha=0.2"),
                     ("noise", "train.reg_patch=2"), ("noise", "train.reg_alpha=0.2")):
        cfg = apply_overrides(RunConfig(), [f"train.regularizer={reg}", key])
        with pytest.raises(ValueError, match=rf"{key}: train.regularizer={reg} does not read"):
            validate(cfg)
    for ok in (["train.regularizer=noise", "train.reg_sigma=0.3"],
               ["train.regularizer=patch_mse", "train.reg_alpha=0.2", "train.reg_patch=2"],
               ["train.regularizer=none"]):
        validate(apply_overrides(RunConfig(), ok))


MLP_DIGITS = ["model.name=mlp", "data.name=digits", "train.batch_size=50",
              "track.num_examples=16", "track.eval_examples=100"]


def test_a_target_reached_at_a_step_record_stops_the_run_there(tmp_path: Path):
    """track.unit=step: the target is checked at every record (it was checked at the epoch's
    end only, against the last record, so the run went on and summary.json's final numbers were
    an earlier step's than the final checkpoint's)."""
    cfg = apply_overrides(RunConfig(name="stop"), [*MLP_DIGITS, "train.epochs=3",
                                                   "track.unit=step", "track.every=4",
                                                   "train.target_train_acc=0.3"])
    summary = fit(cfg, tmp_path / "run", progress=False)
    assert summary["stopped"] == "target_train_acc"
    assert summary["final"]["step"] == summary["steps"] and summary["steps"] % 4 == 0
    assert summary["final"]["train/acc"] >= 0.3
    last = RunDir(tmp_path / "run").checkpoints()[-1]
    assert checkpoint_step(last) == summary["steps"]


def test_loss_kinds_that_do_not_fit_the_model_are_refused_and_the_regularizer_keeps_its_loss(
        tmp_path: Path):
    """bce/mse train one output column: with a 10-class model they failed inside torch (mse
    broadcast a batch of 10 against its labels and trained on that). patch_mse took
    cross-entropy whatever train.loss said, which failed on a one-logit model."""
    for kind in ("bce", "mse"):
        cfg = apply_overrides(RunConfig(name=kind), [*MLP_DIGITS, "train.epochs=1",
                                                     f"train.loss={kind}"])
        with pytest.raises(ValueError, match=rf"train.loss={kind} trains one output column.*"
                                             "10 columns.*train.loss=ce"):
            fit(cfg, tmp_path / kind, progress=False)
    binary = ["data.options.digits=(3, 8)", "model.overrides.num_classes=1", "train.epochs=1",
              "train.regularizer=patch_mse", "model.overrides.sens_patch=2"]
    for kind in ("bce", "mse"):
        cfg = apply_overrides(RunConfig(name=f"reg-{kind}"), [*MLP_DIGITS, *binary,
                                                              f"train.loss={kind}"])
        summary = fit(cfg, tmp_path / f"reg-{kind}", progress=False)
        assert math.isfinite(summary["final"]["train/loss"])


def test_real_valued_targets_are_refused_before_training(tmp_path: Path):
    """boolean with function=mean has targets in {0.1, …, 1}: loss=auto trained it with BCE and
    recorded a train/acc against targets truncated by .long() (only y = 1 was class 1)."""
    cfg = apply_overrides(RunConfig(name="mean"), [
        "model.name=boolean_transformer", "data.name=boolean", "data.options.function=mean",
        "train.epochs=1", "track.num_examples=8"])
    with pytest.raises(ValueError, match="real-valued targets.*function=mean.*hr_sharpness"):
        fit(cfg, tmp_path / "mean", progress=False)
    assert not (tmp_path / "mean" / "summary.json").exists()


def test_turning_on_track_val_leaves_the_other_subsets_alone():
    """track.val drew its subset from the generator of the accuracy subsets, so turning it on
    changed which examples train/* and test/* were computed on."""
    from senslab.train.loop import build_model, load_data
    from senslab.train.track import Tracker

    subsets = []
    for val in (False, True):
        cfg = apply_overrides(RunConfig(name="v"), [*MLP_DIGITS, f"track.val={val}"])
        train, test = load_data(cfg)
        t = Tracker(cfg, build_model(cfg, train), train, test, torch.device("cpu"))
        subsets.append((t.sens_train.inputs, t.eval_train.inputs, t.eval_test.inputs))
        assert (t.sens_val is not None) == val
    for before, after in zip(*subsets, strict=True):
        assert torch.equal(before, after)


def test_measure_checkpoint_reproduces_the_tracked_numbers(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]):
    """`senslab measure --checkpoint` draws the examples training tracked: --split train those
    of sens/train, --split test those of sens/val (it had drawn other test examples: 0.055
    against the run's 0.065 in an audit), with the same noise."""
    run = tmp_path / "run"
    assert main(["train", "--model", "mlp", "--data", "digits", "--out", str(run), "--threads",
                 "1", "--set", "train.epochs=1", "--set", "track.val=true", "--set",
                 "track.num_examples=16", "--set", "track.sigma=0.5"]) == 0
    last = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    for split, key in (("train", "sens/train"), ("test", "sens/val")):
        capsys.readouterr()
        assert main(["measure", "--checkpoint", str(run), "--split", split, "--num-examples",
                     "16", "--sigma", "0.5", "--threads", "1", "--precision", "float32"]) == 0
        row = capsys.readouterr().out.strip().splitlines()[-1].split()
        assert float(row[1]) == pytest.approx(last[key], abs=5e-5), (split, row, last[key])
    assert last["sens/val"] != last["sens/train"]  # two subsets, told apart


def test_a_train_subset_larger_than_the_split_says_it_trains_on_all():
    """data.train_subset=5000 on digits' 1,438 training images trained on all of them while
    config.json said 5000, without a word."""
    from senslab.train.loop import load_data

    cfg = apply_overrides(RunConfig(), ["data.name=digits", "data.train_subset=5000"])
    with pytest.warns(UserWarning, match=r"train_subset=5000, but the train split of digits "
                                         r"has 1,438 examples: the run trains on all 1,438"):
        train, _ = load_data(cfg)
    assert len(train) == 1438
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_data(apply_overrides(cfg, ["data.train_subset=1438"]))[0]) == 1438


def test_a_run_says_its_measurements_few_flips_once(tmp_path: Path):
    """The tracker builds a metric at every evaluation, so a cause a measurement warns of (a
    standard error resting on few flips) was said at every epoch; once per run now."""
    cfg = tiny(epochs=3, extra=["track.sigma=0.0001"])  # σ far too small to flip anything
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        summary = fit(cfg, tmp_path, progress=False)
    assert summary["final"]["sens/train"] == 0.0
    assert sum("the standard error rests on" in str(w.message) for w in said) == 1
