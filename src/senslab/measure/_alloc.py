r"""Draws where flips happen: ``allocation="linear"``.

At small σ most tokens never flip the prediction, yet the stratified estimator gives every token
the same draws. With ``allocation="linear"`` each round first computes, from one forward and
backward pass per example, the linearised flip probability :math:`q_{bt}` of every real token
(:mod:`._control`), then gives token :math:`t` of example :math:`b` an *expected* number of units
(single copies, or antithetic pairs)

.. math::

    e_{bt} = \max\big(s_b\,e_{\min}/\bar s,\; c\,s_b\sqrt{q_{bt}(1 - q_{bt})}\big),

with :math:`c` chosen so that the mean of :math:`e_{bt}` over real tokens equals ``budget`` and
the floor :math:`e_{\min}` = :data:`FLOOR` × ``budget`` (scaled by the example's factor
:math:`s_b`, :math:`\bar s` its mean over real tokens), so no token is ever left out (if no
token can flip to first order, every token gets the example's share of ``budget``). The number
of units drawn is :math:`n_{bt} = \lfloor e_{bt} \rfloor + \mathrm{Bernoulli}(e_{bt} - \lfloor
e_{bt} \rfloor)`, so a token is measured at all with probability :math:`\pi_{bt} = \min(1,
e_{bt}) > 0`.

**Weights and cost.** The estimate is the mean over examples of each example's mean over its
:math:`K_b` real tokens, so a token weighs :math:`w_b \propto 1/K_b`; and with padding-aware
batching a copy of example :math:`b` costs in proportion to its extent :math:`c_b` (up to its
last real token: the copies are cut there; the allocation uses it with ``trim_padding=False``
too, so that option never changes the numbers). For a fixed cost :math:`\sum e_{bt} c_b` the
variance :math:`\sum w_b^2 p_{bt}(1-p_{bt})/e_{bt}` is smallest at :math:`e_{bt} \propto w_b
\sqrt{p(1-p)}/\sqrt{c_b}` (Neyman allocation with costs), hence the factor
:math:`s_b = 1/(K_b\sqrt{c_b})`: a short sentence's tokens weigh more and cost less, so they
get more draws. Where every example has the same length it is the same for all and drops out.

**Calibrated tangent, sized rounds** (``target_stderr``). Where a model bends at the scale σ the
tangent's :math:`q` tends to be off by much the same factor everywhere: its flips are those of a
steeper or flatter tangent. The first round, of ``budget`` units per token, is allocated by the
tangent as it is; after each round the scale :math:`\kappa` in :math:`q_{bt}(\kappa) =
\Phi(-m_b/(\kappa\sigma\lVert g_{bt}\rVert))` is fitted by maximum likelihood to every copy's
flip so far (:func:`fit_scale`), and the next round is allocated by :math:`q(\hat\kappa)` and
sized, at least ``budget`` (a top-up after that round at least :data:`TOPUP` × ``budget``), by
what the refitted tangent predicts that round will report (:func:`next_size`): the variance so
far and the prediction together reach the target. Rounds of sizes :math:`b_r` are combined by
their sizes, :math:`\sum_r b_r Y_r / \sum_r b_r`. A small pilot and one round sized for the
target replace the many equal rounds that went before:
small rounds draw most tokens with a probability below one, which costs
:math:`p^2(1/\pi - 1)` of variance per token, and each look at the standard error can
overshoot by a round. The weights depend on the flips only through the fitted scale and the
variance so far, both sums over the whole batch, and each round's :math:`Y` is unbiased given
the rounds before it; what is left is the stopping rule's :math:`O(1/n)` bias, low (fewer
flips, a smaller standard error, an earlier stop), which Horvitz–Thompson weights make larger
than with equal draws — a rarely drawn token that flips adds :math:`1/\pi` to the estimate and
:math:`1/\pi^2` to its variance, so a run that saw none stops early, low — hence the rounds
stop only once the batch has shown :data:`ALLOC_MIN_FLIPS` flips (10 per example in smaller
batches; docs/definitions.md,
*Draws where flips happen*, has the measured bias). (Predicting the next round's variance from
the flips seen so far, token by token, rather than from the refitted tangent, was rejected:
after a small pilot that prediction is noisy, and the sizes, and so the weights, follow its
noise — a round that saw few flips predicts a small next round and so weighs more, which
biases the estimate low. The tangent's prediction uses the flips only through
:math:`\hat\kappa`.)
``benchmarks/allocation_holdout.py`` simulates the rounds on a
real model's recorded flips (cost, bias, spread and coverage), and a slow test in
tests/measure/test_allocation.py bounds the bias on a toy.

**Estimator** (Horvitz–Thompson per token). With :math:`\bar v_{bt}` the mean of the token's
units (flip indicators, or antithetic pair means),

.. math::

    Y_{bt} = \frac{\mathbf 1[n_{bt} \ge 1]}{\pi_{bt}}\,\bar v_{bt},
    \qquad \mathbb E\,Y_{bt} = p_{bt}

exactly, whatever the model: the draw counts depend only on :math:`q`, never on a flip. The
example's rate is :math:`\hat m_b = K_b^{-1}\sum_t Y_{bt}`.

**Standard error.** Per token, :math:`\widehat{\operatorname{Var}}(Y_{bt})` is
:math:`s^2_{bt}/n_{bt}` (the units' sample variance) where :math:`n_{bt} \ge 2`; where a token had
one unit it is :math:`\bar v_{bt}^{\,2}/\pi_{bt}^2`, conservative by :math:`p_{bt}^2`; where it
had none, 0. Rounds (``target_stderr``) are unbiased given the rounds before them: the estimate
is their mean weighted by their sizes :math:`b_r`, the variance estimate the sum of theirs
weighted by :math:`b_r^2`, over :math:`(\sum_r b_r)^2` (the rounds' errors are uncorrelated).

**When it pays.** The saving comes from the tangent knowing where flips happen. On a model
that is nearly linear at the scale σ it is large (tests/measure/test_allocation.py: more than
2× the precision per forward pass of one draw per token); on a model whose flips the tangent
misses (saturating toy networks) it can cost more than equal draws, and a token the tangent
wrongly calls safe is drawn rarely and weighted heavily, which makes the estimate heavy-tailed.
The floor (:data:`FLOOR`) bounds that weight at :math:`1/(0.2 \cdot \mathrm{budget})`; at
0.05 the standard error came out up to 30% too small on such networks, at 0.2 within 6%. The control
variate is not combined with allocation: the draws would then measure the tangent's misses,
which the allocation cannot see, and the standard error came out 15–35% too small. Whether
allocation pays for a given model is what ``benchmarks/real_models.py`` measures.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._stats import units

#: the smallest expected units a real token keeps in a round, as a share of the round's size
FLOOR = 0.2
#: the fewest nonzero values (flips) a target standard error may stop on; none at all stops
#: only after ``rounds_at_zero`` rounds. Estimated from a handful of flips the standard error
#: moves with the flips seen, so stopping on it biases the estimate low and understates its
#: error: on a toy of 5 examples and 12 tokens (repeats=2, target 0.05, 400 seeds) the spread
#: was 1.56× the reported standard error and 72% of the 95% intervals covered; with at least 10
#: flips 1.02× and 92% (tests/measure/test_allocation.py). Below it ``compute`` warns that the
#: standard error rests on few flips (:meth:`.tokenwise.TokenSensitivity._warn_few_events`)
MIN_FLIPS = 10
#: the fewest nonzero values the rounds of ``allocation="linear"`` may stop on. Their standard
#: error moves with the flips far more: a token drawn with a small probability that flips adds
#: :math:`1/\pi` to its estimate and :math:`1/\pi^2` to its variance, so a run that saw none
#: stops early on a low estimate. On a saturating toy (30 examples × 5 tokens, pilot 0.25,
#: target 0.02, 300 seeds) the estimate was 0.55 of its standard error low and 87% of the 95%
#: intervals covered with 10; 0.15 of it and 91% with 50, 0.02 and 94% with 100
#: (docs/definitions.md, *Draws where flips happen*). 100 overshot loose targets: on a small
#: world whose flips the tangent knows (24 examples, target 0.02) it spent 31 rounds to a
#: standard error of half the target, 0.64× the cost of equal draws (50: 1.23×, 10: 2.22×). A
#: batch of fewer than 5 examples needs only :data:`MIN_FLIPS` per example: one that rarely
#: flips would otherwise run to the round cap, far past a loose target.
ALLOC_MIN_FLIPS = 50


def enough_flips(events: int, least: int | None = None, *, counts: Tensor | None = None,
                 valid: Tensor | None = None, target: float = 0.0) -> bool:
    """Whether a standard error estimated from ``events`` nonzero values may stop the rounds:
    at least ``least`` (default :data:`MIN_FLIPS`) of them, or none at all once
    :func:`zero_bound` of the draws per token ``counts`` (B, T) over the real tokens ``valid``
    meets ``target`` (without ``counts``, none at all is left to the caller)."""
    if events == 0:
        return counts is None or valid is None or zero_bound(counts, valid) <= target
    return events >= (MIN_FLIPS if least is None else least)


def rarer(events: int, copies: int, mirrored: bool) -> int:
    """The values :func:`enough_flips` counts among ``copies`` of which ``events`` are nonzero:
    the events, or where they are the flips themselves (``mirrored``: class decisions, single
    copies, no control variate) the rarer of flips and kept classes. Every copy flipped is the
    mirror of none: the standard error then rests on the few copies that kept the class, and
    none at all stops only on the rule of three (:func:`zero_bound` is symmetric in
    :math:`p` and :math:`1 - p`)."""
    return min(events, copies - events) if mirrored else events


def zero_bound(counts: Tensor, valid: Tensor) -> float:
    r"""The (subset) standard error a batch that has seen no flip could still have: that of
    every real token flipping at :math:`p = \min(3/N, 1/2)`, the largest variance of a common
    rate up to the rule-of-three 95% bound :math:`3/N` after :math:`N` draws without a flip,
    :math:`\sqrt{p(1-p)\sum_{bt} w_{bt}^2/\max(n_{bt},1)}` with :math:`w_{bt} = 1/(B K_b)` and
    :math:`n_{bt}` the token's draws (``counts`` (B, T); a token not yet drawn counts as one
    draw), or, where an example's drawn tokens alone give more, that of its :math:`k_b` drawn
    tokens, :math:`w_{bt} = 1/(B k_b)` over them: a design that measures a share of the
    tokens (``allocation="uniform"``, ``num_tokens``) estimates an example's rate from those,
    and its variance at a common :math:`p` is theirs, about :math:`K_b/k_b` times the first
    (for ``allocation="linear"`` near the Horvitz–Thompson :math:`p/\pi`). With the first
    alone, 64 examples × 32 tokens at a rate of 0.004 (target 0.004) stopped without a flip in
    7% (``budget=0.125``) and 12% (``num_tokens=4``) of runs at half the design's standard
    error, none of those runs' intervals covering the rate (84.5% and 83.5% in all); with the
    drawn tokens' bound every one of them covered it (91.5% and 96% in all). Zero flips end the
    rounds only once this meets the target: a standard error of 0
    from a few draws without a flip is no evidence (one example of 8 tokens at rate 0.11
    stopped at 0 ± 0 after two rounds in 28% of calls, and streamed one example per update the
    estimate sat 1.7 of its standard error low). :math:`p` stops at 1/2: at :math:`p = 3/N`
    the bound fell to 0 at :math:`N \le 3` draws, and one example of one token (or
    ``mode="whole"``) with a target stopped after two draws at 0 ± 0 (a rate of 0.02: 97.5% of
    calls, 2.5% of the 95% intervals covering it)."""
    v = valid.to(counts.device)
    n = float(counts[v].sum())
    if n <= 0:
        return math.inf
    p = min(0.5, 3.0 / n)
    b = v.shape[0]
    c = counts.double()
    drawn = v & (c > 0)
    # per example: Σ_t 1/max(n_t, 1) over its K_b real tokens, and Σ 1/n_t over its k_b drawn
    every = (v / c.clamp(min=1)).sum(1) / v.sum(1).double().clamp(min=1) ** 2
    k = drawn.sum(1).double()
    seen = torch.where(k > 0, (drawn / c.clamp(min=1)).sum(1) / k.clamp(min=1) ** 2, every)
    return math.sqrt(p * (1 - p) * float(torch.maximum(every, seen).sum()) / b**2)


def zero_floor(counts: Tensor, valid: Tensor) -> float:
    r"""The least variance share :math:`\sum_b \widehat{\operatorname{Var}}(\hat m_b)` that a
    batch whose rounds a target stopped without a single event reports: :func:`zero_bound`
    squared, times :math:`B^2`. The variance such a batch estimates is no evidence: with the
    control variate and one draw per token it is the spread of the tangent's probabilities
    between tokens, and without it 0. On 16 examples × 6 tokens of a small MLP (target 0.02,
    control variate, 1000 runs) 9% stopped after one round at a standard error of 0.0063
    against a zero bound of 0.018, and none of those runs' 95% intervals covered the rate: 86%
    in all, 95% with the floor (the runs with a flip unchanged). On 6 of its examples at a
    rate of 0.008, 65% → 97% (repeats=2) and, with ``allocation="uniform"``, 53% → 98%."""
    return zero_bound(counts, valid) ** 2 * valid.shape[0] ** 2


def expected_units(q: Tensor, valid: Tensor, budget: float,
                   scale: Tensor | None = None) -> Tensor:
    r""":math:`e_{bt}` (B, T) in float64: ``budget`` units per real token on average, spread in
    proportion to :math:`s_b\sqrt{q(1-q)}` above the floor :math:`s_b\,e_{\min}/\bar s`; 0 on
    padding. ``scale`` (B,) is the example's factor :math:`s_b = 1/(K_b\sqrt{c_b})` of the
    Neyman allocation (module docstring, *Weights and cost*); None: the same for every
    example."""
    v = valid.to(torch.float64)
    k = v.sum()
    s = torch.ones_like(v) if scale is None else scale.to(v)[:, None].expand_as(v)
    s = s * v
    s = s / (s.sum() / k.clamp(min=1)).clamp(min=1e-300)  # mean 1 over the real tokens
    a = (q.double() * (1 - q.double())).clamp(min=0).sqrt() * s
    # each token's floor: FLOOR × budget where every example has the same factor
    floor = FLOOR * budget * s
    if a.sum() <= 0:
        return budget * s
    total = budget * k
    # Σ max(c·a, f) is the largest of the sums c·A_S + F_(not S) over sets S of tokens above
    # their floors, each increasing in c, and the largest is always a set of the tokens with
    # the smallest breakpoints f/a: the c that spends ``total`` is the smallest of the c that
    # make each such prefix spend it (exact; no search, no host sync)
    live = a > 0
    brk = torch.where(live, floor / a.clamp(min=1e-300), torch.full_like(a, torch.inf))
    order = brk.flatten().argsort()
    a_sorted = a.flatten()[order]
    f_sorted = floor.flatten()[order]
    top = a_sorted.cumsum(0)
    rest = floor.sum() - f_sorted.cumsum(0)  # the floors of the tokens not yet above them
    c = torch.where(a_sorted > 0, (total - rest) / top.clamp(min=1e-300),
                    torch.full_like(top, torch.inf)).min()
    return torch.maximum(c * a, floor) * v


#: the scales :func:`fit_scale` chooses among: κ from 1/20 to 20, 2.5% apart
SCALE_GRID = torch.linspace(-3.0, 3.0, 241, dtype=torch.float64).exp()


def fit_scale(x: Tensor, hits: Tensor, counts: Tensor) -> float:
    r"""The maximum-likelihood :math:`\kappa` of flips ``hits`` in ``counts`` copies per token
    (any shape) whose flip probability is :math:`\Phi(-x/\kappa)`, ``x`` = :math:`m/(\sigma
    \lVert g\rVert)` (``inf`` where the tangent is flat), among :data:`SCALE_GRID`. 1 where
    the copies so far hold no flip, or nothing but flips: the likelihood has no maximum there."""
    seen = counts > 0
    h, n = hits[seen].double(), counts[seen].double()
    if h.sum() <= 0 or (n - h).sum() <= 0:  # also: no copy yet
        return 1.0
    z = -x[seen].double()[None, :] / SCALE_GRID.to(h.device)[:, None]  # (G, tokens)
    logq = torch.special.log_ndtr(z).clamp(min=-690.0)
    log1q = torch.special.log_ndtr(-z).clamp(min=-690.0)
    ll = (h * logq + (n - h) * log1q).sum(1)
    return float(SCALE_GRID[int(ll.argmax())])


def draw_units(e: Tensor, gen: torch.Generator) -> Tensor:
    """n = ⌊e⌋ + Bernoulli(e − ⌊e⌋) units per token (int64)."""
    u = torch.rand(e.shape, generator=gen, device=gen.device, dtype=torch.float64).to(e.device)
    whole = e.floor()
    return (whole + (u < (e - whole)).double()).long()


def plan(n: Tensor, copies_per_unit: int) -> tuple[Tensor, Tensor]:
    """Example (src) and token (tok) of every copy, example-major, units adjacent."""
    cells = (n > 0).nonzero()
    reps = n[cells[:, 0], cells[:, 1]] * copies_per_unit
    return cells[:, 0].repeat_interleave(reps), cells[:, 1].repeat_interleave(reps)


def token_values(
    u: Tensor, usrc: Tensor, utok: Tensor, n: Tensor, e: Tensor
) -> tuple[Tensor, Tensor]:
    """One round's :math:`Y_{bt}` (B, T) and per-token variance estimates from the units ``u``
    (float64) of tokens (usrc, utok)."""
    b, t = n.shape
    cell = usrc * t + utok
    d = u
    s1 = torch.zeros(b * t, dtype=torch.float64, device=u.device).index_add_(0, cell, d)
    s2 = torch.zeros_like(s1).index_add_(0, cell, d * d)
    s1, s2 = s1.view(b, t), s2.view(b, t)
    cnt = n.double()
    pi = e.clamp(max=1.0)
    mean = torch.where(cnt > 0, s1 / cnt.clamp(min=1), torch.zeros_like(s1))
    y = torch.where(pi > 0, mean / pi.clamp(min=1e-300), torch.zeros_like(mean))
    sample_var = (s2 - cnt * mean * mean) / (cnt - 1).clamp(min=1)
    var = torch.where(
        cnt >= 2, sample_var.clamp(min=0) / cnt.clamp(min=1),
        torch.where(cnt == 1, (mean / pi.clamp(min=1e-300)) ** 2, torch.zeros_like(mean)),
    )
    return y, var


#: the largest round with a target, in multiples of ``budget`` (later rounds continue from it)
MAX_GROWTH = 64
#: the least size of a round after the one sized for the target (a top-up where its prediction
#: fell short), in multiples of ``budget``: a whole ``budget`` there overshot the target
TOPUP = 0.25


def reported_variance(q: Tensor, e: Tensor, weight2: Tensor, per_unit: int = 1) -> float:
    r"""The variance a round with expected units ``e`` (B, T) reports on average, tokens flipping
    with probability ``q`` and weighing ``weight2`` (their squared weights in the estimate).
    With :math:`\mu_2` a unit's second moment and :math:`v = \mu_2 - p^2` its variance, a token
    drawn with probability :math:`\pi = e < 1` reports :math:`\mu_2/\pi`, one with one unit
    :math:`\mu_2` (conservative by :math:`p^2`), one with :math:`n \ge 2` units :math:`v/n`
    (:func:`token_values`). A single copy (``per_unit=1``) has :math:`\mu_2 = p`; an antithetic
    pair's mean (``per_unit=2``) :math:`\mu_2 = p/2` where its two copies never both flip, as
    the tangent's two half-spaces :math:`g^\top\varepsilon < -m` and
    :math:`g^\top\varepsilon > m` never do. In float64."""
    p = q.double()
    mu2 = p / per_unit
    v = p * (1 / per_unit - p)  # p(1 − p) for a single copy
    whole = e.floor()
    frac = e - whole
    # E[1/n] over n = ⌊e⌋ + Bernoulli(frac), where n ≥ 2
    inv_n = (1 - frac) / whole.clamp(min=1) + frac / (whole + 1)
    per_token = torch.where(
        e < 1, mu2 / e.clamp(min=1e-300),
        torch.where(e < 2, (1 - frac) * mu2 + frac * v / 2, v * inv_n))
    return float((weight2 * per_token).sum())


def next_size(q: Tensor, valid: Tensor, scale: Tensor, weight2: Tensor, spent: float,
              variance: float, target: float, least: float, most: float,
              per_unit: int = 1) -> float:
    r"""The units per token of the next round that bring the rounds' combined standard error to
    ``target``: rounds of sizes :math:`b_r` are combined by their sizes, so with :math:`B` =
    ``spent`` and the current combined ``variance`` :math:`V`, a round of size :math:`b` whose
    report is :math:`R(b)` (:func:`reported_variance` at the tangent's :math:`q`, units of
    ``per_unit`` copies) leaves
    :math:`(B^2V + b^2R(b))/(B+b)^2`. The smallest :math:`b` in [``least``, ``most``] that
    reaches ``target``² (``most`` where none does; bisection in :math:`\log b`)."""

    def combined(size: float) -> float:
        e = expected_units(q, valid, size, scale)
        r = reported_variance(q, e, weight2, per_unit)
        return (spent**2 * variance + size**2 * r) / (spent + size) ** 2

    goal = target**2
    if most <= least or combined(most) > goal:
        return most
    if combined(least) <= goal:
        return least
    lo, hi = math.log(least), math.log(most)
    for _ in range(40):
        mid = (lo + hi) / 2
        if combined(math.exp(mid)) <= goal:
            hi = mid
        else:
            lo = mid
    return math.exp(hi)


def most_copies(e: Tensor, per_unit: int = 1) -> int:
    r"""The most copies a round of expected units ``e`` (B, T) can draw: :func:`draw_units`
    gives a token :math:`\lceil e \rceil` units at most."""
    return int(e.ceil().sum()) * per_unit


def fitting_size(q: Tensor, valid: Tensor, scale: Tensor, size: float, room: float,
                 per_unit: int = 1) -> float:
    """The largest round size up to ``size`` (units per real token) whose draws can never
    take more than ``room`` copies (:func:`most_copies`), 0 where none can (every real token
    can draw a unit at any size). A round is sized by the copies it can draw, not by their
    expectation: the units drawn exceed their expectation about half the time, so a round cut
    to the expected copies left overran ``max_copies`` (by up to 5%). Bisection, the most
    copies growing with the size; the size never depends on the round's own draws, so the
    round stays unbiased."""
    if most_copies(expected_units(q, valid, size, scale), per_unit) <= room:
        return size
    lo, hi = 0.0, size
    for _ in range(40):
        mid = (lo + hi) / 2
        if most_copies(expected_units(q, valid, mid, scale), per_unit) <= room:
            lo = mid
        else:
            hi = mid
    return lo


def linear_rounds(x: Tensor, valid: Tensor, budget: float, gen: torch.Generator,
                  evaluate: Callable[[Tensor, Tensor], Tensor], *, per_unit: int = 1,
                  target: float | None = None, max_copies: float = math.inf,
                  rounds_at_zero: int = 2,
                  mirrored: bool = False) -> tuple[Tensor, Tensor, int, float]:
    r"""The rounds of ``allocation="linear"`` on one batch (module docstring): each spends its
    size in units per real token by Neyman's rule with weights and cost on the tangent's
    :math:`\Phi(-x/\kappa)` (``x`` (B, T): :attr:`LinearControl.x`), the first ``budget`` at
    :math:`\kappa = 1`, each later one at the :math:`\kappa` fitted to every flip so far and of
    the size that the fitted tangent predicts for the ``target`` (:func:`next_size`, at least
    ``budget``, a top-up after it at least :data:`TOPUP` × ``budget``); with a ``target``
    standard error, rounds until the estimate's (subset) standard error reaches it (not at zero
    before ``rounds_at_zero`` rounds) or another round of ``budget`` would pass ``max_copies``
    in expectation. A later round is cut to the size whose draws can never pass ``max_copies``
    (:func:`fitting_size`), so the copies made stay within it whenever the first round's do
    (that round always runs); where no round fits, the rounds stop.
    ``evaluate(src, tok)``: the flip (or output) value of one copy of token ``tok`` of example
    ``src`` each, units of ``per_unit`` adjacent copies (antithetic pairs). ``mirrored``: the
    values are flips whose mirror, kept classes, the flips guard counts too (:func:`rarer`).
    Returns the rounds' token values (B, T) combined by their sizes, their variance share (the
    rounds' variance estimates weighted by their sizes squared), the copies made and the last
    :math:`\kappa`."""
    b, t = valid.shape
    # Neyman with weights and cost: a token weighs 1/K_b, and a copy costs in proportion to its
    # example's extent, up to its last real token (what padding-aware batching evaluates; taken
    # from the data, so trim_padding never changes the numbers)
    k = valid.sum(1).double()
    cost = (valid.cumsum(1).argmax(1) + 1).to(k)
    scale = 1.0 / (k.clamp(min=1) * cost.clamp(min=1).sqrt())
    weight2 = (1.0 / (b * k.clamp(min=1)) ** 2)[:, None] * valid  # a token's weight, squared
    per_token = int(valid.sum()) * per_unit  # copies of one unit per real token
    ys: list[Tensor] = []
    vs: list[Tensor] = []
    reports: list[float] = []  # each round's reported variance of the batch's mean
    sizes: list[float] = []
    hits = torch.zeros(b * t, dtype=torch.float64, device=valid.device)
    counts = torch.zeros_like(hits)
    copies, kappa, size, events = 0, 1.0, budget, 0
    while True:
        e = expected_units(torch.special.ndtr(-x / kappa), valid, size, scale)
        n = draw_units(e, gen)
        src, tok = plan(n, per_unit)
        vals = evaluate(src, tok) if len(src) else torch.zeros(0, device=valid.device)
        u, usrc, utok = units(vals, src, tok, per_unit)
        y, var = token_values(u, usrc, utok, n, e)
        events += int((vals != 0).sum())
        ys.append(y)
        vs.append(var)
        reports.append(float((var * weight2.to(var)).sum()))
        sizes.append(size)
        copies += len(src)
        left = (max_copies - copies) / max(per_token, 1)  # units per token still allowed
        if target is None or left < budget:
            break
        spent = sum(sizes)
        variance = sum((s / spent) ** 2 * r for s, r in zip(sizes, reports, strict=True))
        se = math.sqrt(max(variance, 0.0))
        cell = (src * t + tok).to(hits.device)
        hits.index_add_(0, cell, vals.double().to(hits.device))
        counts.index_add_(0, cell, torch.ones_like(cell, dtype=torch.float64))
        if se <= target and (se > 0.0 or len(ys) >= rounds_at_zero) and \
                enough_flips(rarer(events, copies, mirrored),
                             min(ALLOC_MIN_FLIPS, MIN_FLIPS * b),
                             counts=counts.view(b, t), valid=valid, target=target):
            break
        # the next round by the tangent recalibrated on every flip so far, of the size it
        # predicts for the target
        kappa = fit_scale(x.flatten(), hits, counts)
        q = torch.special.ndtr(-x / kappa)
        least = budget if len(ys) == 1 else TOPUP * budget
        size = next_size(q, valid, scale, weight2.to(q.device, torch.float64), spent, variance,
                         target, least, min(left, MAX_GROWTH * budget), per_unit)
        # a hard ceiling: the units drawn can exceed their expectation
        size = fitting_size(q, valid, scale, size, max_copies - copies, per_unit)
        if size <= 0:
            break
    # rounds combined by their sizes: a round's size depends on the flips before it only
    # through the fitted scale and the variance so far, both sums over the whole batch, so the
    # estimate's bias stays a small share of its standard error (module docstring)
    spent = sum(sizes)
    y = sum(s / spent * yr for s, yr in zip(sizes, ys, strict=True))
    v = sum((s / spent) ** 2 * vr for s, vr in zip(sizes, vs, strict=True))
    return y, v, copies, kappa


# -- allocation="uniform": a share of every example's tokens, one draw each ----------------------

#: the probability that a token drawn by ``allocation="uniform"`` gets a second draw, from which
#: the standard error learns the within-token variance (:class:`Sampled`)
PAIR_SHARE = 0.25
#: tokens drawn twice that ``allocation="uniform"`` needs before it stops short of every token:
#: a variance estimate from fewer is too noisy to stop on (in a scratch run on six short
#: sentences, stopping on a handful of pairs covered the truth in 40% of the 95% intervals)
MIN_PAIRS = 64


class Sampled:
    r"""The state of ``allocation="uniform"`` on one batch: every example's real tokens in a random
    order (``rank``), a share of them measured, each with one draw — or two, with probability
    :data:`PAIR_SHARE` — and, once every token is in, rounds of more draws for every token.

    **Estimator.** Example :math:`b` with :math:`K` real tokens has :math:`k` of them measured,
    a simple random sample :math:`S` without replacement (:math:`f = k/K`); :math:`\bar y_t` is
    the mean of token :math:`t`'s draws and :math:`\hat m_b = k^{-1}\sum_{t\in S}\bar y_t`,
    unbiased for the example's rate (the sample and the second draws never depend on a flip).

    **Standard error.** :math:`\operatorname{Var}\hat m_b = (1-f)\,S_p^2/k + (kK)^{-1}\sum_t
    \bar\sigma_t^2` (:math:`S_p^2` the spread of the tokens' rates, :math:`\bar\sigma_t^2` the
    variance of a token's mean), estimated without bias by

    .. math::

        \hat v_b = (1-f)\,\frac{s^2_{\bar y}}{k} + \frac{1}{kK}\sum_{t\in S} g_t,

    :math:`s^2_{\bar y}` the sample variance of the measured tokens' means. While some tokens
    have one draw, :math:`g_t = s_t^2\,(\tfrac12 + (1-r)/r)` on a token with two (its own mean's
    variance, plus its share of the one-draw tokens' :math:`p(1-p)`, which a single draw cannot
    estimate: Horvitz–Thompson over the random pairing, :math:`r` = :data:`PAIR_SHARE`) and 0 on
    the others; once every token has two or more, :math:`g_t = s_t^2/n_t`. A token with one
    draw alone would need :math:`p_t^2`, so without the pairs the standard error could only be
    bounded from above. Every example keeps at least two measured tokens (the spread needs
    two)."""

    def __init__(self, valid: Tensor, gen: torch.Generator, share: float) -> None:
        self.valid = valid
        b, t = valid.shape
        self.k_all = valid.sum(1)
        # float32 whatever the default dtype: a float64 default drew other subsets from one seed
        scores = torch.rand(b, t, generator=gen, device=gen.device,
                            dtype=torch.float32).to(valid.device)
        scores = scores.masked_fill(~valid, float("inf"))
        self.rank = scores.argsort(dim=1).argsort(dim=1)
        pair = torch.rand(b, t, generator=gen, device=gen.device, dtype=torch.float64)
        self.pair = (pair.to(valid.device) < PAIR_SHARE) & valid
        self.share = share
        self.reached = 0.0  # the share of every example's tokens measured so far
        self.rounds = 0  # rounds of sampling (phase A)
        self.full = 0  # rounds of more draws for every token after all are in
        self.k = torch.zeros_like(self.k_all)
        self.cnt = torch.zeros(b, t, dtype=torch.float64, device=valid.device)
        self.s1 = torch.zeros_like(self.cnt)
        self.s2 = torch.zeros_like(self.cnt)
        self.events = 0  # nonzero values so far (:func:`enough_flips`)

    @property
    def covered(self) -> bool:
        """Whether every real token has been measured."""
        return bool((self.k >= self.k_all).all())

    def next_plan(self, to: float | None = None) -> tuple[Tensor, Tensor]:
        """Example (src) and token (tok) of the next round's copies, example-major: every
        example's tokens up to the share ``to`` (default: ``share`` more than so far; a paired
        token's two copies adjacent), or, once all are in, ``to`` (default 1) more copies of
        every real token."""
        if self.covered:  # ``to``: draws per token this round (default 1)
            self.full += 1
            cells = self.valid.nonzero()
            reps = max(1, int(to or 1))
            return cells[:, 0].repeat_interleave(reps), cells[:, 1].repeat_interleave(reps)
        self.rounds += 1
        self.reached, self.k, new = self._sample(to)
        cells = new.nonzero()
        reps = 1 + self.pair[cells[:, 0], cells[:, 1]].long()
        return cells[:, 0].repeat_interleave(reps), cells[:, 1].repeat_interleave(reps)

    def _sample(self, to: float | None) -> tuple[float, Tensor, Tensor]:
        """Before every token is in: the share a round at ``to`` reaches (:meth:`next_plan`),
        the tokens measured per example after it (B,) and the tokens it adds (B, T), drawing
        nothing."""
        reached = min(1.0, max(self.reached + self.share, to or 0.0))
        k_all = self.k_all.double()
        want = torch.ceil(reached * k_all - 1e-9)
        k = torch.minimum(torch.maximum(want, torch.full_like(want, 2.0)), k_all).long()
        new = (self.rank >= self.k[:, None]) & (self.rank < k[:, None]) & self.valid
        return reached, k, new

    def _round_copies(self, to: float | None) -> int:
        """The copies a round at ``to`` would make before every token is in (a paired token
        two)."""
        new = self._sample(to)[2]
        return int(new.sum() + (new & self.pair).sum())

    def _fitting(self, to: float, room: int) -> float:
        """The largest share up to ``to`` whose round keeps the copies within ``room``: the
        share the variance predicts can be far past it (unchecked, such a round had taken a
        batch to 493 copies in a room of 100). Bisection, the round's copies growing with the
        share; 0, the least round (``share`` more), fits wherever :meth:`run` goes on."""
        left = room - self.copies
        if self._round_copies(to) <= left:
            return to
        lo, hi = 0.0, to
        for _ in range(40):
            mid = (lo + hi) / 2
            if self._round_copies(mid) <= left:
                lo = mid
            else:
                hi = mid
        return lo

    def add(self, vals: Tensor, src: Tensor, tok: Tensor) -> None:
        """Add one round's flip indicators (or distances) of the copies (src, tok)."""
        t = self.valid.shape[1]
        cell = src * t + tok
        v = vals.double().to(self.cnt.device)
        self.cnt.view(-1).index_add_(0, cell, torch.ones_like(v))
        self.s1.view(-1).index_add_(0, cell, v)
        self.s2.view(-1).index_add_(0, cell, v * v)
        self.events += int((v != 0).sum())

    def _components(self) -> tuple[Tensor, Tensor, Tensor]:
        r"""Each measured token's mean (B, T; 0 elsewhere), and per example :math:`\sum_S g_t`
        and the sample variance :math:`s^2_{\bar y}` of the measured tokens' means (B,)."""
        cnt = self.cnt
        seen = cnt > 0
        mean = torch.where(seen, self.s1 / cnt.clamp(min=1), torch.zeros_like(cnt))
        sample = ((self.s2 - cnt * mean * mean) / (cnt - 1).clamp(min=1)).clamp(min=0)
        if self.full:
            g = torch.where(cnt >= 2, sample / cnt.clamp(min=1), torch.zeros_like(cnt))
        else:
            r = PAIR_SHARE
            g = torch.where(cnt >= 2, sample * (0.5 + (1 - r) / r), torch.zeros_like(cnt))
        # the spread of the measured tokens' means (k ≥ 2 wherever K ≥ 2)
        k = self.k.double()
        m = (mean * seen).sum(1) / k
        spread = ((mean - m[:, None]) ** 2 * seen).sum(1) / (k - 1).clamp(min=1)
        return mean, g.sum(1), spread

    def values(self) -> tuple[Tensor, Tensor]:
        r"""(y, var), each (B, T): the per-token values whose mean over an example's real tokens
        is :math:`\hat m_b` (a measured token's mean over :math:`f`, 0 elsewhere), and per-token
        shares of :math:`\hat v_b` whose sum over them divided by :math:`K^2` is
        :math:`\hat v_b`."""
        mean, g, spread = self._components()
        f = self.k.double() / self.k_all.double()
        var = (self._variance(g, spread) * self.k_all)[:, None] * self.valid  # Σ_t var / K² = v
        return mean / f[:, None], var

    def _variance(self, g: Tensor, spread: Tensor) -> Tensor:
        """:math:`\\hat v_b` (B,) from :meth:`_components`' ``g`` and ``spread``."""
        k, k_all = self.k.double(), self.k_all.double()
        return (1 - k / k_all) * spread / k + g / (k * k_all)

    def share_for(self, target: float) -> float:
        r"""The share of every example's tokens that the variance components measured so far
        predict for a standard error of ``target`` (phase A only): with :math:`\hat S^2_b =
        s^2_{\bar y} - k^{-1}\sum_S g_t` (the tokens' spread, less the draws' noise in it) and
        :math:`\hat G_b = (K/k)\sum_S g_t`, the variance at share :math:`f` is
        :math:`B^{-2}\sum_b [(1/f - 1)\hat S^2_b/K + \hat G_b/(fK^2)]`, which falls to
        ``target``² at :math:`f = A/(\text{target}^2 + C)`. The share the rounds then jump to
        depends on the flips seen, like any adaptive stopping (bias :math:`O(1/n)`)."""
        _, g, spread = self._components()
        k, k_all = self.k.double(), self.k_all.double()
        s2 = (spread - g / k).clamp(min=0)
        b = self.valid.shape[0]
        c = (s2 / k_all).sum().item() / b**2
        a = c + (g / k / k_all).sum().item() / b**2
        return a / (target**2 + c)

    @property
    def copies(self) -> int:
        return int(self.cnt.sum().item())

    def stderr(self) -> float:
        """The batch's fixed-subset standard error, :math:`\\sqrt{\\sum_b \\hat v_b}/B`."""
        _, g, spread = self._components()
        v = self._variance(g, spread).sum().item()
        return math.sqrt(max(v, 0.0)) / self.valid.shape[0]

    def run(self, evaluate: Callable[[Tensor, Tensor], Tensor], target: float | None,
            room: int, rounds_at_zero: int = 2, mirrored: bool = False) -> None:
        """Rounds of copies, ``evaluate(src, tok)`` giving their values, until the standard
        error is at most ``target`` (one round without a target): a pilot of ``share``, then
        each round up to the share :meth:`share_for` predicts, and once every token is in, the
        draws per token the variance predicts (at least one) for every token. Stops before a
        round that would take the copies past ``room``; a standard error of exactly 0 ends it
        only after ``rounds_at_zero`` rounds, and one reached before every token has two draws
        only once :data:`MIN_PAIRS` tokens have. ``mirrored``: as for :func:`linear_rounds`."""
        tokens = int(self.valid.sum())
        to: float | None = None
        while True:
            src, tok = self.next_plan(to)
            self.add(evaluate(src, tok), src, tok)
            # the least next round: every token once more, or ``share`` more of the tokens
            # with their pairs (counted exactly: ⌈share·K⌉ per example, at least two, and the
            # second draws had taken the copies past the room)
            least = tokens if self.covered else self._round_copies(None)
            if target is None or self.copies + least > room:
                return
            se = self.stderr()
            # short of two draws for every token, stop only on enough paired tokens
            trusted = self.full > 0 or int((self.cnt >= 2).sum()) >= MIN_PAIRS
            if se <= target and trusted \
                    and enough_flips(rarer(self.events, self.copies, mirrored),
                                     counts=self.cnt, valid=self.valid,
                                     target=target) \
                    and (se > 0.0 or self.rounds + self.full >= rounds_at_zero):
                return
            # the next round goes straight to the share the variance so far predicts or, once
            # every token is in, to the draws per token it predicts (the variance falls as
            # 1/draws): few looks at the standard error, so little stopping bias (at most
            # doubling the draws instead covered the truth less often on small batches)
            if self.covered:
                per_token = self.copies / tokens
                to = math.ceil(per_token * ((se / target) ** 2 - 1)) if se > 0 else 1
                to = max(1, min(to, (room - self.copies) // tokens))
            else:
                to = self._fitting(self.share_for(target), room)
