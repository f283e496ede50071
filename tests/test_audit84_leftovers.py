"""audit84 leftovers: a ladder stopped by a failing rung rewrites ladder.json from the rungs as
they are; loading states into a metric that had measured restarts its noise from the seed; the
command's help holds no reST markup."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from senslab.cli import parser
from senslab.experiments import get_experiment
from senslab.experiments.base import Rung
from senslab.experiments.ladder import run_ladder, summarize_ladder

#: two CPU rungs of ib_joint that train in about a second (as tests/experiments/test_ladders.py)
TINY = (
    Rung("small", "cpu", ("steps=40",), size=40, note="40 steps"),
    Rung("large", "cpu", ("steps=120",), size=120, note="120 steps"),
)
EXP = "ib_joint"


def test_a_failing_rung_rewrites_ladder_json_from_the_rungs_as_they_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rung's runs trained under new settings (its verdict of the old ones set aside), then
    the verdict failed: ladder.json had stayed the earlier invocation's, "done" with 3 seeds."""
    cls = type(get_experiment(EXP))
    monkeypatch.setattr(cls, "ladder", TINY)
    # an earlier state: rung small finished with 3 seeds (as another machine leaves it)
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "experiment.json").write_text(json.dumps(
        {"name": EXP, "scale": "cpu", "runs": []}))
    (tmp_path / "small" / "verdict.json").write_text(json.dumps(
        {"verdict": "inconclusive", "reason": "r", "effects": {}, "scale": "cpu",
         "overrides": ["steps=40", "seeds=3"], "seeds": 3}))
    first = summarize_ladder(EXP, tmp_path)
    assert first["rungs"][0]["status"] == "done" and first["rungs"][0]["seeds"] == 3

    def fail(self: object, summaries: object) -> dict:
        raise RuntimeError("the verdict failed")

    monkeypatch.setattr(cls, "verdict", fail)
    with pytest.raises(RuntimeError, match="the verdict failed"):  # the failure itself, raised
        run_ladder(EXP, tmp_path, rungs=["small"], extra=["seeds=1"], log=lambda _: None)
    lad = json.loads((tmp_path / "ladder.json").read_text())
    small = lad["rungs"][0]
    assert small["status"].startswith("started, not finished") and "seeds" not in small
    assert not (tmp_path / "small" / "verdict.json").exists()  # set aside, as the record says
    assert "rung small failed (RuntimeError: the verdict failed)" in lad["stopped"]
    assert lad["summary"].startswith("no rung has a verdict yet. Not finished: small")
    assert "Stopped: rung small failed" in lad["summary"]


def test_a_ladder_refused_before_its_directory_exists_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(get_experiment(EXP)), "ladder", TINY)
    from senslab.train.config import UnknownKey

    with pytest.raises(UnknownKey):
        run_ladder(EXP, tmp_path / "lad", rungs=["small"], extra=["stepz=3"],
                   log=lambda _: None)
    assert not (tmp_path / "lad").exists()


def test_loading_states_into_a_metric_that_measured_gives_a_fresh_metrics_numbers() -> None:
    """The docstring's "a loaded metric starts from the seed" held only for a fresh metric: one
    that had measured drew on from where its stream stood (0.0897 against 0.0962 here)."""
    pytest.importorskip("torchmetrics")
    from senslab.integrations.torchmetrics import TokenSensitivityMetric
    from senslab.tokens import Patches

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))
    x = torch.randn(13, 1, 8, 8, generator=torch.Generator().manual_seed(1))

    def metric() -> TokenSensitivityMetric:
        m = TokenSensitivityMetric(Patches(2), sigma=1.0, repeats=3, generator=7)
        m.persistent(True)
        return m

    src = metric()
    src.update(model, x[:5])
    states = src.state_dict()
    fresh, used = metric(), metric()
    fresh.load_state_dict(states)
    used.update(model, x[5:9])  # measured (other examples), then loads the same states
    used.load_state_dict(states)
    for m in (fresh, used):
        m.update(model, x[5:])
    a, b = fresh.result(), used.result()
    assert a.num_examples == b.num_examples == 13
    assert torch.equal(a.per_sample, b.per_sample)
    assert a.estimate == b.estimate


def _helps(p: argparse.ArgumentParser, path: str) -> dict[str, str]:
    out = {path: p.format_help()}
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(_helps(sub, f"{path} {name}"))
    return out


def test_the_help_text_holds_no_rest_markup() -> None:
    """`senslab --help` read "The ``senslab`` command: …" (the module docstring's markup)."""
    helps = _helps(parser(), "senslab")
    assert len(helps) > 5  # the command and its subcommands
    leaked = {k: [line for line in v.splitlines() if "``" in line] for k, v in helps.items()}
    assert not any(leaked.values()), leaked
    assert "The senslab command: train, measure" in helps["senslab"]
