"""The engine's optimizer/schedule settings and the type of ``data.options`` / ``model.overrides``
entries.

``optim.name=sps`` with ``optim.schedule=step|cosine`` was refused ("scales a learning rate, but
optim.name=sps sets its own step size") although SPS has an ``lr`` factor on its whole step for
torch's schedulers to scale: the schedule now scales that factor from 1, exactly as it says, and
resumes mid-schedule exactly. A wrong-typed entry (``data.options.test_fraction=abc``) failed
after "training …" with "'<' not supported between instances of 'float' and 'str'"; it is now
refused before anything runs, naming the key and the type it takes."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from senslab.cli import main
from senslab.train.config import RunConfig, apply_overrides, validate
from senslab.train.loop import build_optimizer, build_scheduler, fit
from senslab.train.rundir import RunDir, checkpoint_step

# digits at 8×8: 1,437 training images, 3 batches of 500 per epoch
BASE = ["data.name=digits", "device=cpu", "train.batch_size=500", "train.keep_checkpoints=0",
        "track.num_examples=16", "track.eval_examples=64", "seed=5", "model.name=mlp",
        "model.overrides.widths=[16]", "model.overrides.image_size=8",
        "model.overrides.sens_patch=2", "optim.name=sps"]


def config(extra: list[str]) -> RunConfig:
    return apply_overrides(RunConfig(name="sps"), BASE + extra)


def train(cfg: RunConfig, path: Path) -> dict[str, Any]:
    with warnings.catch_warnings():  # the few-flips note of a 16-example measurement
        warnings.simplefilter("ignore", RuntimeWarning)
        return fit(cfg, path, progress=False)


def weights(path: Path, step: int) -> dict[str, torch.Tensor]:
    found = [p for p in RunDir(path).checkpoints() if checkpoint_step(p) == step]
    assert found, [p.name for p in RunDir(path).checkpoints()]
    return RunDir.load_checkpoint(found[0])["model"]


def test_sps_takes_a_schedule_of_its_step_factor() -> None:
    for own in (["optim.schedule=step", "optim.step_epochs=1"], ["optim.schedule=cosine"]):
        cfg = validate(config([*own, "train.epochs=2"]))  # was refused
        opt = build_optimizer(cfg, torch.nn.Linear(2, 1))
        sched = build_scheduler(cfg, opt)
        assert opt.param_groups[0]["lr"] == 1.0  # the paper's SPS_max in the first epoch
        with warnings.catch_warnings():  # torch: the scheduler stepped before the optimizer
            warnings.simplefilter("ignore", UserWarning)
            sched.step()
        assert opt.param_groups[0]["lr"] == pytest.approx(0.5)  # gamma 0.5; cosine at 1 of 2
    # optim.lr is still unused by sps: refused, saying what the schedule scales instead
    with pytest.raises(ValueError, match=r"optim.lr=0.05: optim.name=sps sets its own step "
                                         r"size .*optim.schedule scales it by a factor"):
        validate(config(["optim.lr=0.05"]))


def test_a_step_schedule_scales_the_sps_steps_as_it_says(tmp_path: Path) -> None:
    runs = {}
    for schedule, own in (("constant", []),
                          ("step", ["optim.gamma=0.25", "optim.step_epochs=1"])):
        runs[schedule] = tmp_path / schedule
        train(config([f"optim.schedule={schedule}", *own, "train.epochs=2", "train.max_steps=4",
                      "train.checkpoint_every=1"]), runs[schedule])
    # epoch 0 (steps 1-3) at factor 1: the same weights; step 4, the first of epoch 1, from the
    # same weights on the same batch: a quarter of the constant run's step
    before = {k: weights(p, 3) for k, p in runs.items()}
    after = {k: weights(p, 4) for k, p in runs.items()}
    for name in before["constant"]:
        assert torch.equal(before["constant"][name], before["step"][name])
        full = after["constant"][name] - before["constant"][name]
        scaled = after["step"][name] - before["step"][name]
        assert full.abs().max() > 0
        torch.testing.assert_close(scaled, 0.25 * full, rtol=1e-4, atol=1e-7)


def test_sps_with_cosine_resumes_mid_schedule_exactly(tmp_path: Path) -> None:
    cfg = config(["optim.schedule=cosine", "train.epochs=3", "train.checkpoint_every=2"])
    ref, run = tmp_path / "ref", tmp_path / "run"
    train(cfg, ref)
    # a crash just after the checkpoint at step 4 (epoch 1, factor 0.75): later ones lost
    shutil.copytree(ref, run)
    (run / "summary.json").unlink()
    later = [p for p in RunDir(run).checkpoints() if checkpoint_step(p) > 4]
    assert later
    for p in later:
        p.unlink()
    train(cfg, run)
    rows = [[{k: v for k, v in r.items() if k != "time"} for r in RunDir(p).metrics()]
            for p in (ref, run)]
    assert rows[0] == rows[1]
    a, b = (RunDir.load_checkpoint(RunDir(p).checkpoints()[-1]) for p in (ref, run))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["optimizer"]["param_groups"][0]["lr"] == b["optimizer"]["param_groups"][0]["lr"]
    assert a["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.0, abs=1e-12)  # annealed


@pytest.mark.parametrize(("entry", "says"), [
    ("data.options.test_fraction=abc",
     "data.options.test_fraction='abc': the digits loader's test_fraction takes float"),
    ("data.options.seed=1.5", "data.options.seed=1.5: the digits loader's seed takes int"),
    ("data.options.digits=abc", "the digits loader's digits takes tuple[int, int] or None"),
    ("data.options.normalize=5", "takes str (default 'minus_one_one'), not int"),
    ("model.overrides.seed=abc", "model.overrides.seed='abc': mlp's seed takes int"),
    ("model.overrides.widths=abc", "mlp's widths takes tuple or list"),
])
def test_a_wrong_typed_entry_is_refused_naming_its_type(entry: str, says: str) -> None:
    with pytest.raises(TypeError, match="give .* a value of type") as err:
        validate(config([entry]))
    assert says in str(err.value)


def test_entries_of_the_right_type_still_pass() -> None:
    # a list for a tuple, an int for a float (as the loader and the model config take them)
    validate(config(["data.options.digits=[3, 8]", "data.options.test_fraction=1",
                     "model.overrides.widths=[8, 8]", "data.options.normalize=standard"]))
    validate(apply_overrides(RunConfig(), ["model.name=roberta", "data.name=sst2",
                                           "data.options.max_len=64",
                                           "data.options.tokenizer=none"]))


def test_train_refuses_a_wrong_typed_option_before_it_says_it_trains(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = main(["train", "--set", "data.options.test_fraction=abc", "--out", str(out),
                 "--threads", "1"])
    stdout, err = capsys.readouterr()
    # was "training mlp on digits …", then "'<' not supported between instances of 'float'
    # and 'str'"
    assert code == 2 and stdout == "" and "training" not in err, err
    assert "data.options.test_fraction='abc'" in err and "takes float" in err
    assert not out.exists()
