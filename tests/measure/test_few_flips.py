"""A standard error estimated from no flip, or from a handful, is no evidence of precision:
``compute`` says so (once per metric), with the rule of three's bound 3/N where none of N copies
flipped, and a batch that ``target_stderr`` stopped without a flip reports the standard error of
that bound instead of the 0 (or, with the control variate, the tangent's spread) it estimated.
The counts behind the warning travel with the state: merge, all_reduce, reset."""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path

import pytest
import torch

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Sequence

from .test_allocation import SIGMA, linear_case

NONE = "the standard error rests on no flip"
FEW = "the standard error rests on few flips"


def never(inp: torch.Tensor) -> torch.Tensor:
    """A constant logit: no copy ever flips."""
    return inp.sum((1, 2)) * 0 + 1.0


#: the warning that flips of tied clean classes are counted (first_entry's examples at 0)
TIES = "the sensitivity counts flips of examples whose clean class is a tie"


def first_entry(inp: torch.Tensor) -> torch.Tensor:
    """The logit is token 0's first entry: a copy of an example where it is 0 flips when its
    noise there is positive (probability 1/2); where it is 100.5, never (not a whole number:
    a column of whole numbers, some ≥ 2, reads as class labels); other tokens never."""
    return inp[:, 0, 0]


def inputs(b: int, offset: float = 0.0, t: int = 4) -> torch.Tensor:
    x = torch.zeros(b, t, 2)
    x[:, 0, 0] = offset
    return x


def rule_of_three_se(copies: int) -> float:
    """The subset standard error of every token flipping at p = 3/N, N copies spread evenly over
    equally long examples: sqrt(p(1 − p)/N)."""
    p = 3 / copies
    return math.sqrt(p * (1 - p) / copies)


def said(caught: list[warnings.WarningMessage], text: str) -> list[str]:
    return [str(w.message) for w in caught if text in str(w.message)]


def flips(r, tokens: int, repeats: int) -> int:
    """Copies that flipped, from the per-example rates (equally long examples)."""
    return round(float(r.per_sample.double().sum()) * tokens * repeats)


# -- target_stderr: a stop without a flip reports the rule of three's standard error ------------

def test_a_control_variate_stop_without_a_disagreement_reports_the_rule_of_three():
    """With the control variate a linear model's flips are its tangent's: no copy disagrees,
    the first round's standard error was the spread of the tangent's probabilities between
    tokens, and the rule of three let it stop there. It now reports that bound's standard
    error (the estimate is unchanged: the tangent's mean)."""
    model, x, _ = linear_case()
    b = x.shape[0]
    r = token_sensitivity(model, x, Sequence(), sigma=SIGMA, generator=0, estimand="subset",
                          control_variate="linear", target_stderr=0.02, precision="float32")
    copies = r.num_forward - 2 * b  # a clean forward and a tangent per example
    assert r.stderr_subset == pytest.approx(rule_of_three_se(copies), rel=1e-9)
    assert r.stderr_subset <= 0.02
    # the same run without a target: the same copies, the tangent's spread as its error
    plain = token_sensitivity(model, x, Sequence(), sigma=SIGMA, generator=0, estimand="subset",
                              control_variate="linear", precision="float32",
                              repeats=copies // x[0].shape[0] // b)
    assert r.estimate == plain.estimate and plain.stderr_subset < r.stderr_subset


@pytest.mark.parametrize("options", [{"repeats": 2}, {"mode": "whole", "repeats": 4}])
def test_a_target_stop_without_a_flip_reports_the_rule_of_three_not_zero(options):
    """No flip: the rule of three's standard error (with ``mode="whole"`` an example is one
    token, so the same formula), within the target. Flips: what the batch estimated, the same
    as without a target."""
    _, x, _ = linear_case()
    b = x.shape[0]
    r = token_sensitivity(never, x, Sequence(), sigma=SIGMA, generator=0, estimand="subset",
                          target_stderr=0.05, **options)
    assert r.estimate == 0.0
    assert r.stderr_subset == pytest.approx(rule_of_three_se(r.num_forward - b), rel=1e-9)
    assert 0 < r.stderr_subset <= 0.05
    x = inputs(16)
    ada = token_sensitivity(first_entry, x, Sequence(), sigma=1.0, generator=3, estimand="subset",
                            target_stderr=0.5, **options)
    plain = token_sensitivity(first_entry, x, Sequence(), sigma=1.0, generator=3,
                              estimand="subset", **options)
    assert ada.num_forward == plain.num_forward  # one round
    assert ada.estimate == plain.estimate > 0 and ada.stderr_subset == plain.stderr_subset


@pytest.mark.parametrize("options", [{"allocation": "uniform", "budget": 0.5},
                                     {"allocation": "linear", "budget": 0.5}])
def test_an_allocation_stop_without_a_flip_reports_a_standard_error(options):
    _, x, _ = linear_case()
    r = token_sensitivity(never, x, Sequence(), sigma=SIGMA, generator=0, estimand="subset",
                          target_stderr=0.02, **options)
    assert r.estimate == 0.0 and 0 < r.stderr_subset <= 0.02


# -- compute warns where the standard error rests on few flips ----------------------------------

def test_no_flip_warns_once_with_the_rule_of_three():
    x = inputs(6, offset=100.5)
    metric = TokenSensitivity(first_entry, Sequence(), sigma=1.0, repeats=2, generator=0)
    metric.update(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = metric.compute()
        metric.compute()
    copies = r.num_forward - 6
    assert r.estimate == 0.0 and r.stderr == 0.0
    (message,) = said(caught, NONE)
    assert f"none of the {copies} perturbed copies" in message
    assert f"3/{copies} = {3 / copies:.2g}" in message
    assert not said(caught, FEW)


def test_a_few_flips_warn_and_ten_do_not():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = token_sensitivity(first_entry, inputs(2), Sequence(), sigma=1.0, repeats=2,
                              generator=0)
    k = flips(r, 4, 2)
    assert 0 < k < 10
    (message,) = said(caught, FEW)
    assert f"only {k} of the {r.num_forward - 2} perturbed copies" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # first_entry's 0 sits on the boundary: a tie, said so, by design of this toy
        warnings.filterwarnings("ignore", message=TIES)
        many = token_sensitivity(first_entry, inputs(16), Sequence(), sigma=1.0, repeats=4,
                                 generator=0)
    assert flips(many, 4, 4) >= 10


def test_the_control_variate_counts_copies_that_disagree_with_the_tangent():
    """A linear model's adjusted values v − c + q are nonzero on nearly every copy, yet none
    of its copies flips otherwise than its tangent: no flip to estimate an error from."""
    model, x, _ = linear_case()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = token_sensitivity(model, x, Sequence(), sigma=SIGMA, generator=0,
                              control_variate="linear", precision="float32")
    assert r.estimate > 0
    (message,) = said(caught, NONE)
    assert "otherwise than the model's tangent" in message


def test_the_counts_merge_and_reset():
    """Two metrics of 1–9 flips each warn alone; merged they hold 10 or more and do not. After
    a reset the counts start again: a batch without a flip warns, whatever came before."""
    x = inputs(4)
    a = TokenSensitivity(first_entry, Sequence(), sigma=1.0, repeats=4, generator=1)
    b = TokenSensitivity(first_entry, Sequence(), sigma=1.0, repeats=4, generator=2)
    a.update(x)
    b.update(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ka, kb = flips(a.compute(), 4, 4), flips(b.compute(), 4, 4)
    assert 0 < ka < 10 and 0 < kb < 10 and ka + kb >= 10
    assert len(said(caught, FEW)) == 2
    merged = TokenSensitivity(first_entry, Sequence(), sigma=1.0, repeats=4, generator=3)
    merged.merge(a).merge(b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=TIES)  # first_entry's 0: a tie, by design
        assert flips(merged.compute(), 4, 4) == ka + kb
    merged.reset()
    merged.update(inputs(4, offset=100.5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        merged.compute()
    assert len(said(caught, NONE)) == 1


def test_the_counts_survive_all_reduce(tmp_path: Path):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        m = TokenSensitivity(first_entry, Sequence(), sigma=1.0, repeats=4, generator=1)
        m.update(inputs(4))
        copies, events = m.state.copies, m.state.events
        assert copies == 64 and 0 < events < 10
        total = m.all_reduce().state
        assert (total.copies, total.events) == (copies, events)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m.compute()
        assert len(said(caught, FEW)) == 1
    finally:
        dist.destroy_process_group()


def test_a_rare_rate_prints_its_digits():
    """``str`` of a result printed four decimals: a rate of 4.3e-05 (one flip in 23,008 copies)
    read ``sensitivity 0.0000 ± 0.0000``, no flip at all and known exactly."""
    r = token_sensitivity(first_entry, inputs(2), Sequence(), sigma=1.0, repeats=2, generator=0)
    rare = dataclasses.replace(r, estimate=4.3e-5, stderr=4.3e-5, ci95=(0.0, 1.3e-4))
    assert str(rare).startswith("sensitivity 0.000043 ± 0.000043 (95% CI 0.0000–0.00013,")
    near = dataclasses.replace(r, estimate=0.99996, stderr=0.25, ci95=(0.5, 1.0))
    assert str(near).startswith("sensitivity 0.99996 ± 0.2500 (95% CI 0.5000–1.0000,")
