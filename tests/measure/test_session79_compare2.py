"""Paired comparisons: a NaN paired subset standard error, and tie-breaks one model counts.

With ``estimand="subset"`` an example of a single unit of noise draws leaves every standard
error NaN. Each model's metric said its own (named by the comparison); the differences'
``a − b: +0.0312 ± nan paired (95% CI +nan–+nan; …, subset)`` came with no word. A model whose
examples tie (a bias-free head on blank inputs) against one whose do not gave a "significant"
difference that was all tie-breaks, said only of the model, not of the difference.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

from senslab.measure import CompareSensitivity, compare_sensitivity
from senslab.tokens import Sequence

ONE_UNIT = "the paired standard error rests on a single unit of noise draws"
TIES = "the paired difference counts flips of examples whose clean class is a tie"


def _model(seed: int, bias: bool = True) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(24, 3, bias=bias)).eval()


def _x(n: int = 32) -> torch.Tensor:
    return torch.randn(n, 6, 4, generator=torch.Generator().manual_seed(1))


def _caught(fn):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(x.message) for x in w]


def _compare(models, x, **options):  # type: ignore[no-untyped-def]
    return compare_sensitivity(models, x, Sequence(), generator=0, **options)


DESIGNS = {
    "whole": dict(mode="whole", repeats=1),
    "whole antithetic": dict(mode="whole", repeats=2, antithetic=True),
    "num_tokens=1": dict(num_tokens=1, repeats=3),
    "num_tokens=1 antithetic": dict(num_tokens=1, repeats=2, antithetic=True),
}


@pytest.mark.parametrize("design", list(DESIGNS))
def test_a_single_unit_is_said_of_the_difference(design: str) -> None:
    models = {"a": _model(0), "b": _model(1)}
    r, said = _caught(lambda: _compare(models, _x(), sigma=1.0, estimand="subset",
                                       **DESIGNS[design]))
    d = r.difference("a", "b")
    assert math.isnan(d.stderr) and math.isnan(d.stderr_subset)
    ours = [m for m in said if m.startswith(ONE_UNIT)]
    assert len(ours) == 1
    assert f"a − b = {d.estimate:+.4f} is reported ± nan" in ours[0]
    assert "32 of the 32 examples had one" in ours[0]
    assert "per-example differences, finite here" in ours[0]
    assert "said once per comparison" in ours[0]
    # each model still says its own, named
    for name in ("a", "b"):
        assert sum(m.startswith(f"model {name!r}: the standard error rests on a single unit")
                   for m in said) == 1


def test_one_example_of_one_real_token_makes_it_nan_and_is_counted() -> None:
    mask = torch.ones(32, 6, dtype=torch.bool)
    mask[0, 1:] = False
    models = {"a": _model(0), "b": _model(1)}
    r, said = _caught(lambda: _compare(models, _x(), mask=mask, sigma=1.0, estimand="subset"))
    assert math.isnan(r.difference("a", "b").stderr)
    ours = [m for m in said if m.startswith(ONE_UNIT)]
    assert len(ours) == 1 and "1 of the 32 examples had one" in ours[0]


def test_said_once_per_comparison_over_all_pairs_updates_and_resets() -> None:
    models = {"a": _model(0), "b": _model(1), "c": _model(2)}
    metric = CompareSensitivity(models, Sequence(), generator=0, sigma=1.0, estimand="subset",
                                mode="whole", repeats=1)
    x = _x()

    def run() -> None:
        metric.update(x[:16])
        metric.compute()
        metric.update(x[16:])
        metric.compute()
        metric.reset()
        metric.update(x)
        metric.compute()

    _, said = _caught(run)
    ours = [m for m in said if m.startswith(ONE_UNIT)]
    assert len(ours) == 1
    assert "the paired differences a − b = " in ours[0]
    assert "a − c = " in ours[0] and "b − c = " in ours[0]
    assert "16 of the 16 examples had one" in ours[0]  # the first compute's
    # a new comparison says it again
    _, again = _caught(lambda: _compare({"a": _model(0), "b": _model(1)}, x, sigma=1.0,
                                        estimand="subset", mode="whole", repeats=1))
    assert sum(m.startswith(ONE_UNIT) for m in again) == 1


@pytest.mark.parametrize("options", [
    dict(estimand="subset", num_tokens=2, repeats=3),  # two units: finite
    dict(estimand="subset", repeats=2, antithetic=True),
    dict(mode="whole", repeats=1),  # data: finite on 32 examples, stderr_subset NaN unused
])
def test_not_said_where_the_paired_standard_error_is_finite(options: dict) -> None:
    r, said = _caught(lambda: _compare({"a": _model(0), "b": _model(1)}, _x(), sigma=1.0,
                                       **options))
    assert math.isfinite(r.difference("a", "b").stderr)
    assert not any(m.startswith(ONE_UNIT) for m in said)


def test_no_disagreement_on_a_single_unit_shows_no_nan_interval() -> None:
    a = _model(0)
    r, said = _caught(lambda: _compare({"a": a, "b": copy.deepcopy(a)}, _x(), sigma=0.01,
                                       estimand="subset", mode="whole", repeats=1))
    assert math.isnan(r.difference("a", "b").stderr)
    no = [m for m in said if "rests on no copy on which the two models differ" in m]
    assert len(no) == 1
    assert "CI +nan" not in no[0] and "± nan, subset: a single unit of draws" in no[0]
    assert sum(m.startswith(ONE_UNIT) for m in said) == 1


def _blank(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[:5] = 0  # under a head without bias: logits exactly 0, a tie
    return x


def test_a_difference_of_one_models_tie_breaks_is_said_once_per_pair() -> None:
    x = _blank(_x())
    models = {"tied": _model(0, bias=False), "free": _model(1), "other": _model(2)}
    metric = CompareSensitivity(models, Sequence(), generator=0, sigma=0.01, repeats=4)

    def run():  # type: ignore[no-untyped-def]
        metric.update(x[:16])
        metric.compute()
        metric.update(x[16:])
        return metric.compute()

    r, said = _caught(run)
    d = r.difference("tied", "free")
    assert r.results["free"].estimate == 0  # so the difference is the tied model's ties
    assert d.estimate > 0 and d.ci95[0] > 0  # all of it the tie-breaks
    # each model's own: once, named; only the tied model's
    own = [m for m in said if "the sensitivity counts flips of examples whose clean" in m]
    assert len(own) == 1 and own[0].startswith("model 'tied': ")
    ours = [m for m in said if m.startswith(TIES)]
    assert len(ours) == 2  # tied − free and tied − other, once each over two computes
    assert any("tied − free = " in m for m in ours) and any("tied − other" in m for m in ours)
    assert not any("free − other" in m for m in ours)
    st = metric.metrics["tied"].state
    share = st.tie_rates / st.n
    assert share == pytest.approx(r.results["tied"].estimate)  # every flip a tied example's
    first = next(m for m in ours if "tied − free" in m)
    # said at the first compute, of its 16 examples (all 5 tied ones among them)
    assert "of 'tied' (5 of the 16 examples tie; their flips make" in first
    assert "of its sensitivity)" in first and "of 'free' (none tie)" in first
    assert "said once per pair" in first


def test_the_same_ties_in_both_models_are_left_to_each_models_warning() -> None:
    x = _blank(_x())
    r, said = _caught(lambda: _compare({"a": _model(0, bias=False), "b": _model(1, bias=False)},
                                       x, sigma=0.01, repeats=4))
    own = [m for m in said if "the sensitivity counts flips of examples whose clean" in m]
    assert sorted(m[:9] for m in own) == ["model 'a'", "model 'b'"]
    assert not any(m.startswith(TIES) for m in said)
    # and no tie at all: nothing
    _, clean = _caught(lambda: _compare({"a": _model(0), "b": _model(1)}, _x(), sigma=0.01,
                                        repeats=4))
    assert not any(m.startswith(TIES) or "clean class is a tie" in m for m in clean)
