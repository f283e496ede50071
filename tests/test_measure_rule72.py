"""``senslab measure --checkpoint`` reads a run's outputs with the decision rule its training
tracked ``sens/*`` with (:func:`senslab.train.track.decision_rule`), and says which.

A run trained with ``train.loss=mse`` on a one-column model regresses the {0, 1} label, so its
tracker reads class = output > 0.5; the model itself declares logits (class = sign). Measured by
the model's rule, the command's number for the run's last checkpoint differed from the run's
logged ``sens/train`` for the same weights, examples and noise, without a word."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from runrecords import tracked_record

from senslab.cli import main
from senslab.measure._stats import fixed
from senslab.train.config import RunConfig
from senslab.train.rundir import RunDir

SEED = 3
#: a tiny binary run (digits 3 and 8), tracked with noise large enough to flip some decisions
TRACK = ["--set", "track.sigma=1.0", "--set", "track.repeats=4", "--set", "track.num_examples=32",
         "--set", "track.eval_examples=64", "--set", "track.val=true"]
MEASURE = ["--sigma", "1.0", "--repeats", "4", "--num-examples", "32", "--seed", str(SEED),
           "--precision", "float32", "--threads", "1"]
#: loss → the model's extra settings and the rule its tracker reads the outputs with
LOSSES = {
    "mse": (["--set", "model.overrides.num_classes=1"], ("scores", 0.5)),
    "bce": (["--set", "model.overrides.num_classes=1"], ("logits", None)),
    "auto": (["--set", "model.overrides.num_classes=1"], ("logits", None)),
    "ce": ([], ("logits", None)),
}


def _train(tmp_path: Path, loss: str) -> Path:
    out = tmp_path / loss
    assert main(["train", "--model", "mlp", "--data", "digits", "--seed", str(SEED),
                 "--threads", "1", "--out", str(out), "--set", "data.options.digits=[3, 8]",
                 "--set", f"train.loss={loss}", "--set", "train.epochs=3", "--set", "device=cpu",
                 *LOSSES[loss][0], *TRACK]) == 0
    return out


def _measured(run: Path, split: str, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """The command's sensitivity (as printed) and its notes."""
    capsys.readouterr()
    assert main(["measure", "--checkpoint", str(run), "--split", split, *MEASURE]) == 0
    captured = capsys.readouterr()
    rows = [line.split() for line in captured.out.splitlines() if re.match(r"\s+1\s", line)]
    assert len(rows) == 1, captured.out
    return rows[0][1], captured.err


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_measure_checkpoint_reproduces_the_runs_tracked_sensitivity(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], loss: str) -> None:
    from senslab.train.loop import build_model, load_data
    from senslab.train.track import decision_rule

    run = _train(tmp_path, loss)
    record = tracked_record(run)
    for split, key in (("train", "sens/train"), ("test", "sens/val")):
        estimate, notes = _measured(run, split, capsys)
        assert record[key] > 0  # some copies flipped: the two numbers could disagree
        assert estimate == fixed(record[key]), (split, notes)
    kind, threshold = LOSSES[loss][1]
    said = f"train.loss={loss}: " + (f"class = output > {threshold:g}" if threshold is not None
                                     else "class = argmax, one column: its sign")
    assert said in notes and f"output_kind={kind}" in notes, notes
    # the rule the command said is the one the run's tracker works out for these weights
    cfg = RunConfig.from_dict(json.loads((run / "config.json").read_text()))
    train, _ = load_data(cfg)
    model = build_model(cfg, train)
    assert decision_rule(cfg, model, train, torch.device("cpu")) == (kind, threshold)


def test_the_mse_run_is_one_where_the_models_own_rule_disagrees(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The case above is not vacuous: read by the model's declared rule (logits, class = sign),
    the same weights, examples and noise give another number than the run logged."""
    from senslab.measure import TokenSensitivity
    from senslab.tokens import auto_tokens
    from senslab.train.loop import build_model, load_data
    from senslab.train.rundir import load_model_state

    run = _train(tmp_path, "mse")
    record = tracked_record(run)
    cfg = RunConfig.from_dict(json.loads((run / "config.json").read_text()))
    train, _ = load_data(cfg)
    model = build_model(cfg, train)
    found = RunDir(run).load_latest()
    assert found is not None
    load_model_state(model, found[1]["model"], found[0])
    assert model.output_kind == "logits"
    subset = train.first(32, generator=torch.Generator().manual_seed(SEED + 1))
    x, _ = subset.batch(slice(0, None))
    by_model = TokenSensitivity(model, auto_tokens(model), sigma=1.0, repeats=4, generator=SEED,
                                precision="float32")
    by_model.update(x)
    own = by_model.compute().estimate
    assert record["sens/train"] > 0 and fixed(own) != fixed(record["sens/train"])
    estimate, notes = _measured(run, "train", capsys)
    assert estimate == fixed(record["sens/train"]) != fixed(own), notes
