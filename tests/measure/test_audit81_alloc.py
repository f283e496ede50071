"""Audit 81, draws and their helpers (``._alloc``, ``._control``, ``._compiled``): the rule of
three's bound after a handful of draws, the tangent under a float64 default dtype, and a hook
added to a model after its copies were compiled."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, _alloc, token_sensitivity
from senslab.tokens import Patches, Sequence


def _one_token(seed: int = 0) -> tuple[nn.Module, torch.Tensor, float]:
    """One example of one token whose logit flips at a rate of 0.02 under σ = 1: a linear
    logit, so the rate is exact, Φ(−|z|/‖w‖)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(1, 2, generator=g)
    x = torch.randn(1, 1, 2, generator=g)

    def model(inp: torch.Tensor) -> torch.Tensor:
        return (inp * w).sum((1, 2)) + 0.3

    rate = float(torch.special.ndtr(-model(x).abs() / w.norm()))
    return model, x, rate


# -- zero_bound: the rule of three never bounds the standard error by 0 ------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_the_zero_bound_after_a_few_draws_is_the_largest_variance(n: int) -> None:
    """At p = 3/N the bound fell to 0 at N ≤ 3 draws (p = 1) and below the worst case up to
    N = 5: after so few draws without a flip any rate up to 1/2 is still plausible."""
    valid = torch.ones(1, 1, dtype=torch.bool)
    got = _alloc.zero_bound(torch.full((1, 1), float(n), dtype=torch.float64), valid)
    assert got == pytest.approx(math.sqrt(0.25 / n))
    # from N = 6 on it is the rule of three's p = 3/N, as before
    assert _alloc.zero_bound(torch.full((1, 1), 12.0, dtype=torch.float64), valid) == \
        pytest.approx(math.sqrt(0.25 * 0.75 / 12))


@pytest.mark.parametrize("options", [{}, {"allocation": "uniform"}, {"mode": "whole"}],
                         ids=["draws", "uniform", "whole"])
@pytest.mark.filterwarnings("ignore:the standard error rests on")
@pytest.mark.filterwarnings("ignore:allocation='uniform' drew fewer")
def test_one_token_with_a_target_does_not_stop_at_zero_after_two_draws(options) -> None:
    """One example of one token (or ``mode="whole"``, one example) at a flip rate of 0.02 with
    ``target_stderr=0.05`` stopped after two draws at 0 ± 0 in 97.5% of calls (2.5% of the 95%
    intervals covered the rate): the rule of three's bound was 0 there. Now the rounds go on
    until 3/N is a bound worth the target, and a run without a flip reports it."""
    model, x, rate = _one_token()
    assert 0.01 < rate < 0.03
    covered = 0
    for seed in range(6):
        r = token_sensitivity(model, x, Sequence(), sigma=1.0, generator=seed,
                              estimand="subset", target_stderr=0.05, **options)
        assert r.num_forward >= 30, (seed, r.num_forward)  # was 3 or 4
        assert r.stderr > 0, seed
        covered += abs(r.estimate - rate) <= 1.96 * r.stderr
    assert covered >= 5


# -- LinearControl under a float64 default dtype -------------------------------------------------


@pytest.fixture
def default_dtype():
    previous = torch.get_default_dtype()
    yield
    torch.set_default_dtype(previous)


@pytest.mark.parametrize("options", [{"allocation": "linear"},
                                     {"control_variate": "linear", "repeats": 2},
                                     {"allocation": "linear", "target_stderr": 0.02}],
                         ids=["linear", "control_variate", "linear-target"])
@pytest.mark.parametrize("model_dtype", [torch.float32, torch.float64])
@pytest.mark.filterwarnings("ignore:the standard error rests on")
def test_the_tangent_under_a_float64_default_dtype(options, model_dtype, default_dtype) -> None:
    """``torch.set_default_dtype(torch.float64)`` (a float64 model's usual setting) made the
    tangent's buffers float64, and putting the float32 margins in failed with a raw
    ``Index put requires the source and destination dtypes match``. The tangent is now float32
    whatever the default, as the copies' noise is, so the numbers are those of the float32
    default."""
    torch.manual_seed(0)  # test-only: the layer's initialisation
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10)).to(model_dtype)
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(1)).to(model_dtype)

    def measure():
        return token_sensitivity(model, x, Patches(4), sigma=0.5, generator=0,
                                 precision="float32", **options)

    ref = measure()
    torch.set_default_dtype(torch.float64)
    got = measure()
    torch.set_default_dtype(torch.float32)
    assert 0 < ref.estimate < 1
    assert (got.estimate, got.stderr) == (ref.estimate, ref.stderr)
    assert torch.equal(got.per_sample, ref.per_sample)


# -- compile=True: a hook added after the first compile ------------------------------------------


@pytest.mark.filterwarnings("ignore:the standard error rests on")
def test_a_hook_added_after_compiling_reaches_the_copies(eager_compile) -> None:
    """Dynamo does not guard on module hooks by default: a hook added between two measurements
    of one ``compile=True`` metric ran in the clean forward (eager) but not in the copies (the
    graph compiled before it), and a hook negating the logits measured 0.88 where eager
    measured 0.12. The copies now compile again when the hooks change, and agree with eager
    before, with and after the hook."""
    torch.manual_seed(0)  # test-only: the layer's initialisation
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 2)).eval()
    x = torch.randn(16, 4, 3, generator=torch.Generator().manual_seed(0))
    compiled = TokenSensitivity(model, Sequence(), sigma=1.0, generator=0, repeats=2,
                                compile=True)
    eager = TokenSensitivity(model, Sequence(), sigma=1.0, generator=0, repeats=2)

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for metric in (compiled, eager):
            metric.reset()
            metric.update(x)
            out.append(metric.compute().per_sample)
        return out[0], out[1]

    a, b = both()
    assert torch.equal(a, b)
    hook = model[1].register_forward_hook(lambda module, inputs, out: -out)
    a, b = both()
    assert torch.equal(a, b)
    assert 0 < float(b.mean()) < 0.5  # the hook's own flips, not nearly every copy's
    hook.remove()
    a, b = both()
    assert torch.equal(a, b)
