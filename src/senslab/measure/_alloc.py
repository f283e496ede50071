r"""Draws where flips happen: ``allocation="linear"``.

At small σ most tokens never flip the prediction, yet the stratified estimator gives every token
the same draws. With ``allocation="linear"`` each round first computes, from one forward and
backward pass per example, the linearised flip probability :math:`q_{bt}` of every real token
(:mod:`._control`), then gives token :math:`t` of example :math:`b` an *expected* number of units
(single copies, or antithetic pairs)

.. math::

    e_{bt} = \max\big(e_{\min},\; c\,\sqrt{q_{bt}(1 - q_{bt})}\big),

with :math:`c` chosen so that the mean of :math:`e_{bt}` over real tokens equals ``budget`` and
the floor :math:`e_{\min}` = :data:`FLOOR` × ``budget`` (at most ``budget``), so no token is ever
left out (if no token can flip to first order, every token gets ``budget``). The number of units
drawn is :math:`n_{bt} = \lfloor e_{bt} \rfloor + \mathrm{Bernoulli}(e_{bt} - \lfloor e_{bt}
\rfloor)`, so a token is measured at all with probability :math:`\pi_{bt} = \min(1, e_{bt}) > 0`.

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
had none, 0. Rounds (``target_stderr``) are independent replicates: the estimate is their mean,
the variance estimate their mean over the number of rounds.

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

#: the smallest expected units per round a real token keeps, as a share of ``budget``
FLOOR = 0.2


def expected_units(q: Tensor, valid: Tensor, budget: float) -> Tensor:
    """:math:`e_{bt}` (B, T) in float64: ``budget`` units per real token on average, spread in
    proportion to :math:`\\sqrt{q(1-q)}` above the floor; 0 on padding."""
    v = valid.to(torch.float64)
    a = (q.double() * (1 - q.double())).clamp(min=0).sqrt() * v
    k = v.sum()
    floor = FLOOR * budget
    if a.sum() <= 0:
        return v * budget
    total = budget * k
    # Σ max(c·a, floor) is the largest of the sums with the m largest a above the floor and the
    # rest at it, c·S_m + floor·(k − m), each increasing in c: the c that spends ``total`` is the
    # smallest of the c_m that make each of them spend it (exact; no search, no host sync)
    s = a.flatten().sort(descending=True).values
    top = s.cumsum(0)
    m = torch.arange(1, s.numel() + 1, dtype=torch.float64, device=s.device)
    c = torch.where(s > 0, (total - floor * (k - m)) / top, torch.full_like(s, torch.inf)).min()
    return torch.maximum(c * a, torch.full_like(a, floor)) * v


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
        scores = torch.rand(b, t, generator=gen, device=gen.device).to(valid.device)
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
        self.reached = min(1.0, max(self.reached + self.share, to or 0.0))
        k_all = self.k_all.double()
        want = torch.ceil(self.reached * k_all - 1e-9)
        k = torch.minimum(torch.maximum(want, torch.full_like(want, 2.0)), k_all).long()
        new = (self.rank >= self.k[:, None]) & (self.rank < k[:, None]) & self.valid
        self.k = k
        cells = new.nonzero()
        reps = 1 + self.pair[cells[:, 0], cells[:, 1]].long()
        return cells[:, 0].repeat_interleave(reps), cells[:, 1].repeat_interleave(reps)

    def add(self, vals: Tensor, src: Tensor, tok: Tensor) -> None:
        """Add one round's flip indicators (or distances) of the copies (src, tok)."""
        t = self.valid.shape[1]
        cell = src * t + tok
        v = vals.double().to(self.cnt.device)
        self.cnt.view(-1).index_add_(0, cell, torch.ones_like(v))
        self.s1.view(-1).index_add_(0, cell, v)
        self.s2.view(-1).index_add_(0, cell, v * v)

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
            room: int, rounds_at_zero: int = 2) -> None:
        """Rounds of copies, ``evaluate(src, tok)`` giving their values, until the standard
        error is at most ``target`` (one round without a target): a pilot of ``share``, then
        each round up to the share :meth:`share_for` predicts, and once every token is in, the
        draws per token the variance predicts (at least one) for every token. Stops before a
        round that would take the copies past ``room``; a standard error of exactly 0 ends it
        only after ``rounds_at_zero`` rounds, and one reached before every token has two draws
        only once :data:`MIN_PAIRS` tokens have."""
        tokens = int(self.valid.sum())
        step = max(1, math.ceil(self.share * tokens))
        to: float | None = None
        while True:
            src, tok = self.next_plan(to)
            self.add(evaluate(src, tok), src, tok)
            if target is None or self.copies + (tokens if self.covered else step) > room:
                return
            se = self.stderr()
            # short of two draws for every token, stop only on enough paired tokens
            trusted = self.full > 0 or int((self.cnt >= 2).sum()) >= MIN_PAIRS
            if se <= target and trusted and (se > 0.0 or self.rounds + self.full >= rounds_at_zero):
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
                to = self.share_for(target)
