"""ShPred said how little its interval rests on (audit sharp71): weight draws that flip no
prediction read ``0 ± 0 (95% CI 0–0)`` without a word, while token-wise and Boolean sensitivity
warn of no or few flips. The draws are ShPred's sampling unit, so the bound is that of R draws,
1 − 0.05^(1/R), not the rule of three over the R·B predictions; a training run says it once."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure.sharpness import output_sharpness


class _Margins(nn.Module):
    """One logit per example, w·x + b (w = 1, b = 0): the input is each example's margin, and a
    weight draw flips an example about when its noise on b outweighs the margin."""

    output_kind = "logits"

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.b = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x + self.b


def _shpred_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("ShPred's standard")]


def _measure(x: torch.Tensor, **kw) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = output_sharpness(_Margins(), x, generator=0, **kw)
    return res, _shpred_warnings(caught)


def test_no_flip_warns_with_the_bound_of_the_draws():
    """Margins of 10 at sigma_w=0.05: no draw flips anything; ShPred 0 ± 0 (CI 0–0) was said
    without a word. The bound is that of 5 draws, 1 − 0.05^(1/5) = 0.45, not 3/(5·8)."""
    res, said = _measure(torch.full((8,), 10.0))
    assert res.shpred.estimate == 0 and res.shpred.ci95 == (0.0, 0.0)  # the number is unchanged
    assert len(said) == 1
    msg = said[0]
    assert msg.startswith("ShPred's standard error rests on no flip: none of the 5 weight draws")
    assert "1 - 0.05^(1/5) = 0.45" in msg and "3/5" in msg and "repeats=" in msg
    # 20 draws: 0.14
    _, said = _measure(torch.full((8,), 10.0), repeats=20)
    assert "1 - 0.05^(1/20) = 0.14" in said[0]


def test_few_flipped_draws_warn():
    """One example at margin 0.001 among margins of 10: some draws flip it, some do not — a
    standard error from a handful of 1/8 steps and exact zeros."""
    res, said = _measure(torch.tensor([1e-3] + [10.0] * 7))
    flipped = int((res.shpred.per_draw > 0).sum())
    assert 0 < flipped < 5  # the case at stake: some draws flipped, not all
    assert len(said) == 1
    assert said[0].startswith(f"ShPred's standard error rests on few flips: {flipped} of the 5 "
                              "weight draws flipped a prediction")


def test_every_draw_flipping_many_says_nothing():
    """64 examples near the boundary: every draw flips many predictions; the spread is the
    draws' own. And at sigma_w=0 nothing can flip: its 0 is exact."""
    x = (torch.arange(64.0) - 31.5) * 1e-5
    res, said = _measure(x)
    assert bool((res.shpred.per_draw > 0).all()) and said == []
    res, said = _measure(torch.full((8,), 10.0), sigma_w=0.0)
    assert res.shpred.estimate == 0 and said == []


def test_a_tracked_run_says_it_once():
    """track.sharpness measures ShPred at every evaluation: the warning is said once per run
    (the tracker's said set), not once per evaluation with other numbers."""
    from senslab.train.config import RunConfig, apply_overrides
    from senslab.train.loop import build_model, load_data
    from senslab.train.track import Tracker

    cfg = apply_overrides(RunConfig(name="t"), [
        "data.name=digits", "model.name=mlp", "track.num_examples=16", "track.sigma=0",
        "track.eval_examples=16", "track.sharpness=true", "track.sharpness_sigma=1e-6"])
    train, test = load_data(cfg)
    torch.manual_seed(0)
    t = Tracker(cfg, build_model(cfg, train), train, test, torch.device("cpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            rec = t.measure("ce")
    assert rec["sharpness/shpred"] == 0
    said = _shpred_warnings(caught)
    assert len(said) == 1 and "rests on no flip" in said[0]


@pytest.mark.parametrize("repeats", [1, 5, 100])
def test_the_bound_is_that_of_the_draws(repeats):
    """1 − 0.05^(1/R) is the exact 95% bound for 0 of R and lies below the rule of three."""
    from senslab.measure.sharpness import _no_flip_bound

    bound = _no_flip_bound(repeats)
    assert (1 - bound) ** repeats == pytest.approx(0.05)
    assert bound <= 3 / repeats


def test_a_hahn_rofin_run_saves_its_decision_rule(tmp_path):
    """The Hahn & Rofin trainer regresses boolean_transformer onto {0, 1} (class = output > 1/2)
    while the model declares logits (class = sign). Its checkpoints held the weights only, so
    a model rebuilt from one and measured as declared counted class changes at 0 without a
    word; every checkpoint and the summary now hold the rule the run measured with, and the
    rebuilt model measured by it gives the run's own as(f̂)."""
    import dataclasses
    import json

    from senslab.measure import boolean_sensitivity
    from senslab.models import create_model
    from senslab.train.loops.boolean import example, train_boolean
    from senslab.train.rundir import RunDir

    cfg = dataclasses.replace(example(), function="majority", steps=40, eval_every=20)
    summary = train_boolean(cfg, tmp_path / "run")
    rule = {"output_kind": "scores", "threshold": 0.5}
    assert summary["decision"] == rule
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["decision"] == rule
    _, state = RunDir(tmp_path / "run").load_latest()
    assert state["decision"] == rule
    model = create_model("boolean_transformer", n_bits=cfg.n, dim=cfg.dim, ff_dim=cfg.dim,
                         layers=cfg.layers, heads=cfg.heads, init=cfg.init)
    model.load_state_dict(state["model"])
    got = boolean_sensitivity(model.eval(), cfg.n, threshold=state["decision"]["threshold"])
    assert got.average == pytest.approx(summary["final"]["bool_sens"])
    mean = dataclasses.replace(cfg, function="mean")
    assert train_boolean(mean, tmp_path / "mean")["decision"] == {
        "output": "real", "transform": "2 * out - 1"}
