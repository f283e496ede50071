r"""Sums, counts and standard errors of the token-wise estimator (see
:mod:`senslab.measure.tokenwise` for the estimands).

**Units.** The copies of one (example, token) cell are grouped into *units* that are i.i.d. given
the cell: single copies, or with antithetic noise the pair means
:math:`u = \tfrac12\,[v(\varepsilon) + v(-\varepsilon)]`. Each unit is unbiased for the cell's
mean, so every estimator below stays unbiased; antithetic pairs only change the variance,
:math:`\operatorname{Var}(u) = \tfrac12 \operatorname{Var}(v)\,(1 + \rho)` with
:math:`\rho = \operatorname{corr}(v(\varepsilon), v(-\varepsilon))`, a gain wherever
:math:`\rho < 0` (for a decision boundary that is locally a hyperplane, a flip by ε and a flip by
−ε exclude each other, so :math:`\rho = -p/(1-p)`).

**Stratified variance.** With all :math:`K_b` real tokens of example :math:`b` evaluated and
:math:`r` units each, the example's mean :math:`\hat m_b = K_b^{-1} \sum_t \bar u_{bt}` has

.. math::

    \widehat{\operatorname{Var}}(\hat m_b) = \frac{1}{K_b^2} \sum_t \frac{s^2_{bt}}{r},

:math:`s^2_{bt}` the sample variance of the units of cell :math:`(b, t)` — unbiased for the
variance of :math:`\hat m_b` (the between-token spread of the flip rates costs nothing, unlike
plain Monte Carlo that samples tokens at random). With fewer than two units per cell the units of
an example are treated as i.i.d. (conservative: the between-token spread is counted).

**Sampled tokens** (``num_tokens``). Each round draws a random subset of tokens and gives each
``repeats`` draws; then a unit is the mean of *all* the draws of one sampled token in one round,
and the units of an example are treated as i.i.d. Single copies would not do: the draws of one
token share its flip rate, so counting them as independent draws of a random token shrinks the
between-token part of the variance by the number of draws, and the standard error comes out too
small (tests/measure/test_coverage.py). Tokens drawn without replacement within a round make the
i.i.d. formula conservative (by the finite-population factor).

**95% interval.** ``estimate ± q·stderr``. For ``"data"`` the standard error is that of a mean
of :math:`n` per-example rates, estimated from their spread, so :math:`q` is the 0.975 quantile
of Student's t with :math:`n - 1` degrees of freedom (:func:`interval_quantile`); with the
normal's 1.96 the interval covered the population rate in 85% of replicates at 4 examples
(tests/measure/test_stderr_calibration.py; 94% with t). Skewed per-example rates (most near 0)
still leave it short at a few examples (a small MLP at 5 examples: 84% with 1.96, 90% with t).
For ``"subset"`` :math:`q` = 1.96 (normal approximation) for class flips, which the warning of
few flips guards (with 10 or more flips the intervals cover about 94–95%). For distances
(``compare="l1"``/``"l2"``) every copy is an event, so that warning never speaks, and the
variance estimate can rest on few degrees of freedom (one per cell at two draws, far fewer in
effect where a few tokens carry most of it): :math:`q` is the 0.975 quantile of Student's t
with the Satterthwaite degrees of freedom of the estimate (:func:`subset_dof`). With 1.96 the
interval of one example of 8 tokens at 2 draws each (``compare="l2"``, a linear model) covered
the truth in 88% of 3,000 replicates, 91–93% at 32–64 copies; with t, 95–97%
(tests/measure/test_audit80_estimator.py).

**One example.** The data standard error is the spread of the per-example rates, and one example
has none: it is NaN, and so is its interval (never a number made up for it). ``compute`` says so
(:func:`one_example_warning`) and names the fixed-subset standard error of that example, which
the result carries as ``stderr_subset`` whatever the estimand.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class SensitivityResult:
    """What a sensitivity measurement returns.

    ``estimate`` is the mean flip rate (or output distance); ``stderr`` and ``ci95`` belong to
    ``estimand`` (see the module docstring; ``ci95`` is ``estimate ± q·stderr``, q Student's t
    quantile with ``num_examples − 1`` degrees of freedom for ``"data"``, 1.96 for ``"subset"``
    (for distances Student's t on the Satterthwaite degrees of freedom, :func:`subset_dof`),
    clipped to [0, 1] for class flips); ``stderr_subset`` is always the fixed-subset one. For
    ``"data"`` on one example ``stderr`` and ``ci95`` are NaN (no spread of examples to estimate
    them from; ``compute`` warns and names ``stderr_subset``).
    ``per_sample`` holds one rate per example (in input order); ``per_position`` the mean per
    token position, at positions ``positions`` (right-aligned: −1 is the last real token), with
    ``position_counts`` perturbed copies behind each (with ``num_tokens`` each weighted by its
    example's real tokens over those drawn; with ``target_stderr`` each weighted by 1/(its
    batch's rounds); with an allocation, tokens). ``num_forward`` counts
    model evaluations of single examples, clean ones included; with checked bf16
    (``precision``) every copy counts once there and ``num_forward_fp32`` counts its float32
    re-evaluations, a share
    ``recheck_fraction`` of the checked copies (None when no copy ran checked).
    """

    estimate: float
    stderr: float
    ci95: tuple[float, float]
    estimand: str
    stderr_subset: float
    num_examples: int
    num_forward: int
    per_sample: Tensor
    per_position: Tensor
    positions: Tensor
    position_counts: Tensor
    sigma: float | None
    num_forward_fp32: int = 0
    recheck_fraction: float | None = None

    def __str__(self) -> str:
        lo, hi = self.ci95
        return (
            f"sensitivity {fixed(self.estimate)} ± {fixed(self.stderr)} "
            f"(95% CI {fixed(lo)}–{fixed(hi)}, {self.estimand}; {self.num_examples:,} "
            f"example{'' if self.num_examples == 1 else 's'}, "
            f"{self.num_forward:,} forward passes)"
        )

    def __float__(self) -> float:
        return self.estimate


@dataclass
class State:
    """Sum/count state: mergeable across batches and processes."""

    n: int = 0
    s1: float = 0.0  # Σ_b m_b
    s2: float = 0.0  # Σ_b m_b²
    within: float = 0.0  # Σ_b Var̂(m_b) (token/noise randomness only)
    # Σ over the parts of ``within`` of part² / its degrees of freedom (Satterthwaite: the
    # subset interval's degrees of freedom are within² / this; 0 where unknown, read as many)
    within_q: float = 0.0
    forward: int = 0
    forward_fp32: int = 0  # float32 re-evaluations of checked bf16 copies
    checked: int = 0  # copies evaluated in checked bf16
    copies: int = 0  # perturbed copies measured
    events: int = 0  # copies the standard error learns from (:func:`accumulate`)
    single: int = 0  # examples whose fixed-subset variance is NaN: a single unit of draws
    # flips of examples whose clean class is a tie (outputs.tie_breaks): those examples, the
    # sum of their rates, their flipped copies, and the flipped copies of every example
    ties: int = 0
    tie_rates: float = 0.0
    tie_flips: int = 0
    flips: int = 0
    pos_sum: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    pos_cnt: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    samples: list[Tensor] = field(default_factory=list)


def interleave(per_rank: list[Any], slots: list[int] | None = None) -> Tensor:
    """Per-sample rates of all ranks back in one-process order (example b lives on rank
    b % world; each rank's list holds one entry per update). ``slots``: the place of each
    rank's examples in a batch (its shard's rank; default: its place in ``per_rank``)."""
    world, out = len(per_rank), []
    slots = list(range(world)) if slots is None else slots
    for batches in zip(*per_rank, strict=True):
        n = sum(len(x) for x in batches)
        merged = [0.0] * n
        for r, rates in zip(slots, batches, strict=True):
            merged[r::world] = rates
        out += merged
    return torch.tensor(out, dtype=torch.float32)


def _fits(sizes: list[int], slots: list[int]) -> bool:
    """Whether one update's per-rank example counts ``sizes`` are the shares of one batch
    (rank at slot r holding examples r, r + world, …), so that :func:`interleave` applies."""
    n, world = sum(sizes), len(sizes)
    return all(size == len(range(r, n, world)) for r, size in zip(slots, sizes, strict=True))


def gathered_order(infos: list[dict[str, Any]]) -> list[int] | None:
    """How the per-sample rates of the ranks' gathered ``infos`` (one dict a rank: ``samples``,
    one list of rates per update; ``identity``, ``shard``) go back in order: the slot of each
    rank in every batch (:func:`interleave`), or None for rank by rank. Raises ValueError where
    the ranks' states do not add up to one measurement — every rank sees the same ``infos``,
    so every rank raises alike and none waits on a collective the others never join."""
    world = len(infos)
    base = infos[0].get("identity") or []
    for r, info in enumerate(infos[1:], 1):
        for (name, a), (_, b) in zip(base, info.get("identity") or [], strict=False):
            if a != b:
                raise ValueError(
                    f"cannot all_reduce: rank 0 measures {name} {a} but rank {r} {name} {b} — "
                    "the ranks measure different quantities, and their sum would be neither; "
                    "build every rank's metric with the same options"
                )
    shards = [info.get("shard") for info in infos]
    counts = [len(info["samples"]) for info in infos]
    if all(s is None for s in shards):
        # ranks that measured their own data: interleaved where each update's examples are the
        # shares of one batch (a DistributedSampler's), else rank by rank (the sums are the
        # same either way; a batch of 2 on rank 0 and 3 on rank 1 had failed with Python's
        # "attempt to assign sequence of size 2 to extended slice of size 3")
        slots = list(range(world))
        if len(set(counts)) == 1 and all(
            _fits([len(info["samples"][i]) for info in infos], slots) for i in range(counts[0])
        ):
            return slots
        return None
    if any(s is None for s in shards):
        raise ValueError(
            f"cannot all_reduce: some ranks measure with shard= and others without (shard per "
            f"rank: {shards}); a sharded rank holds its share of every batch, an unsharded one "
            "whole batches, so the total would count some examples twice and leave others "
            "out; give every rank shard=(rank, world_size), or none"
        )
    if sorted(s[0] for s in shards) != list(range(world)) or any(s[1] != world for s in shards):
        raise ValueError(
            f"cannot all_reduce: the ranks' shards {shards} are not one each of "
            f"(0, {world}) … ({world - 1}, {world}) for the {world} processes of the group, so "
            "the total would count some examples twice (two ranks with one shard) or leave "
            "some out (a shard no rank measures); pass shard=(dist.get_rank(), "
            "dist.get_world_size())"
        )
    slots = [s[0] for s in shards]
    if len(set(counts)) > 1:
        made = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
        raise ValueError(
            f"cannot all_reduce: the ranks made different numbers of update() calls ({made}); "
            "with shard= each rank measures its share of every batch, so a rank that skipped "
            "a batch leaves its share out and the total is not the one-process result. Call "
            "update() on every rank with the same batches (or reset() every rank and measure "
            "again)"
        )
    for i in range(counts[0]):
        sizes = [len(info["samples"][i]) for info in infos]
        if not _fits(sizes, slots):
            raise ValueError(
                f"cannot all_reduce: update {i + 1} measured {sizes} examples on the ranks, not "
                "the shares of one batch; with shard= every rank must call update() with the "
                "same batches, in the same order"
            )
    return slots


def pad_to(t: Tensor, n: int, left: bool) -> Tensor:
    if len(t) >= n:
        return t
    z = torch.zeros(n - len(t), dtype=t.dtype)
    return torch.cat([z, t] if left else [t, z])


def units(vals: Tensor, src: Tensor, tok: Tensor, group: int) -> tuple[Tensor, Tensor, Tensor]:
    """The units of the copies: the means of consecutive groups of ``group`` copies of one cell
    (1: single copies; 2: antithetic pairs; ``repeats``: all draws of a sampled token)."""
    v = vals.double()
    if group == 1:
        return v, src, tok
    return v.view(-1, group).mean(1), src[0::group], tok[0::group]


def _counts(usrc: Tensor, b: int, u: Tensor) -> Tensor:
    zeros = torch.zeros(b, dtype=torch.float64, device=u.device)
    return zeros.index_add_(0, usrc, torch.ones_like(u))


def within_variance(
    u: Tensor, usrc: Tensor, utok: Tensor, valid: Tensor, per_cell: int | None
) -> Tensor:
    """Var̂(m̂_b) per example from the units (stratified if ``per_cell`` ≥ 2 units in every
    real cell, else the i.i.d. formula; NaN where an example has a single unit)."""
    return _within_parts(u, usrc, utok, valid, per_cell)[0]


def _within_parts(
    u: Tensor, usrc: Tensor, utok: Tensor, valid: Tensor, per_cell: int | None
) -> tuple[Tensor, Tensor]:
    r""":func:`within_variance` (B,) and, per example, the sum over the parts of that estimate
    of part² / the part's degrees of freedom (B,): a cell's :math:`s^2_{bt}/(rK_b^2)` on
    :math:`r - 1`, or an example's :math:`s^2_b/U_b` on :math:`U_b - 1`. Summed over the
    examples, it gives the Satterthwaite degrees of freedom of the subset standard error
    (:func:`subset_dof`)."""
    b, t = valid.shape
    if per_cell is not None and per_cell >= 2:
        cell = usrc * t + utok
        csum = torch.zeros(b * t, dtype=torch.float64, device=u.device).index_add_(0, cell, u)
        csq = torch.zeros_like(csum).index_add_(0, cell, u * u)
        r = per_cell
        cvar = (csq - csum * csum / r) / (r - 1)  # sample variance per (example, token) cell
        k = valid.sum(1).double().to(u.device)
        part = cvar.view(b, t) / r / (k**2)[:, None]
        return part.sum(1), (part * part).sum(1) / (r - 1)
    cnt = _counts(usrc, b, u)
    mean = torch.zeros_like(cnt).index_add_(0, usrc, u) / cnt
    sq = torch.zeros_like(cnt).index_add_(0, usrc, u * u)
    var = (sq - cnt * mean * mean) / (cnt - 1).clamp(min=1)
    nan = torch.full_like(var, float("nan"))
    within = torch.where(cnt > 1, var / cnt, nan)
    return within, torch.where(cnt > 1, within * within / (cnt - 1).clamp(min=1), nan)


def accumulate(
    st: State, vals: Tensor, src: Tensor, tok: Tensor, valid: Tensor, *, group: int,
    per_cell: int | None, positions: str | None, num_tokens: int | None = None,
    real: Tensor | None = None, rounds: int = 1, events: int | None = None, floor: float = 0.0,
    ties: Tensor | None = None,
) -> None:
    r"""Add one batch's copies to ``st``. ``group``: copies per unit (:func:`units`);
    ``per_cell``: units per real cell when every real token was evaluated equally often
    (stratified design), else None. ``positions``: alignment of the per-position profile
    ("left"/"right"), None to skip it (whole-input noise). ``num_tokens``: each round drew
    that many of every example's real tokens (a copy then stands for K_b / min(k, K_b) of
    its example's tokens in the profile); None: every real token. ``real``: the example's real
    tokens, of which ``valid`` (those perturbed) may leave some out, for the right-aligned
    profile (None: ``valid``). ``rounds``: the rounds of draws the batch ran (adaptive
    stopping); its copies weigh 1/``rounds`` in the profile, so that a batch that ran more
    rounds — which depends on its flips — does not weigh more (its examples' flips near 1/2
    had pulled the profile 10–23% up). ``events``: the copies whose value the standard error
    learns from (default: the nonzero values; with the control variate, the copies whose flip
    differs from the tangent's), counted with the copies for the warning of few flips
    (:meth:`.tokenwise.TokenSensitivity._warn_few_events`). ``floor``: the least
    :math:`\sum_b \widehat{\operatorname{Var}}(\hat m_b)` the batch reports
    (:func:`._alloc.zero_floor`). ``ties``: :func:`_add_examples`'s."""
    b = valid.shape[0]
    u, usrc, utok = units(vals, src, tok, group)
    cnt = _counts(usrc, b, u)
    mean = torch.zeros_like(cnt).index_add_(0, usrc, u) / cnt
    st.copies += len(vals)
    st.events += int((vals != 0).sum()) if events is None else events
    within, q = _within_parts(u, usrc, utok, valid, per_cell)
    _add_examples(st, mean, within, floor, ties, q)
    if positions is not None:
        # with num_tokens a copy stands for its example's real tokens over those each round
        # draws (1/π: the profile would otherwise lean towards short examples, all of whose
        # tokens are drawn); every round draws its own subset, so π is per round, not the
        # share of tokens drawn in some round
        weight = None
        if num_tokens is not None:
            k = valid.to(src.device).sum(1).double()
            weight = (k / k.clamp(max=num_tokens).clamp(min=1))[src].to(vals.device)
        if rounds > 1:
            weight = (torch.full_like(vals, 1.0 / rounds, dtype=torch.float64) if weight is None
                      else weight / rounds)
        _accumulate_positions(st, vals.double(), src, tok, valid if real is None else real,
                              positions, weight)


def _add_examples(st: State, mean: Tensor, within: Tensor, floor: float = 0.0,
                  ties: Tensor | None = None, q: Tensor | None = None) -> None:
    """Add examples with rates ``mean`` (B,) and their variance estimates ``within`` (B,),
    whose sum is raised to ``floor`` where it is below it (a NaN sum stays NaN). The examples
    whose estimate is NaN (a single unit of draws) are counted (``single``): the fixed-subset
    standard error is NaN with one of them, and ``compute`` says why
    (:func:`one_unit_warning`). ``ties`` (B,) bool, on the host: the examples whose flips are
    tie-breaks (:func:`.outputs.tie_breaks`), whose rates are summed in ``tie_rates`` as
    ``s1`` sums them (float64: their difference is the others' sum, not a rounding of it).
    ``q`` (B,): the examples' Satterthwaite terms (:func:`_within_parts`), summed in
    ``within_q``; None where the design gives none (an allocation's: read as many degrees of
    freedom, the normal quantile)."""
    # one copy to the host per update (on a GPU: one wait for the device, not four)
    w = within.double()
    qsum = (torch.zeros(1, dtype=torch.float64, device=w.device) if q is None
            else q.double().sum().reshape(1))
    host = torch.cat([mean.double(), qsum, w.sum().reshape(1),
                      w.isnan().sum().double().reshape(1)])
    host = host.cpu()
    rates = host[:-3]
    st.within_q += host[-3].item()
    st.n += len(rates)
    st.s1 += rates.sum().item()
    st.s2 += (rates * rates).sum().item()
    st.single += int(host[-1].item())
    if ties is not None:
        st.ties += int(ties.sum())
        st.tie_rates += rates[ties].sum().item()
    total = host[-2].item()
    st.within += floor if total < floor else total
    st.samples.append(rates.float())


def accumulate_tokens(
    st: State, y: Tensor, var: Tensor, valid: Tensor, *, positions: str | None,
    real: Tensor | None = None, copies: int = 0, events: int = 0, floor: float = 0.0,
    ties: Tensor | None = None,
) -> None:
    """Add one batch measured token by token (``allocation``, :mod:`._alloc`) to ``st``:
    ``y`` (B, T) each real token's unbiased value, ``var`` (B, T) its variance estimate;
    ``copies`` made, ``events`` of them nonzero; ``floor`` and ``ties`` as for
    :func:`accumulate`."""
    v = valid.to(y.device)
    k = v.sum(1).double()
    st.copies += copies
    st.events += events
    _add_examples(st, (y.double() * v).sum(1) / k, (var.double() * v).sum(1) / k**2, floor,
                  ties)
    if positions is not None:
        cells = v.nonzero()
        _accumulate_positions(st, y.double()[v], cells[:, 0], cells[:, 1],
                              v if real is None else real.to(v.device), positions)


def _accumulate_positions(
    st: State, v: Tensor, src: Tensor, tok: Tensor, real: Tensor, align: str,
    weight: Tensor | None = None,
) -> None:
    """Add values ``v`` of the tokens (``src``, ``tok``) to the per-position profile; right
    alignment counts positions from each example's last ``real`` token (real tokens left out of
    the perturbed ones still count: −1 stays the last real token)."""
    valid = real.to(src.device)
    t = valid.shape[1]
    if weight is not None:  # weights of exactly 1 leave every sum as it was
        v = v * weight
    if align == "right":  # index t-1 ↔ position −1 (the last real token)
        # number of real tokens after each token: 0 for the last real one
        after = valid.flip(1).cumsum(1).flip(1) - valid.long()
        idx = t - 1 - after[src, tok]
    else:
        idx = tok
    ps = torch.zeros(t, dtype=torch.float64, device=v.device).index_add_(0, idx, v).cpu()
    pc = torch.zeros(t, dtype=torch.float64, device=v.device).index_add_(
        0, idx, torch.ones_like(v) if weight is None else weight.double()
    ).cpu()
    n = max(t, len(st.pos_sum))
    left = align == "right"
    st.pos_sum = pad_to(st.pos_sum, n, left) + pad_to(ps, n, left)
    st.pos_cnt = pad_to(st.pos_cnt, n, left) + pad_to(pc, n, left)


#: the state's sums beside n, s1, s2 and within (merged and all-reduced by adding them)
_COUNTS = ("forward", "forward_fp32", "checked", "copies", "events", "single", "ties",
           "tie_rates", "tie_flips", "flips")


def merged(a: State, b: State, align: str, scale: float = 1.0) -> State:
    """The state of ``a`` and ``b`` together, ``b``'s per-position sums and counts times
    ``scale`` (to ``a``'s unit of copies per token: :meth:`.tokenwise.TokenSensitivity.merge`)."""
    n = max(len(a.pos_sum), len(b.pos_sum))
    left = align == "right"
    if scale != 1.0:
        b = State(pos_sum=b.pos_sum * scale, pos_cnt=b.pos_cnt * scale, **{
            f: getattr(b, f) for f in ("n", "s1", "s2", "within", "within_q", "samples",
                                       *_COUNTS)})
    return State(
        n=a.n + b.n, s1=a.s1 + b.s1, s2=a.s2 + b.s2, within=a.within + b.within,
        within_q=a.within_q + b.within_q,
        **{f: getattr(a, f) + getattr(b, f) for f in _COUNTS},
        pos_sum=pad_to(a.pos_sum, n, left) + pad_to(b.pos_sum, n, left),
        pos_cnt=pad_to(a.pos_cnt, n, left) + pad_to(b.pos_cnt, n, left),
        samples=a.samples + b.samples,
    )


def result(
    st: State, estimand: str, align: str, bounded: bool, sigma: float | None
) -> SensitivityResult:
    """Estimate, standard errors and profiles of everything in ``st``."""
    if st.n == 0:
        raise RuntimeError("no examples measured yet: call update(inputs) first")
    est = st.s1 / st.n
    per_sample = torch.cat(st.samples) if st.samples else torch.zeros(0)
    var_data = (st.s2 - st.n * est * est) / (st.n - 1) if st.n > 1 else float("nan")
    if var_data != 0 and _alike(st, per_sample, est):
        var_data = 0.0
    se_data = math.sqrt(max(var_data, 0.0) / st.n) if st.n > 1 else float("nan")
    se_subset = math.sqrt(max(st.within, 0.0)) / st.n if math.isfinite(st.within) else math.nan
    se = se_data if estimand == "data" else se_subset
    # distances: Student's t on the subset error's Satterthwaite degrees of freedom (class flips
    # keep the normal's 1.96, guarded by the warning of few flips: see the module docstring)
    lo, hi = interval(est, se, estimand, st.n, bounded, math.inf if bounded else subset_dof(st))
    p = len(st.pos_sum)
    positions = torch.arange(-p, 0) if align == "right" else torch.arange(p)
    # the counts are weights (1/rounds with target_stderr, K/k with num_tokens): a position
    # whose copies weigh less than 1 in all is still their weighted mean (divided by at least
    # 1 it had read an always-flipping token at 0.67 or 0.4)
    cnt = st.pos_cnt
    per_pos = st.pos_sum / torch.where(cnt > 0, cnt, torch.ones_like(cnt))
    per_pos[cnt == 0] = float("nan")
    return SensitivityResult(
        estimate=est, stderr=se, ci95=(lo, hi), estimand=estimand, stderr_subset=se_subset,
        num_examples=st.n, num_forward=st.forward, per_sample=per_sample,
        per_position=per_pos, positions=positions, position_counts=st.pos_cnt.clone(),
        sigma=sigma, num_forward_fp32=st.forward_fp32,
        recheck_fraction=st.forward_fp32 / st.checked if st.checked else None,
    )


def _alike(st: State, per_sample: Tensor, est: float) -> bool:
    r"""Whether the data variance of ``st`` is 0: every one of its (two or more) per-example
    rates ``per_sample`` is the same, and :math:`\sum m^2 - n\bar m^2` is within the rounding
    of those raw sums. Summed in float64, rates that are all alike leave a remainder of a few
    units in the last place of :math:`\sum m^2`: five examples at 5/9 each read
    ``0.5556 ± 0.0000000033``, a standard error that no spread gave, and the warning that rates
    alike give no standard error (:meth:`.tokenwise.TokenSensitivity._warn_no_spread`, which
    reads an exact 0) was skipped; at 4/9 the remainder happened to be 0. A real spread is far
    above that rounding, so its variance is left as it was, to the last bit."""
    n = st.n
    if n < 2 or len(per_sample) != n:
        return False
    rounding = 4 * (n + 2) * sys.float_info.epsilon * abs(st.s2)
    if abs(st.s2 - n * est * est) > rounding:
        return False
    return bool((per_sample == per_sample[0]).all())


def subset_dof(st: State) -> float:
    r"""The Satterthwaite degrees of freedom of the subset standard error of ``st``:
    :math:`(\sum_j V_j)^2 / \sum_j V_j^2/\nu_j` over the parts :math:`V_j` of its variance
    estimate (a cell's, or an example's under the i.i.d. formula) with :math:`\nu_j` degrees of
    freedom each; inf where they are not known (``within_q`` 0: an allocation's rounds, a state
    rebuilt from sums alone)."""
    q, w = st.within_q, st.within
    if not (q > 0 and math.isfinite(q) and math.isfinite(w)):
        return math.inf
    return w * w / q


def interval(
    est: float, se: float, estimand: str, n: int, bounded: bool, dof: float = math.inf
) -> tuple[float, float]:
    """The 95% interval ``est ± q·se`` of ``n`` examples (q: :func:`interval_quantile`; for
    ``"subset"`` with finite ``dof``, Student's t quantile with ``dof`` degrees of freedom,
    :func:`subset_dof`), clipped to [0, 1] where ``bounded`` (class flips)."""
    if estimand != "data" and math.isfinite(dof):
        from scipy.stats import t as student_t  # imported lazily: scipy's import is slow

        half = float(student_t.ppf(0.975, max(dof, 1.0))) * se
    else:
        half = interval_quantile(estimand, n) * se
    lo, hi = est - half, est + half
    if bounded:
        # clipped to [0, 1]; an estimate outside it (a control variate's can fall below 0)
        # leaves the interval at that end's bound, never inverted
        lo, hi = min(max(lo, 0.0), 1.0), max(min(hi, 1.0), 0.0)
    return lo, hi


def no_data_stderr(estimand: str, n: int) -> bool:
    """Whether the standard error asked for is the data one of a single example: NaN, since
    one rate has no spread (:func:`result`)."""
    return estimand == "data" and n < 2


def one_example_warning(
    what: str, subset: str | None, target: bool = False, rates: str = "per-example rates",
    subject: str = "the standard error",
) -> str:
    """Why the data standard error of ``what`` (a sensitivity, a difference, printed with its
    ``± nan``) on one example is NaN, and the fixes: more examples, or ``estimand="subset"``,
    whose standard error and interval for this example ``subset`` gives (None where it is NaN
    too: a single unit of the example's noise draws has no spread either). ``target``: the
    rounds of ``target_stderr`` stopped on that subset standard error, as they always do.
    ``rates``: what the data standard error is the spread of (a difference's: per-example
    differences). It begins as the other warnings of what a standard error rests on (few flips,
    no flip) do, with ``subject``, so that a filter of those takes this one alike. Without it
    the result read ``± nan (95% CI nan–nan)`` and the only word was of few flips, which was
    not the reason."""
    if subset is not None:
        fix = ("pass estimand='subset' for the standard error of the noise alone, for this one "
               f"example (the fixed subset, not the data it was drawn from): here {subset}, "
               "also in stderr_subset" + (", the one target_stderr= stopped on" if target
                                          else ""))
    else:
        fix = ("draw its noise more often (a larger repeats=) and pass estimand='subset' for "
               "the standard error of the noise alone, for this one example (its stderr_subset "
               "is NaN too: a single unit of draws, one copy or one antithetic pair, has no "
               "spread either)")
    return (
        f"{subject} rests on one example, and the data standard error (estimand='data', the "
        f"default) needs at least two examples: it is the spread of the {rates} over sqrt(n), "
        f"and one example has none, so {what} (95% CI nan–nan). Measure two or more examples "
        f"(another update() adds them), or {fix}"
    )


def one_unit_warning(
    what: str, single: int, n: int, unit: str, fix: str, rates: str = "per-example rates",
    subject: str = "the standard error",
) -> str:
    """Why the fixed-subset standard error (``estimand="subset"``) of ``what`` (a
    sensitivity, printed with its ``± nan``) is NaN: ``single`` of the ``n`` examples had a
    single ``unit`` of noise draws (one copy, one antithetic pair, or with ``num_tokens`` all
    draws of one sampled token), and the variance of an example's estimate is estimated from
    the spread of its units, which one unit does not have; ``fix``: the draws that give every
    example two units. It begins as :func:`one_example_warning` does (the data estimand's
    NaN of one example), so that a filter of those takes this one alike. Without it
    ``0.1562 ± nan (95% CI nan–nan, subset)`` came with no word, or with the warning of few
    flips, which was not the reason (``mode="whole", repeats=1``; or one example of a single
    real token among many with ``repeats=1``: the whole batch's standard error was NaN).
    ``rates`` and ``subject`` as for :func:`one_example_warning` (a paired difference's)."""
    ones = (f"{single:,} of the {n:,} examples had one" if single
            else "an example had one")  # a state without the count: an older pickle's
    data = (f"the spread of the {rates}, once two or more examples are measured"
            if n < 2 else f"the spread of the {rates}, finite here")
    return (
        f"{subject} rests on a single unit of noise draws for some examples, and the "
        "fixed-subset standard error (estimand='subset') needs two or more units of every "
        "example: it is the spread of an example's units over sqrt(units), and one unit has "
        f"none, so {what} (95% CI nan–nan); {ones} ({unit}). For a finite one, draw more: "
        f"{fix}; or pass estimand='data' ({data})"
    )


@functools.lru_cache(maxsize=256)
def interval_quantile(estimand: str, n: int) -> float:
    """The multiple of the standard error on either side of the 95% interval: for ``"data"``
    the 0.975 quantile of Student's t with ``n - 1`` degrees of freedom (NaN for one example,
    whose standard error is NaN too), for ``"subset"`` 1.96 (normal approximation)."""
    if estimand != "data":
        return 1.96
    if n < 2:
        return math.nan
    from scipy.stats import t as student_t  # imported lazily: scipy's import is slow

    return float(student_t.ppf(0.975, n - 1))


def reduce_device(backend: str) -> torch.device:
    """Where the sums travel for a ``torch.distributed`` backend: the CPU where it reduces CPU
    tensors (gloo, MPI, or a ``"cpu:gloo,cuda:nccl"`` pair), else (NCCL) this process's GPU."""
    backend = backend.lower()
    if any(name in backend for name in ("gloo", "mpi", "cpu:")) or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def repeated_ranks(infos: list[dict[str, Any]]) -> str | None:
    """A warning where two unsharded ranks hold the same per-sample rates, every one of them
    (at least two examples, one of them neither 0 nor 1): most likely both measured the same
    examples with the same seed, and the total counts each of them twice. None otherwise."""
    seen: dict[tuple[float, ...], int] = {}
    for r, info in enumerate(infos):
        rates = tuple(x for batch in info["samples"] for x in batch)
        if info.get("shard") is not None or len(rates) < 2 or all(x in (0, 1) for x in rates):
            continue
        if rates in seen:
            return (
                f"ranks {seen[rates]} and {r} hold the same per-example rates, all {len(rates)} "
                "of them: most likely both measured the same examples with the same seed, and "
                "the total counts each of them twice (the standard error too small by about "
                "sqrt(2)). Give each rank its own examples (a DistributedSampler) or its share "
                "of every batch (shard=(rank, world_size))"
            )
        seen[rates] = r
    return None


#: the warning of metrics (or ranks) whose examples drew the same noise, copy for copy
SHARED_NOISE = (
    "{who} drew the same noise for their examples: the same seed from the same point of its "
    "stream ({how}), so the k-th copy of each got the same noise and their flips are "
    "correlated. The estimate is unbiased, but its standard error counts every example's "
    "draws as independent and is too small, the more so the more metrics share it. Give each "
    "its own "
    "seed (under torchrun generator=seed + 1_000_003 * rank), or give every rank the same "
    "batches with shard=(rank, world_size) (said once per metric)")


def shared_noise_ranks(infos: list[dict[str, Any]]) -> str | None:
    """A warning where two ranks' examples drew the same noise (their ``marks``, where each
    rank's noise started: :meth:`~senslab.measure.TokenSensitivity._held_marks`; sharded
    ranks have none, their copies sharing one stream by design). None otherwise."""
    seen: dict[Any, int] = {}
    for r, info in enumerate(infos):
        for mark in info.get("marks") or ():
            key = tuple(mark)
            if key in seen and seen[key] != r:
                return SHARED_NOISE.format(
                    who=f"ranks {seen[key]} and {r}",
                    how="one generator= seed on every rank, say")
            seen.setdefault(key, r)
    return None


def all_reduced(st: State, align: str, group: Any = None,
                about: dict[str, Any] | None = None,
                say: Callable[[str], None] | None = None,
                check: Callable[[list[dict[str, Any]]], None] | None = None) -> State:
    """``st`` summed over all processes of ``torch.distributed`` (per-sample rates gathered in
    the one-process order, :func:`gathered_order`; the sums reduced on the device the backend
    reduces on). ``about``: what :func:`gathered_order` checks across the ranks (``identity``,
    ``shard``) and ``unit``, the copies per token the state's per-position profile counts in:
    every rank's profile is summed in rank 0's unit; anything else ``check`` reads. ``say``:
    called with the warning of :func:`repeated_ranks`, if any. ``check``: called with every
    rank's ``about`` (in rank order) after :func:`gathered_order`'s checks, before anything is
    summed; it raises where the ranks' states do not add up (every rank sees the same list, so
    every rank raises alike and none waits on the reduction)."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    mine = {**(about or {}), "p": len(st.pos_sum), "samples": [s.tolist() for s in st.samples]}
    infos: list[Any] = [None] * world
    dist.all_gather_object(infos, mine, group=group)
    slots = gathered_order(infos)  # raises before the reduction, on every rank alike
    if check is not None:
        check(infos)  # so does this
    twins = repeated_ranks(infos) or shared_noise_ranks(infos)
    if twins is not None and say is not None:
        say(twins)
    p = max(info["p"] for info in infos)
    left = align == "right"
    # a rank that draws more copies per token (repeats) weighs each in rank 0's unit: counted as
    # they come, its examples' tokens had weighed more in the profile than the others'
    scale = infos[0].get("unit", 1.0) / mine.get("unit", 1.0)
    pos_sum, pos_cnt = pad_to(st.pos_sum, p, left), pad_to(st.pos_cnt, p, left)
    if scale != 1.0:
        pos_sum, pos_cnt = pos_sum * scale, pos_cnt * scale
    scal = torch.tensor([st.n, st.s1, st.s2, st.within, st.within_q,
                         *(getattr(st, f) for f in _COUNTS)],
                        dtype=torch.float64)
    vec = torch.cat([scal, pos_sum, pos_cnt])
    vec = vec.to(reduce_device(str(dist.get_backend(group))))
    dist.all_reduce(vec, group=group)
    vec = vec.cpu()
    per_rank = [info["samples"] for info in infos]
    if slots is not None:
        samples = interleave(per_rank, slots)
    else:  # rank by rank: rank 0's examples, then rank 1's, …
        samples = torch.tensor([x for rates in per_rank for batch in rates for x in batch],
                               dtype=torch.float32)
    k = 5 + len(_COUNTS)  # the scalars' length: the profile's sums and counts follow
    counts = {f: (float if f == "tie_rates" else int)(vec[5 + i]) for i, f in enumerate(_COUNTS)}
    return State(
        n=int(vec[0]), s1=float(vec[1]), s2=float(vec[2]), within=float(vec[3]),
        within_q=float(vec[4]), **counts,
        pos_sum=vec[k : k + p].clone(), pos_cnt=vec[k + p :].clone(),
        samples=[samples],
    )


def fixed(value: float, decimals: int = 4) -> str:
    """``value`` with ``decimals`` decimals, or with more where those would misstate it: a
    nonzero value keeps two significant digits (one flip in 23,008 copies, a rate of 4.3e-05,
    printed as 0.0000 with a standard error of 0.0000: no flip at all, known exactly), and a
    value short of 1 is never printed as 1 (every copy flipped)."""
    if not math.isfinite(value) or value == 0:
        return f"{value:.{decimals}f}"
    places = max(decimals, 1 - math.floor(math.log10(abs(value))))
    text = f"{value:.{places}f}"
    while abs(float(text)) == 1 and abs(value) != 1 and places < 17:
        places += 1
        text = f"{value:.{places}f}"
    return text
