"""Audit of the token-wise estimator's statistics (tests/measure/test_coverage.py holds the main
coverage tests): the subset interval of output distances, and coverage by simulation of option
combinations those tests leave out (a curved model with exact flip rates, with and without the
control variate; vocabulary replacement).

Closed forms: a linear logit z = Σ_t w_t·x_t + b with outputs (−z, z) moves by
δ = w_t·ε ~ N(0, σ²‖w_t‖²) under noise on token t, so its l2 change √2·|δ| has the mean
√2·σ‖w_t‖·√(2/π). A quadratic logit z = Σ_t (a_t·x_t)² − c with noise on token t is R + Y², with
R = z − (a_t·x_t)² and Y = a_t·(x_t + ε) ~ N(a_t·x_t, σ²‖a_t‖²): it changes sign exactly when
Y² crosses −R, a normal probability.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
from scipy.stats import t as student_t

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.measure._stats import State, accumulate, result, subset_dof
from senslab.tokens import Sequence

PHI = torch.special.ndtr
T, D = 8, 2
BIAS = 0.2


def _weights() -> torch.Tensor:
    scale = torch.linspace(0.3, 2.0, T)[:, None]  # unequal tokens: most variance in a few
    return torch.randn(T, D, generator=torch.Generator().manual_seed(0)) * scale


class Linear:
    """Two logits (−z, z) of z = Σ_t w_t·x_t + b."""

    def __init__(self, w: torch.Tensor) -> None:
        self.w = w

    def __call__(self, seq: torch.Tensor) -> torch.Tensor:
        z = (seq * self.w[: seq.shape[1]]).sum((1, 2)) + BIAS
        return torch.stack([-z, z], 1)


class Quadratic:
    """Two logits (−z, z) of z = Σ_t (a_t·x_t)² − c: curved, so the tangent misses flips."""

    def __init__(self, a: torch.Tensor, c: float) -> None:
        self.a, self.c = a, c

    def __call__(self, seq: torch.Tensor) -> torch.Tensor:
        y = (seq * self.a[: seq.shape[1]]).sum(2)
        z = (y * y).sum(1) - self.c
        return torch.stack([-z, z], 1)


def quadratic_flip_probs(x: torch.Tensor, a: torch.Tensor, c: float,
                         sigma: float) -> torch.Tensor:
    """(B, T) exact flip probabilities of :class:`Quadratic`: with R = z − y_t² the rest of the
    logit, the copy's logit is R + Y², Y ~ N(y_t, σ²‖a_t‖²); P(Y² < −R) is a normal interval."""
    x, a = x.double(), a.double()
    y = (x * a).sum(2)
    z = (y * y).sum(1) - c
    rest = z[:, None] - y * y
    s = sigma * a.norm(dim=1)[None]
    root = (-rest).clamp(min=0).sqrt()
    below = (PHI((root - y) / s) - PHI((-root - y) / s)) * (rest < 0)
    return torch.where(z[:, None] > 0, below, 1 - below)


def _replicates(metric: TokenSensitivity, x: torch.Tensor, n: int) -> torch.Tensor:
    """(n, 4) estimate, stderr, ci95 of n independent measurements of ``x`` (the random stream
    continues across reset)."""
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warnings of a few flips are not under test
        for _ in range(n):
            metric.update(x)
            r = metric.compute()
            metric.reset()
            rows.append((r.estimate, r.stderr, *r.ci95))
    return torch.tensor(rows, dtype=torch.float64)


# -- the subset interval of output distances ---------------------------------------------------


def test_subset_interval_of_few_distance_copies_covers_the_truth():
    """One example of 8 tokens, 2 draws each, compare="l2": the subset variance rests on one
    degree of freedom per token, and most of it on the few tokens of large weight. With the
    normal's 1.96 the 95% interval covered the truth in 88% of 3,000 replicates (no warning:
    every copy of a distance is an event); Student's t on the Satterthwaite degrees of freedom
    covers 95-96%."""
    w = _weights()
    x = 0.5 * torch.randn(1, T, D, generator=torch.Generator().manual_seed(1))
    truth = (2**0.5 * w.double().norm(dim=1) * (2 / math.pi) ** 0.5).mean().item()
    metric = TokenSensitivity(Linear(w), Sequence(), sigma=1.0, repeats=2, compare="l2",
                              estimand="subset", generator=3, chunk_size=64)
    est, se, lo, hi = _replicates(metric, x, 1000).unbind(1)
    assert abs(est.mean().item() - truth) < 4 * est.std().item() / 1000**0.5  # unbiased
    covered = ((lo <= truth) & (truth <= hi)).double().mean().item()
    normal = ((est - truth).abs() <= 1.96 * se).double().mean().item()
    assert covered >= 0.93, (covered, normal)
    assert normal < 0.91, (covered, normal)  # the test's teeth: 1.96 falls short here


@pytest.mark.filterwarnings("ignore:the standard error rests on few:RuntimeWarning")
def test_subset_interval_of_distances_is_student_t_on_satterthwaite_degrees_of_freedom():
    """Whole-input noise, 4 draws of one example: the i.i.d. form, on U − 1 = 3 degrees of
    freedom. Several examples (or cells) combine by Satterthwaite, (Σ V)² / Σ V²/ν. Class flips
    keep the normal's 1.96."""
    w = _weights()
    x = 0.5 * torch.randn(2, T, D, generator=torch.Generator().manual_seed(1))
    opts = dict(sigma=1.0, repeats=4, mode="whole", compare="l2", estimand="subset",
                generator=5)
    one = token_sensitivity(Linear(w), x[:1], Sequence(), **opts)
    half = student_t.ppf(0.975, 3) * one.stderr
    assert one.ci95 == pytest.approx((one.estimate - half, one.estimate + half), rel=1e-12)

    # the Satterthwaite sums by hand: example 0's units 1, 2, 3, 4 (i.i.d. form: V = s²/4 on
    # 3 degrees of freedom), example 1's cells (2 units each: V = s²/(2·2²) on 1 each)
    st = State()
    valid = torch.ones(2, 2, dtype=torch.bool)
    accumulate(st, torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.zeros(4, dtype=torch.long),
               torch.zeros(4, dtype=torch.long), valid[:1, :1], group=1, per_cell=None,
               positions=None)
    accumulate(st, torch.tensor([0.0, 2.0, 1.0, 1.0]), torch.zeros(4, dtype=torch.long),
               torch.tensor([0, 0, 1, 1]), valid[:1], group=1, per_cell=2, positions=None)
    v0, v1 = (5 / 3) / 4, 2.0 / 2 / 4
    assert st.within == pytest.approx(v0 + v1)
    assert subset_dof(st) == pytest.approx((v0 + v1) ** 2 / (v0**2 / 3 + v1**2 / 1))
    r = result(st, "subset", "left", False, 1.0)
    half = student_t.ppf(0.975, subset_dof(st)) * r.stderr
    assert r.ci95 == pytest.approx((r.estimate - half, r.estimate + half), rel=1e-12)

    flips = token_sensitivity(Linear(w), x, Sequence(), **{**opts, "compare": "class",
                                                             "sigma": 3.0, "repeats": 16})
    assert flips.stderr > 0
    lo = max(flips.estimate - 1.96 * flips.stderr, 0.0)
    hi = min(flips.estimate + 1.96 * flips.stderr, 1.0)
    assert flips.ci95 == pytest.approx((lo, hi), rel=1e-12)


def test_merged_shards_and_all_reduce_keep_the_degrees_of_freedom(tmp_path: Path):
    """The degrees of freedom are sums, so shards merged by hand, or all-reduced, give the
    one-process interval of distances (their sum was left out of the reduced state)."""
    import torch.distributed as dist

    w = _weights()
    x = 0.5 * torch.randn(5, T, D, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([8, 3, 5, 2, 8])
    mask = torch.arange(T)[None] < lengths[:, None]
    opts = dict(sigma=1.0, repeats=2, compare="l1", estimand="subset", generator=7,
                chunk_size=16)
    ref = TokenSensitivity(Linear(w), Sequence(), **opts)
    ref.update(x, mask)
    want = ref.compute()
    assert math.isfinite(subset_dof(ref.state))
    shards = [TokenSensitivity(Linear(w), Sequence(), shard=(k, 2), **opts) for k in range(2)]
    for s in shards:
        s.update(x, mask)
    got = shards[0].merge(shards[1]).compute()
    assert got.ci95 == pytest.approx(want.ci95, rel=1e-12)

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        reduced = TokenSensitivity(Linear(w), Sequence(), **opts)
        reduced.update(x, mask)
        assert reduced.all_reduce().compute().ci95 == pytest.approx(want.ci95, rel=1e-12)
    finally:
        dist.destroy_process_group()


# -- coverage by simulation of combinations test_coverage.py leaves out ------------------------


@pytest.mark.parametrize("control_variate", [None, "linear"], ids=["plain", "control"])
def test_curved_model_subset_interval_covers_the_exact_rate(control_variate):
    """A quadratic classifier, whose flips the tangent only partly knows: the estimate is
    unbiased for the exact rate and its subset interval covers it, with the control variate
    and without (2 draws per token, stratified)."""
    a = torch.randn(4, D, generator=torch.Generator().manual_seed(0))
    x = 0.7 * torch.randn(48, 4, D, generator=torch.Generator().manual_seed(1))
    truth = quadratic_flip_probs(x, a, 3.0, 1.0).mean().item()
    assert 0.1 < truth < 0.3
    metric = TokenSensitivity(Quadratic(a, 3.0), Sequence(), sigma=1.0, repeats=2,
                              estimand="subset", control_variate=control_variate, generator=3,
                              chunk_size=1024)
    reps = 1000
    est, se, lo, hi = _replicates(metric, x, reps).unbind(1)
    assert abs(est.mean().item() - truth) < 4 * est.std().item() / reps**0.5
    covered = ((lo <= truth) & (truth <= hi)).double().mean().item()
    assert 0.93 <= covered <= 0.97, covered


def test_vocabulary_replacement_subset_interval_covers_the_exact_rate():
    """replace_with: the rate of token t is the share of the vocabulary's rows that move the
    linear logit across 0, exactly."""
    w = _weights()
    vocab = torch.randn(7, D, generator=torch.Generator().manual_seed(5))
    x = 0.5 * torch.randn(40, T, D, generator=torch.Generator().manual_seed(1))
    z = (x.double() * w.double()).sum((1, 2)) + BIAS
    moved = z[:, None, None] - (x.double() * w.double()).sum(2)[..., None] \
        + (vocab.double() @ w.double().T).T[None]
    truth = ((moved > 0) != (z[:, None, None] > 0)).double().mean().item()
    metric = TokenSensitivity(Linear(w), Sequence(), replace_with=vocab, repeats=4,
                              estimand="subset", generator=3, chunk_size=2048)
    reps = 1000
    est, se, lo, hi = _replicates(metric, x, reps).unbind(1)
    assert abs(est.mean().item() - truth) < 4 * est.std().item() / reps**0.5
    covered = ((lo <= truth) & (truth <= hi)).double().mean().item()
    assert 0.93 <= covered <= 0.97, covered


class _LinearModule(torch.nn.Module):
    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("w", w)

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        return Linear(self.w)(seq)


def test_torchmetrics_and_paired_differences_of_distances_take_the_same_t():
    """The torchmetrics metric rebuilds the state from its own sums, and a paired difference
    has its own state: both used the normal's 1.96 for distances after `TokenSensitivity`
    took Student's t, so the metric's interval differed from the measurement's."""
    from senslab.integrations.torchmetrics import TokenSensitivityMetric
    from senslab.measure import compare_sensitivity

    w = _weights()
    x = 0.5 * torch.randn(3, T, D, generator=torch.Generator().manual_seed(1))
    opts = dict(sigma=1.0, repeats=2, compare="l2", estimand="subset")
    model = _LinearModule(w)
    own = token_sensitivity(model, x, Sequence(), generator=5, **opts)
    assert own.ci95[1] - own.estimate > 1.96 * own.stderr * 1.01  # t, wider than the normal's
    metric = TokenSensitivityMetric(Sequence(), generator=5, **opts)
    metric.update(model, x)
    got = metric.result()
    assert got.estimate == pytest.approx(own.estimate, rel=1e-12)
    assert got.ci95 == pytest.approx(own.ci95, rel=1e-12)

    other = _LinearModule(w * 1.5)
    cmp = compare_sensitivity({"a": model, "b": other}, x, Sequence(), generator=5, **opts)
    d = cmp.difference("a", "b")
    half = d.ci95[1] - d.estimate
    assert half > 1.96 * d.stderr * 1.01
