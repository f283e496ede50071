"""What the tracker records can be trusted and read back: an evaluation of a model whose outputs
overflowed stops the run (its NaN loss and the accuracy of NaN outputs were a finished run's
final numbers), a standard error that is not known is written as JSON's null (not a bare NaN
that strict readers refuse), and a tracking setting whose measurement is off is said."""

from __future__ import annotations

import io
import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import build_model, fit, load_data
from senslab.train.progress import Progress
from senslab.train.track import Tracker

TINY = ["model.name=mlp", "data.name=digits", "model.overrides.widths=[16]", "device=cpu",
        "train.batch_size=128", "train.epochs=1", "track.num_examples=16",
        "track.eval_examples=64", "seed=3"]


def tiny(*extra: str) -> RunConfig:
    return apply_overrides(RunConfig(name="t"), [*TINY, *extra])


def _strict(line: str) -> dict:
    """``line`` read as strict JSON (jq, JavaScript, serde_json): NaN and Infinity refused."""
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")
    return json.loads(line, parse_constant=refuse)


def test_an_evaluation_of_overflowed_outputs_stops_the_run_naming_the_rate(tmp_path: Path):
    """Before: the run's one step (optim.lr=1e30) made the outputs NaN; the loop checks a
    batch's loss before its step, so the run finished ("budget") with train/loss and test/loss
    NaN and train/acc 0.0987 — the share of class 0, every NaN row's argmax — in metrics.jsonl
    and summary.json without a word."""
    run = tmp_path / "run"
    cfg = tiny("train.max_steps=1", "optim.lr=1e30", "track.sigma=0")
    with pytest.raises(FloatingPointError, match=(
            r"evaluation loss became nan \(train/loss=nan, test/loss=nan\): the model's outputs "
            r"are no longer finite.*; lower optim\.lr \(now 1e\+30\) or check the data")):
        fit(cfg, run, progress=False)
    assert not (run / "summary.json").exists()
    records = [_strict(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0]  # the untrained model's, finite


def test_a_standard_error_not_known_is_written_as_null(tmp_path: Path):
    """track.num_examples=1: the data standard error of one example is NaN (the measurement
    warns of it). Before: written as a bare ``NaN`` (and ``[NaN, NaN]`` for the interval), so a
    strict JSON reader refused every metrics.jsonl line; per-position NaNs were already null."""
    run = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one-example and no-flip warnings
        summary = fit(tiny("track.num_examples=1"), run, progress=False)
    records = [_strict(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for r in records:
        assert r["sens/train_se"] is None and r["sens/train_ci"] == [None, None]
        assert math.isfinite(r["sens/train"])
    assert summary["final"]["sens/train_se"] is None
    _strict((run / "summary.json").read_text())


def test_a_progress_bar_leaves_out_a_value_not_known():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    bar = Progress(4, desc="t", stream=stream)
    bar.set_postfix({"train/acc": 0.5, "sens/train": None})
    bar.update(4, loss=0.25)
    bar.close()
    last = stream.getvalue().rstrip("\n").split("\r")[-1]
    assert "train acc=0.500" in last and "None" not in last and "sens" not in last


def _tracker(*extra: str) -> Tracker:
    cfg = tiny(*extra)
    train, test = load_data(cfg)
    return Tracker(cfg, build_model(cfg, train), train, test, torch.device("cpu"))


@pytest.mark.parametrize(("extra", "said"), [
    (("track.sigma=0", "track.val=true"),
     "track.val=true is not read: track.sigma=0 measures no sensitivity (no sens/val)"),
    (("track.sharpness_sigma=0.5",),
     "track.sharpness_sigma=0.5 is not read: track.sharpness=false measures no ShOp/ShPred"),
    (("track.loss_sharpness_sigma=0.5",), "track.loss_sharpness_sigma=0.5 is not read: "
                                          "track.loss_sharpness=false measures no sharpness/loss"),
])
def test_a_track_setting_whose_measurement_is_off_is_said(extra: tuple[str, ...], said: str):
    """Before: accepted, kept in config.json (which reports set runs apart by) and never read:
    the run recorded exactly what it recorded without it."""
    with pytest.warns(UserWarning) as caught:
        t = _tracker(*extra)
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and msgs[0].startswith(said), msgs
    assert "or drop track." in msgs[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few flips on 16 examples
        recorded = t.measure("ce")
    assert not {"sens/val", "sharpness/shop", "sharpness/loss"} & set(recorded)


def test_track_settings_that_are_read_are_not_said():
    """The same settings with their measurement on, and track.num_examples/track.repeats with
    track.sigma=0 (`senslab measure --checkpoint` reads them as its defaults), say nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _tracker("track.val=true", "track.sharpness=true", "track.sharpness_sigma=0.5",
                 "track.loss_sharpness=true", "track.loss_sharpness_sigma=0.5")
        _tracker("track.sigma=0", "track.repeats=4", "track.num_examples=8")
