"""A reported standard error is a promise: the 95% intervals of the token-wise estimator cover the
truth 95% of the time — and visibly would not if the standard error were 10% too small.

The model is a linear classifier on (B, T, D) sequences, z = Σ_t w_t·x_t + b (two logits −z, z),
whose flip probabilities are known in closed form: noise N(0, σ²I) on token t moves z by
N(0, σ²‖w_t‖²), so the clean class flips with probability Φ(−|z(x)|/(σ‖w_t‖)).

A coverage test runs many independent replicates of one measurement, counts how often
``estimate ± 1.96·stderr`` holds the truth, and asserts, from the same replicates, that the
coverage lies in [93.5, 96.5]% and that with the standard error scaled by 0.9 it falls below
93.5% (nominally P(|Z| < 1.764) ≈ 92.2%): the test fails if the standard error were 10% too
small (checked by hand: 0.9× or 0.85× ``se_data``/``se_subset`` in ``_stats.result`` fails the
data/subset tests; 1.1× ``se_subset`` fails the upper bound). The i.i.d. fallback
(``repeats=1``) is only required to be conservative.

Replicates are consecutive ``update``/``compute``/``reset`` rounds of one metric (the random
stream continues across ``reset``, so they are independent) rather than fresh seeds: a fresh
generator draws a whole noise block (2¹⁸ numbers) per call, 6× the cost of the measurement.

The second half checks that noise never reaches masked (padding) tokens: a recording model sees
every perturbed copy, for ``Patches`` and ``Sequence``, whole-input and token-wise mode.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import torch

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.measure._runner import VERIFY_BATCH, VERIFY_ROWS
from senslab.measure._stats import interval_quantile
from senslab.tokens import Patches, Sequence

Z95 = 1.96
LOW, HIGH = 0.935, 0.965  # the band the coverage of a nominal 95% interval must fall in
T, D = 4, 2
SIGMA = 1.0
BIAS = 0.2
MU = 0.25  # "data": examples are drawn i.i.d. with entries N(MU, 1)
REPLICATES = 8000  # binomial sd of a coverage: 0.24% at 95%, 0.30% at 92.2%

PHI = torch.special.ndtr


def _weights() -> torch.Tensor:
    return torch.randn(T, D, generator=torch.Generator().manual_seed(0))


class Linear:
    """Two logits (−z, z) of z = Σ_t w_t·x_t + b: the class is the sign of z."""

    def __init__(self, w: torch.Tensor) -> None:
        self.w = w

    def __call__(self, seq: torch.Tensor) -> torch.Tensor:
        z = (seq * self.w).sum((1, 2)) + BIAS
        return torch.stack([-z, z], 1)


def flip_probs(x: torch.Tensor, w: torch.Tensor, linear: Any) -> torch.Tensor:
    """(B, T) closed-form flip probabilities of the linear model (tests/measure/conftest.py)."""
    return linear.flip_probs(x, w, BIAS, SIGMA)


def replicates(
    metric: TokenSensitivity, batches: Iterable[torch.Tensor]
) -> dict[str, torch.Tensor]:
    """One measurement per batch (update, compute, reset): estimates, standard errors, CIs."""
    rows = []
    for x in batches:
        metric.update(x)
        r = metric.compute()
        metric.reset()
        rows.append((r.estimate, r.stderr, r.stderr_subset, *r.ci95))
    cols = torch.tensor(rows, dtype=torch.float64).unbind(1)
    return dict(zip(("est", "se", "se_subset", "lo", "hi"), cols, strict=True))


def coverage(est: torch.Tensor, se: torch.Tensor, truth: torch.Tensor | float, k: float) -> float:
    """Fraction of replicates whose interval est ± 1.96·k·se holds the truth."""
    return ((est - truth).abs() <= Z95 * k * se).double().mean().item()


def check_promise(est, se, truth, what: str) -> dict[float, float]:
    """Coverage in the band at the reported s.e., below it at 0.9× the s.e. (same replicates)."""
    assert torch.isfinite(se).all() and (se > 0).all(), f"{what}: s.e. not positive everywhere"
    # independent replicates, not one repeated measurement (the stream continues across reset)
    assert est.unique().numel() > 50, f"{what}: the replicates are not independent"
    cov = {k: coverage(est, se, truth, k) for k in (1.0, 0.9, 0.85)}
    assert LOW <= cov[1.0] <= HIGH, f"{what}: 95% interval covers {cov[1.0]:.2%} ({cov})"
    assert cov[0.9] < LOW, (
        f"{what}: 0.9× the s.e. still covers {cov[0.9]:.2%}, so the test could not detect a "
        f"standard error 10% too small ({cov})"
    )
    return cov


def check_ci95(out: dict[str, torch.Tensor], q: float = Z95) -> None:
    """ci95 is estimate ± q·stderr, clipped to [0, 1] (flip rates are probabilities): q = 1.96
    for "subset", Student's t quantile with n − 1 degrees of freedom for "data"."""
    lo = (out["est"] - q * out["se"]).clamp(min=0.0)
    hi = (out["est"] + q * out["se"]).clamp(max=1.0)
    assert torch.allclose(out["lo"], lo, rtol=0, atol=1e-12)
    assert torch.allclose(out["hi"], hi, rtol=0, atol=1e-12)


# -- coverage: the fixed-subset estimand -------------------------------------------------------


@pytest.mark.parametrize("antithetic", [False, True], ids=["plain", "antithetic"])
@pytest.mark.heavy
def test_subset_interval_covers_the_fixed_set_truth(antithetic, linear):
    """estimand="subset" on a fixed set of examples: only the noise is random. With all tokens and
    repeats=4 (two antithetic pairs) the stratified variance is used."""
    w = _weights()
    x = 0.5 * torch.randn(64, T, D, generator=torch.Generator().manual_seed(1))
    p = flip_probs(x, w, linear)
    truth = p.mean().item()
    assert 0.1 < truth < 0.4 and (p > 0.05).float().mean() > 0.5  # informative, not degenerate

    metric = TokenSensitivity(
        Linear(w), Sequence(), sigma=SIGMA, repeats=4, estimand="subset", generator=2,
        chunk_size=1024, antithetic=antithetic,
    )
    out = replicates(metric, (x for _ in range(REPLICATES)))
    assert torch.equal(out["se"], out["se_subset"])
    check_ci95(out)
    # the estimator is unbiased: the mean of the replicates is within 4 s.e. of the truth
    assert abs(out["est"].mean().item() - truth) < 4 * out["est"].std().item() / REPLICATES**0.5
    check_promise(out["est"], out["se"], truth, f"subset (antithetic={antithetic})")


# -- coverage: the data-distribution estimand --------------------------------------------------


def test_population_truth_quadrature_matches_monte_carlo(linear):
    w = _weights().double()
    x = MU + torch.randn(400_000, T, D, generator=torch.Generator().manual_seed(3),
                         dtype=torch.float64)
    per_example = flip_probs(x, w, linear).mean(1)
    mc, mc_se = per_example.mean().item(), per_example.std().item() / len(x) ** 0.5
    assert abs(linear.population_truth(w, BIAS, SIGMA, MU) - mc) < 4 * mc_se


@pytest.mark.heavy
def test_data_interval_covers_the_population_truth(linear):
    """estimand="data": every replicate draws new examples from the same distribution; the
    interval must cover the population sensitivity. From the same replicates, stderr_subset
    (stratified, repeats=2) must cover each replicate's own fixed-set truth."""
    w = _weights()
    truth = linear.population_truth(w, BIAS, SIGMA, MU)
    assert 0.1 < truth < 0.4
    n = 128
    gen = torch.Generator().manual_seed(4)
    data = MU + torch.randn(REPLICATES, n, T, D, generator=gen)
    metric = TokenSensitivity(
        Linear(w), Sequence(), sigma=SIGMA, repeats=2, estimand="data", generator=5,
        chunk_size=1024,
    )
    out = replicates(metric, data)
    check_ci95(out, interval_quantile("data", n))
    assert interval_quantile("data", n) > Z95
    check_promise(out["est"], out["se"], truth, "data")
    fixed_set_truth = flip_probs(data.view(-1, T, D), w, linear).view(REPLICATES, -1).mean(1)
    check_promise(out["est"], out["se_subset"], fixed_set_truth, "subset s.e. of data replicates")


# -- coverage: the i.i.d. fallback and whole-input noise ---------------------------------------


@pytest.mark.heavy
def test_subset_iid_fallback_with_one_draw_per_token_is_conservative(linear):
    """repeats=1: no within-cell variance, so the units of an example are treated as i.i.d.; the
    between-token spread of the flip rates inflates that variance — conservative coverage."""
    w = _weights()
    x = 0.5 * torch.randn(64, T, D, generator=torch.Generator().manual_seed(6))
    truth = flip_probs(x, w, linear).mean().item()
    metric = TokenSensitivity(
        Linear(w), Sequence(), sigma=SIGMA, repeats=1, estimand="subset", generator=7,
        chunk_size=1024,
    )
    out = replicates(metric, (x for _ in range(REPLICATES // 2)))
    assert coverage(out["est"], out["se"], truth, 1.0) >= LOW


@pytest.mark.parametrize("options", [dict(repeats=4, num_tokens=4),
                                     dict(repeats=8, antithetic=True, num_tokens=2)],
                         ids=["plain", "antithetic"])
@pytest.mark.heavy
def test_subset_interval_with_sampled_tokens_covers_the_truth(options, linear):
    """num_tokens: a random 4 (or 2) of 16 tokens per round, several draws each. The draws of one
    sampled token share its flip rate, so the unit is the mean of all of them; counting single
    copies as i.i.d. made the standard error 13-23% too small (coverage 87-92%), which this test
    catches. Tokens drawn without replacement make the interval conservative by the finite-
    population factor; with antithetic pairs (little within-token variance left) 4 of 16 covered
    96.2%, so that case samples 2 of 16, where the factor is negligible."""
    tokens = 16
    scale = torch.linspace(0.2, 3.0, tokens)[:, None]  # unequal tokens: a real between-token spread
    w = torch.randn(tokens, D, generator=torch.Generator().manual_seed(0)) * scale
    x = 0.5 * torch.randn(64, tokens, D, generator=torch.Generator().manual_seed(1))
    p = flip_probs(x, w, linear)
    truth = p.mean().item()
    assert 0.05 < truth < 0.3 and p.std(1).mean() > 0.05  # tokens differ: sampling them costs
    metric = TokenSensitivity(
        Linear(w), Sequence(), sigma=SIGMA, estimand="subset", generator=2,
        chunk_size=4096, **options,
    )
    assert metric.group == options["repeats"]
    out = replicates(metric, (x for _ in range(REPLICATES)))
    assert abs(out["est"].mean().item() - truth) < 4 * out["est"].std().item() / REPLICATES**0.5
    check_promise(out["est"], out["se"], truth, f"sampled tokens {options}")


@pytest.mark.heavy
def test_whole_input_interval_with_padding_covers_the_truth():
    """mode="whole" with a mask: noise on every real token at once flips with probability
    Φ(−|z|/(σ‖w ⊙ valid‖)) — padding tokens get no noise; draws of an example are i.i.d."""
    w = _weights()
    b = 64
    x = 0.5 * torch.randn(b, T, D, generator=torch.Generator().manual_seed(8))
    lengths = torch.arange(b) % T + 1
    mask = torch.arange(T)[None] < lengths[:, None]
    z = (x.double() * w.double()).sum((1, 2)) + BIAS
    reach = (w.double()[None] * mask[..., None]).flatten(1).norm(dim=1)  # ‖w ⊙ valid‖
    truth = PHI(-z.abs() / (SIGMA * reach)).mean().item()
    metric = TokenSensitivity(
        Linear(w), Sequence(), sigma=SIGMA, repeats=8, mode="whole", estimand="subset",
        generator=9, chunk_size=1024,
    )
    rows = []
    for _ in range(REPLICATES // 2):
        metric.update(x, mask)
        r = metric.compute()
        metric.reset()
        rows.append((r.estimate, r.stderr))
    est, se = torch.tensor(rows, dtype=torch.float64).unbind(1)
    check_promise(est, se, truth, "whole input, subset")


def test_per_position_and_per_sample_match_closed_forms(linear):
    w = _weights()
    b, reps = 16, 2000
    x = 0.5 * torch.randn(b, T, D, generator=torch.Generator().manual_seed(10))
    lengths = torch.tensor([T, T - 1, 2, T, 1, T, 3, T] * 2)
    mask = torch.arange(T)[None] < lengths[:, None]
    p = flip_probs(x, w, linear) * mask
    r = token_sensitivity(
        Linear(w), x, Sequence(), mask=mask, sigma=SIGMA, repeats=reps, estimand="subset",
        generator=11, chunk_size=8192,
    )
    count = mask.sum(0).double()
    assert torch.equal(r.position_counts, count * reps)
    pos = p.sum(0) / count
    pos_se = ((p * (1 - p)).sum(0) / reps).sqrt() / count
    assert ((r.per_position - pos).abs() < 4.5 * pos_se).all(), (r.per_position, pos)
    per_sample = p.sum(1) / lengths
    sample_se = ((p * (1 - p)).sum(1) / reps).sqrt() / lengths
    assert ((r.per_sample.double() - per_sample).abs() < 4.5 * sample_se + 1e-6).all()
    assert abs(r.estimate - per_sample.mean().item()) < 4 * r.stderr


# -- noise never touches masked tokens ---------------------------------------------------------


class Recorder:
    """A model that keeps a copy of every batch it is called on (two logits of the input sum)."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.detach().clone())
        s = x.flatten(1).sum(1)
        return torch.stack([-s, s], 1)

    def copies(self, clean: torch.Tensor) -> torch.Tensor:
        """All perturbed copies the model saw: the clean batch left out, and the zero-noise
        copies of the first examples that check the copies' path (there must be exactly
        ``2 * VERIFY_ROWS`` of those, each equal to its clean example), and the batch check's
        noisy copies (the three calls after them: ``VERIFY_BATCH`` copies, then its halves)."""
        zero = 1 + 2 * VERIFY_ROWS  # the clean batch and the zero-noise calls (one row each)
        calls = self.calls[:zero] + self.calls[zero + 3:]
        assert [len(c) for c in self.calls[zero:zero + 3]] == [
            VERIFY_BATCH, VERIFY_BATCH // 2, VERIFY_BATCH - VERIFY_BATCH // 2]
        seen = [c for c in calls if not (c.shape == clean.shape and torch.equal(c, clean))]
        assert len(seen) < len(calls), "the clean batch was never evaluated"
        rows = torch.cat(seen)
        exact = (rows.flatten(1)[:, None] == clean.flatten(1)[None]).all(-1).any(-1)
        assert int(exact.sum()) == 2 * VERIFY_ROWS, "zero-noise copies other than the check"
        return rows[~exact]


def _as_tokens(images: torch.Tensor, p: int) -> torch.Tensor:
    """(N, C, H, W) → (N, T, C·p·p), token t = patch at row t // (W/p), column t % (W/p)."""
    n, c, h, w = images.shape
    v = images.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
    return v.reshape(n, (h // p) * (w // p), c * p * p)


def _source(copies: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """The example each copy was made from (the examples lie far apart, the noise is small)."""
    dist = torch.cdist(copies.flatten(1).double(), clean.flatten(1).double())
    return dist.argmin(1)


def _perturbed_tokens(copies: torch.Tensor, clean: torch.Tensor, per_example: torch.Tensor):
    """(N, T, D) copies and (B, T, D) clean tokens → the copies' sources and (N, T, D) changes;
    ``per_example``: how many copies of each example there must be."""
    src = _source(copies, clean)
    assert torch.equal(torch.bincount(src, minlength=len(clean)), per_example)
    return src, copies != clean[src]


MASK = torch.tensor(
    [[1, 0, 1, 1], [0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 1], [1, 0, 0, 0]], dtype=torch.bool
)


def _images() -> torch.Tensor:
    g = torch.Generator().manual_seed(12)
    x = torch.randn(len(MASK), 3, 8, 8, generator=g)
    return x + 50.0 * torch.arange(len(MASK)).view(-1, 1, 1, 1)  # examples far apart


def _sequences() -> torch.Tensor:
    g = torch.Generator().manual_seed(13)
    x = torch.randn(len(MASK), T, 5, generator=g)
    return x + 50.0 * torch.arange(len(MASK)).view(-1, 1, 1)


@pytest.mark.parametrize("kind", ["patches", "sequence"])
def test_whole_input_noise_never_touches_masked_tokens(kind):
    """mode="whole": every copy equals the clean input exactly on masked tokens (patches), and
    differs from it in every entry of every real token."""
    x, tokens = (_images(), Patches(4)) if kind == "patches" else (_sequences(), Sequence())
    as_tokens = (lambda v: _as_tokens(v, 4)) if kind == "patches" else (lambda v: v)
    model, reps = Recorder(), 6
    token_sensitivity(model, x, tokens, mask=MASK, sigma=0.5, mode="whole", repeats=reps,
                      chunk_size=7)
    copies = model.copies(x)
    assert len(copies) == len(MASK) * reps
    src, changed = _perturbed_tokens(as_tokens(copies), as_tokens(x), torch.full((len(x),), reps))
    valid = MASK[src]  # (N, T)
    assert not changed[~valid].any(), "whole-input noise reached a masked token"
    assert changed[valid].all(), "whole-input noise missed (part of) a real token"


@pytest.mark.parametrize("kind", ["patches", "sequence"])
def test_token_noise_lands_on_the_chosen_real_token_only(kind):
    """mode="token": each copy differs from its clean example on exactly one real token (in every
    entry of it), and every real token of every example is perturbed ``repeats`` times."""
    x, tokens = (_images(), Patches(4)) if kind == "patches" else (_sequences(), Sequence())
    as_tokens = (lambda v: _as_tokens(v, 4)) if kind == "patches" else (lambda v: v)
    model, reps = Recorder(), 3
    token_sensitivity(model, x, tokens, mask=MASK, sigma=0.5, repeats=reps, chunk_size=5)
    copies = model.copies(x)
    src, changed = _perturbed_tokens(as_tokens(copies), as_tokens(x), MASK.sum(1) * reps)
    touched = changed.any(-1)  # (N, T)
    assert (touched.sum(1) == 1).all(), "a copy has noise on more or less than one token"
    tok = touched.float().argmax(1)
    assert changed[torch.arange(len(src)), tok].all(), "noise missed part of the chosen token"
    hits = torch.zeros(MASK.shape, dtype=torch.long).index_put_((src, tok), torch.ones_like(src),
                                                                accumulate=True)
    assert torch.equal(hits, MASK.long() * reps)


@pytest.mark.parametrize("mode", ["whole", "token"])
@pytest.mark.parametrize("kind", ["patches", "sequence"])
def test_model_reading_only_padding_sees_no_noise(kind, mode):
    """A linear model whose weights are zero except on masked tokens: any leak of noise into
    padding would show as an output distance."""
    x = _images() if kind == "patches" else _sequences()
    tokens = Patches(4) if kind == "patches" else Sequence()
    weights = torch.randn(x.shape[1:], generator=torch.Generator().manual_seed(14))

    def pad_only(v: torch.Tensor) -> torch.Tensor:
        pad = ~MASK[_source(v, x)]  # (N, T): each copy's own padding tokens
        if kind == "patches":  # token mask → pixel mask
            pad = pad.view(-1, 2, 2).repeat_interleave(4, 1).repeat_interleave(4, 2)[:, None]
        else:
            pad = pad[..., None]
        return (v * weights * pad).flatten(1)

    r = token_sensitivity(pad_only, x, tokens, mask=MASK, sigma=2.0, mode=mode, repeats=2,
                          compare="l2", chunk_size=4)
    assert r.estimate == 0.0
    # the same model sees the noise once every token is declared real
    r = token_sensitivity(pad_only, x, tokens, sigma=2.0, mode=mode, repeats=2, compare="l2",
                          chunk_size=4)
    assert r.estimate > 0
