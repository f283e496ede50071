"""Paired comparisons (``compare_sensitivity``/``CompareSensitivity``): every model sees the same
perturbed copies, the estimates are each model's own, and the paired standard error of a
difference keeps its promise.

The coverage tests follow tests/measure/test_coverage.py: two *different* linear classifiers
z_a = Σ_t w_a,t·x_t + b_a and z_b (w_b = w_a + a small perturbation) have closed-form flip
probabilities Φ(−|z|/(σ‖w_t‖)); seeing the same noise, their flips are correlated, so the paired
s.e. is well below the unpaired sqrt(se_a² + se_b²). Over many replicates the paired 95% interval
covers the true difference in [93.5, 96.5]% of them, and with the s.e. scaled by 0.9 it does not
(the test would catch a standard error 10% too small).
"""

from __future__ import annotations

import math

import pytest
import torch
from metric_models import Logit

from senslab.measure import (
    CompareSensitivity,
    ComparisonResult,
    compare_sensitivity,
    token_sensitivity,
)
from senslab.measure._stats import interval_quantile
from senslab.tokens import Embedding, Sequence

Z95 = 1.96
LOW, HIGH = 0.935, 0.965
T, D = 4, 2
SIGMA = 1.0
MU = 0.25  # "data": examples drawn i.i.d. with entries N(MU, 1)
REPLICATES = 8000  # binomial sd of a coverage: 0.24% at 95%, 0.30% at 92.2%
BIAS_A, BIAS_B = 0.2, 0.3


def _weights() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    wa = torch.randn(T, D, generator=g)
    return wa, wa + 0.25 * torch.randn(T, D, generator=g)


def _replicates(metric: CompareSensitivity, batches) -> dict[str, torch.Tensor]:
    rows = []
    for x in batches:
        metric.update(x)
        r = metric.compute()
        metric.reset()
        d = r.differences["a", "b"]
        ra, rb = r.results["a"], r.results["b"]
        rows.append((d.estimate, d.stderr, d.stderr_unpaired, d.stderr_subset, *d.ci95,
                     ra.estimate - rb.estimate))
    cols = torch.tensor(rows, dtype=torch.float64).unbind(1)
    return dict(zip(("est", "se", "unpaired", "se_subset", "lo", "hi", "ab"), cols, strict=True))


def _coverage(est, se, truth, k: float) -> float:
    return ((est - truth).abs() <= Z95 * k * se).double().mean().item()


def _check_promise(out: dict[str, torch.Tensor], truth, what: str,
                   n: int = 0) -> dict[str, float]:
    est, se = out["est"], out["se"]
    assert torch.isfinite(se).all() and (se > 0).all(), f"{what}: s.e. not positive everywhere"
    # independent replicates (the stream continues across reset), not one repeated measurement
    assert se.unique().numel() > 50, f"{what}: the replicates are not independent"
    assert torch.allclose(out["est"], out["ab"], rtol=0, atol=1e-12)
    q = interval_quantile(what, n) if what == "data" else Z95  # Student's t for "data"
    assert torch.allclose(out["lo"], est - q * se, rtol=0, atol=1e-12)  # not clipped
    cov = {k: _coverage(est, se, truth, k) for k in (1.0, 0.9)}
    ratio = (se.mean() / out["unpaired"].mean()).item()
    info = f"{what}: coverage {cov}, paired/unpaired s.e. {ratio:.3f}"
    assert LOW <= cov[1.0] <= HIGH, info
    assert cov[0.9] < LOW, info
    assert ratio < 0.8, info  # pairing pays: the paired s.e. is clearly the smaller one
    return {**cov, "ratio": ratio}


# -- coverage ----------------------------------------------------------------------------------


@pytest.mark.heavy
def test_paired_subset_interval_covers_the_fixed_set_difference(linear):
    """estimand="subset" on fixed examples, all tokens, repeats=4: the stratified variance of
    the per-cell differences of paired units."""
    wa, wb = _weights()
    x = 0.5 * torch.randn(64, T, D, generator=torch.Generator().manual_seed(1))
    pa = linear.flip_probs(x, wa, BIAS_A, SIGMA)
    pb = linear.flip_probs(x, wb, BIAS_B, SIGMA)
    truth = (pa - pb).mean().item()
    assert 0.1 < pa.mean() < 0.4 and abs(truth) > 0.005  # informative, not degenerate
    metric = CompareSensitivity(
        {"a": Logit(wa, BIAS_A), "b": Logit(wb, BIAS_B)}, Sequence(), sigma=SIGMA, repeats=4,
        estimand="subset", generator=2, chunk_size=1024,
    )
    out = _replicates(metric, (x for _ in range(REPLICATES)))
    assert torch.equal(out["se"], out["se_subset"])
    sd = out["est"].std().item()
    assert abs(out["est"].mean().item() - truth) < 4 * sd / REPLICATES**0.5  # unbiased
    _check_promise(out, truth, "subset")


@pytest.mark.heavy
def test_paired_data_interval_covers_the_population_difference(linear):
    """estimand="data": fresh examples per replicate; the interval must cover the population
    difference, and the paired subset s.e. each replicate's own fixed-set difference."""
    wa, wb = _weights()
    truth = (linear.population_truth(wa, BIAS_A, SIGMA, MU)
             - linear.population_truth(wb, BIAS_B, SIGMA, MU))
    n = 128
    data = MU + torch.randn(REPLICATES, n, T, D, generator=torch.Generator().manual_seed(4))
    metric = CompareSensitivity(
        {"a": Logit(wa, BIAS_A), "b": Logit(wb, BIAS_B)}, Sequence(), sigma=SIGMA, repeats=2,
        generator=5, chunk_size=1024,
    )
    out = _replicates(metric, data)
    _check_promise(out, truth, "data", n)
    flat = data.view(-1, T, D)
    fixed = (linear.flip_probs(flat, wa, BIAS_A, SIGMA)
             - linear.flip_probs(flat, wb, BIAS_B, SIGMA)).view(REPLICATES, -1)
    cov = _coverage(out["est"], out["se_subset"], fixed.mean(1), 1.0)
    assert LOW <= cov <= HIGH, f"paired subset s.e. of data replicates covers {cov:.2%}"


# -- pairing: the estimates are each model's own, the noise is shared -------------------------


OPTIONS = [
    dict(repeats=2),
    dict(repeats=4, antithetic=True, estimand="subset"),
    dict(repeats=3, num_tokens=2),
    dict(repeats=3, mode="whole"),
    dict(repeats=2, control_variate="linear"),
    dict(repeats=2, compare="l2"),
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
def test_estimates_equal_each_models_own_measurement(options):
    wa, wb = _weights()
    models = {"a": Logit(wa, BIAS_A), "b": Logit(wb, BIAS_B), "c": Logit(-wa, 0.0)}
    x = torch.randn(9, T, D, generator=torch.Generator().manual_seed(6))
    mask = torch.arange(T)[None] < (torch.arange(9) % T + 1)[:, None]
    r = compare_sensitivity(models, x, Sequence(), mask=mask, sigma=0.7, generator=7,
                            chunk_size=5, **options)
    assert isinstance(r, ComparisonResult) and list(r.results) == ["a", "b", "c"]
    assert list(r.differences) == [("a", "b"), ("a", "c"), ("b", "c")]
    for name, model in models.items():
        own = token_sensitivity(model, x, Sequence(), mask=mask, sigma=0.7, generator=7,
                                chunk_size=5, **options)
        got = r.results[name]
        assert (got.estimate, got.stderr, got.stderr_subset, got.num_forward) == (
            own.estimate, own.stderr, own.stderr_subset, own.num_forward)
        assert torch.equal(got.per_sample, own.per_sample)
    d = r.difference("a", "b")
    assert d.estimate == r.results["a"].estimate - r.results["b"].estimate
    assert torch.allclose(d.per_sample, r.results["a"].per_sample - r.results["b"].per_sample,
                          atol=1e-6)
    se_a, se_b = r.results["a"].stderr, r.results["b"].stderr
    assert d.stderr_unpaired == pytest.approx(math.sqrt(se_a**2 + se_b**2))
    back = r.difference("b", "a")
    assert back.estimate == -d.estimate and back.ci95 == (-d.ci95[1], -d.ci95[0])


class Recorder:
    """Keeps every batch it is called on; ``scale`` makes models differ in their outputs."""

    def __init__(self, scale: float) -> None:
        self.scale, self.calls = scale, []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.detach().clone())
        s = self.scale * x.flatten(1).sum(1)
        return torch.stack([-s, s, s.sin()], 1)


@pytest.mark.parametrize("options", [dict(repeats=3), dict(repeats=4, antithetic=True),
                                     dict(repeats=2, num_tokens=2), dict(mode="whole")],
                         ids=["plain", "antithetic", "subset-of-tokens", "whole"])
def test_every_model_receives_the_same_noise(options):
    """The copies each model is evaluated on are identical (same example, token, noise vector),
    over several updates, with a torch.Generator as well as a seed."""
    a, b = Recorder(1.0), Recorder(-3.0)
    gen = torch.Generator().manual_seed(8)
    metric = CompareSensitivity({"a": a, "b": b}, Sequence(), sigma=0.5, generator=gen,
                                chunk_size=7, **options)
    g = torch.Generator().manual_seed(9)
    for _ in range(3):
        metric.update(torch.randn(5, T, 3, generator=g))
    assert len(a.calls) == len(b.calls) > 3
    assert all(torch.equal(u, v) for u, v in zip(a.calls, b.calls, strict=True))
    assert not torch.equal(a.calls[1], a.calls[-1])  # and the noise is not constant


def test_accumulated_equals_one_batch_and_merge():
    wa, wb = _weights()
    models = {"a": Logit(wa, BIAS_A), "b": Logit(wb, BIAS_B)}
    x = torch.randn(12, T, D, generator=torch.Generator().manual_seed(10))
    kw = dict(sigma=0.8, repeats=2, chunk_size=16)
    one = CompareSensitivity(models, Sequence(), generator=1, **kw)
    one.update(x[:6])
    other = CompareSensitivity(models, Sequence(), generator=2, **kw)
    other.update(x[6:])
    merged = one.merge(other).compute()
    parts = [compare_sensitivity(models, x[:6], Sequence(), generator=1, **kw),
             compare_sensitivity(models, x[6:], Sequence(), generator=2, **kw)]
    d = merged.difference("a", "b")
    want = torch.cat([p.difference("a", "b").per_sample for p in parts])
    assert torch.equal(d.per_sample, want)
    assert d.estimate == pytest.approx(want.double().mean().item())
    assert d.stderr == pytest.approx(want.double().std().item() / 12**0.5, rel=1e-5)
    one.reset()
    with pytest.raises(RuntimeError, match="no examples"):
        one.compute()


# -- refusals ----------------------------------------------------------------------------------


def test_refuses_fewer_than_two_models_and_non_dicts():
    wa, _ = _weights()
    x = torch.randn(3, T, D)
    with pytest.raises(ValueError, match="at least two models"):
        compare_sensitivity({"a": Logit(wa, 0.0)}, x, Sequence(), sigma=1.0)
    with pytest.raises(TypeError, match="dict"):
        compare_sensitivity([Logit(wa, 0.0), Logit(wa, 0.1)], x, Sequence(), sigma=1.0)
    with pytest.raises(ValueError, match="adaptive stopping"):
        CompareSensitivity({"a": Logit(wa, 0.0), "b": Logit(wa, 0.1)}, Sequence(), sigma=1.0,
                           target_stderr=0.01)


class Embedder(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, dim)
        self.head = torch.nn.Linear(dim, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).mean(1))


def test_refuses_models_with_different_token_layouts():
    """Embeddings of 4 and 8 entries: the copies could not be the same."""
    ids = torch.randint(0, 10, (3, 5), generator=torch.Generator().manual_seed(11))
    with pytest.raises(ValueError, match="token layout.*4 entries.*8 entries"):
        compare_sensitivity({"a": Embedder(4), "b": Embedder(8)}, ids, Embedding("emb"),
                            sigma=1.0)


class Flaky(Recorder):
    """A recorder whose first perturbed chunk fails once."""

    failed = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.calls) == 1 and not self.failed:
            self.failed = True
            raise RuntimeError("transient failure")
        return super().__call__(x)


def test_a_failed_update_adds_nothing_and_keeps_the_pairing():
    """If one model fails, no model's state changes and the random stream does not move: the
    next update gives the numbers a fresh metric would, still paired."""
    x = torch.randn(4, T, 3, generator=torch.Generator().manual_seed(12))
    a, b = Recorder(1.0), Flaky(2.0)
    metric = CompareSensitivity({"a": a, "b": b}, Sequence(), sigma=0.5, chunk_size=64)
    with pytest.raises(RuntimeError, match="transient"):
        metric.update(x)
    assert metric.metrics["a"].state.n == 0 and metric.paired["a", "b"].n == 0
    a.calls.clear(), b.calls.clear()
    metric.update(x)
    fresh = Recorder(1.0)
    compare_sensitivity({"a": fresh, "b": Recorder(2.0)}, x, Sequence(), sigma=0.5,
                        chunk_size=64)
    assert all(torch.equal(u, v) for u, v in zip(a.calls, b.calls, strict=True))
    assert all(torch.equal(u, v) for u, v in zip(a.calls, fresh.calls, strict=True))


def test_a_dtype_clash_names_the_model_and_a_fix_that_keeps_the_others():
    """A float32 model and its bf16 copy share one input tensor: the error names the model that
    failed and the wrapper that converts its inputs (converting the shared inputs, the single
    model's fix, would break the other); with the wrapper the comparison runs."""
    import copy

    torch.manual_seed(0)  # test-only: init
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(20, 3))
    low = copy.deepcopy(net).bfloat16()
    x = torch.randn(6, 5, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="model 'bf16'.*share one input.*torch.bfloat16"):
        compare_sensitivity({"fp32": net, "bf16": low}, x, Sequence(), sigma=0.8, repeats=2)
    res = compare_sensitivity({"fp32": net, "bf16": lambda z: low(z.to(torch.bfloat16))}, x,
                              Sequence(), sigma=0.8, repeats=2)
    assert res.difference("fp32", "bf16") is not None
