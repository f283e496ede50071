r"""Verdicts: the rules that turn estimated effects into *supported*, *contradicted* or
*inconclusive* (docs/definitions.md#verdicts).

A claim is directional: "the ViT is less sensitive than the MLP", "PARITY's sharpness grows with
n". Each part of a claim is an :class:`Effect`, oriented so that a **positive value is the
claimed direction** (MLP − ViT, the slope), with a standard error and the degrees of freedom of
its reference distribution. :func:`judge` decides every part with a two-sided test at level
:data:`ALPHA`:

* **supported** — the interval lies above zero (the claimed side);
* **contradicted** — it lies below zero (the other side);
* **inconclusive** — it contains zero. The part then states the smallest effect it could have
  detected with power :data:`POWER` (:meth:`Effect.detectable`: on the normal
  :math:`(z_{1-\alpha_i/2} + z_{\text{power}})\,\mathrm{se}`, on Student's t the effect at which
  the noncentral t crosses :math:`\pm t_{1-\alpha_i/2,\nu}` with that probability; for a mean
  over seeds with a known measurement error, the effect at which the test of
  :func:`over_seeds`, whose s.e. never falls below that error, does — before 2026-12-06 the
  noncentral t's, which such a part reached only 75% of the time on 3 or 5 seeds at the floor).

A claim with :math:`m > 1` parts is decided with Holm's step-down correction: the parts sorted by
their two-sided p-values :math:`p_{(1)} \le \dots \le p_{(m)}` are tested at
:math:`\alpha_i = \alpha/(m - i + 1)` until the first that is not significant; that part and
every later one are tested at that part's level (so none of them is significant). Each part's
interval is at its own level :math:`1 - \alpha_i`, so a part is decided exactly when its interval
excludes zero; "significant" in the step-down means just that (a p-value within rounding of
:math:`\alpha_i` cannot step on past a part whose interval contains zero, nor stop at a part
whose interval excludes it). The claim is supported if every part is, contradicted if any part
is, and inconclusive otherwise. "Not comparable" is not decided here: it is for runs that failed the
claim's precondition (unequal train accuracy, a run that never converged), and the experiment
returns it before any effect is judged.

Where an effect comes from:

* :func:`over_seeds` — one value per training seed (for a comparison of two models, the
  difference of the two models trained with that seed and measured on the same examples and
  noise draws): the mean, its standard error :math:`s/\sqrt n` and Student's t with
  :math:`n - 1` degrees of freedom. The seed-level variance :math:`s^2` contains the measurement
  noise of each value as well as the seed-to-seed variation; both parts are reported
  (:math:`\mathrm{se}_\text{measure}^2 = \sum_i \mathrm{se}_i^2 / n^2`,
  :math:`\mathrm{se}_\text{seed}^2 = \max(\mathrm{se}^2 - \mathrm{se}_\text{measure}^2, 0)`).
  The standard error is never below :math:`\mathrm{se}_\text{measure}`: seeds whose values
  happen to agree more closely than their measurement error allows (equal flip counts of a few
  flips each) do not make the mean exact.
  With one seed the measurement standard error is all there is: the normal reference, and the
  part says that seed-to-seed variation is not in its interval ("measurement noise only"); one
  seed without a measurement error (an exact quantity, or one whose error is not given) has no
  standard error, and the part says that seed-to-seed variation needs at least 2 seeds (before
  2026-11-30 it, too, read "measurement noise only", although there was no measurement noise).
  A measurement error of exactly 0 is no measurement error: one such seed has no standard error
  either (before 2026-12-03 it read "+0.5 [+0.5, +0.5] supported, p = 0").
  Seeds that all tie, without a (non-zero) measurement error, give no standard error at all:
  the spread of a few seeds that happen to agree is chance, not precision, so the part is
  inconclusive and says that the seeds tied and more are needed (before 2026-11-30 it read
  "+0.5 [+0.5, +0.5] supported, p = 0").
  The spread is summed with scaling (:func:`math.hypot`), so that values below about
  :math:`10^{-154}` or above :math:`10^{154}` neither underflow to a standard error of 0 nor
  overflow (before 2026-12-03 three seeds of order :math:`10^{-200}` read "supported, p = 0").
  A seed whose measurement error is unknown (NaN) leaves the floor at the errors of the seeds
  that have one, and ``se_measure`` unknown (before 2026-12-04 it dropped the floor of them all:
  three close seeds read "supported" on their spread alone); a negative error is refused.
* :func:`paired_by_seed` — ``high − low`` per seed over the seeds both sides have, by seed id; a
  seed that only one side has is left out, and the part says which ("seeds without a pair, left
  out: ...") in its ``method`` and in its words.
* :func:`measured` — one estimate with a measurement standard error (normal reference).
* :func:`bootstrap` — a statistic of a set of runs: the standard error is the standard
  deviation of the statistic over runs resampled with replacement (a fixed generator), times
  :math:`\sqrt{n/(n-1)}` (before 2026-12-06 without it: the plug-in spread, which decided a
  mean over 3–11 runs at a true 0 in 6–7% of simulations), with Student's t on
  (number of runs − 1) degrees of freedom. (The slope of hr_sharpness_vs_length
  and the rank correlation of hr_norm_vs_blowup no longer use it: a bootstrap over a handful of
  runs has no spread to draw on — two runs give the same slope in every resample — see their
  modules.)

A part whose standard error is unknown says why in its ``method``, after :data:`NO_SE`
(":func:`describe`" repeats it: "no uncertainty estimate (the 3 seeds tied, more seeds are
needed)"). :func:`judge` treats a standard error of exactly 0 the same way, whatever gave it —
runs exactly on a line, a bootstrap whose every resample gave the same value, a measurement
error of 0: it claims an exact value, which no handful of runs can show (before 2026-12-04 such
a part read "+0.1 [+0.1, +0.1] supported", with p = 0 putting it first in Holm's order).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from scipy import integrate, optimize, stats

__all__ = [
    "ALPHA", "CONTRADICTED", "INCONCLUSIVE", "NOT_COMPARABLE", "NO_SE", "POWER", "RHO_CLIP",
    "SUPPORTED", "UNPAIRED", "WORDS", "Effect", "bootstrap", "describe", "fisher_z", "judge",
    "measured", "not_comparable", "over_seeds", "paired_by_seed", "plain", "verdict",
]

SUPPORTED = "supported"
CONTRADICTED = "contradicted"
INCONCLUSIVE = "inconclusive"
NOT_COMPARABLE = "not comparable"
#: every verdict word, in the order reports list them
WORDS = (SUPPORTED, CONTRADICTED, INCONCLUSIVE, NOT_COMPARABLE)
#: the level of every test (two-sided), before the multiple-comparison correction
ALPHA = 0.05
#: the power at which an inconclusive part states the smallest effect it could have detected
POWER = 0.8
#: bootstrap resamples (:func:`bootstrap`)
BOOTSTRAP = 2000
#: what an Effect's ``method`` says, followed by the reason, when it has no standard error
NO_SE = "no standard error: "
#: what an Effect's ``method`` says, followed by the seeds, when :func:`paired_by_seed` left
#: out seeds that only one side has
UNPAIRED = "seeds without a pair, left out: "
#: values of seeds closer than this, relative to their size, are tied (:func:`over_seeds`)
TIE_TOLERANCE = 1e-12
#: |ρ| is clipped to this before Fisher's z, so that a perfect rank order stays finite
RHO_CLIP = 0.999


def fisher_z(rho: float) -> float:
    """atanh ρ, with ρ clipped to ±:data:`RHO_CLIP` (NaN stays NaN): the scale on which a
    correlation is judged and on which a ladder compares it across rungs."""
    if not math.isfinite(rho):
        return math.nan
    return math.atanh(max(-RHO_CLIP, min(RHO_CLIP, rho)))


@dataclass(frozen=True)
class Effect:
    """An estimated effect, positive in the claimed direction.

    ``se``: its standard error (NaN: unknown, and the part cannot be decided); ``df``: degrees of
    freedom of the reference distribution (``math.inf``: normal); ``seeds``: independent training
    runs behind it; ``se_measure``/``se_seed``: the parts of ``se`` from measurement noise and
    from seed-to-seed variation, where known; ``what``: the quantity in words ("mlp −
    vit_small"); ``method``: how ``se`` was obtained.
    """

    value: float
    se: float
    df: float = math.inf
    seeds: int = 1
    se_measure: float | None = None
    se_seed: float | None = None
    what: str = ""
    method: str = "measurement"
    #: what one of the ``seeds`` independent units is, in words ("seed", "run", "setting")
    unit: str = "seed"

    def __post_init__(self) -> None:
        if self.se < 0:  # NaN (unknown) passes
            raise ValueError(f"Effect {self.what!r}: standard error {self.se} < 0 (a standard "
                             "error is a square root; pass its absolute value, or NaN if unknown)")
        if self.se > 0 and math.isfinite(self.se) and not self.df > 0:  # NaN df fails too
            # Student's t has no quantiles below 1 degree of freedom: judge() failed deep in
            # scipy ("the function value at x=0.0 is NaN") instead of naming the input
            raise ValueError(f"Effect {self.what!r}: {self.df} degrees of freedom with a standard "
                             f"error of {self.se} (Student's t needs df > 0); pass df = math.inf "
                             "for a normal reference, or a NaN standard error if there is none")

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the reference distribution (t with ``df``, or normal)."""
        if math.isinf(self.df):
            return float(stats.norm.ppf(q))
        return float(stats.t.ppf(q, self.df))

    def interval(self, alpha: float = ALPHA) -> tuple[float, float]:
        """The two-sided ``1 − alpha`` interval."""
        half = self.quantile(1 - alpha / 2) * self.se
        return self.value - half, self.value + half

    def p_value(self) -> float:
        """Two-sided p-value of "the effect is zero" (NaN when it cannot be computed)."""
        if not (math.isfinite(self.value) and math.isfinite(self.se)):
            return math.nan
        if self.se == 0:
            return 1.0 if self.value == 0 else 0.0
        z = abs(self.value) / self.se
        tail = stats.norm.sf(z) if math.isinf(self.df) else stats.t.sf(z, self.df)
        return float(min(1.0, 2 * tail))

    def detectable(self, alpha: float = ALPHA, power: float = POWER) -> float:
        r"""The smallest true effect a two-sided level-``alpha`` test detects with ``power``: on
        the normal, :math:`(z_{1-\alpha/2} + z_{power})\,s`; on Student's t, the effect whose
        noncentral t (noncentrality effect / s) crosses either critical value with
        probability ``power`` (the normal shortcut with t quantiles overstated the power: 0.77
        instead of 0.80 on 2 degrees of freedom). With a measurement error ``se_measure``, the
        floor of :func:`over_seeds`' s.e., the test is the one over that floored s.e.
        (:func:`_floored_detectable`, the seeds' spread taken as the plug-in s.e. as above)."""
        _check_levels(f"Effect {self.what!r}: detectable", alpha, power)
        if not math.isfinite(self.se) or self.se == 0 or math.isinf(self.df):
            return (self.quantile(1 - alpha / 2) + self.quantile(power)) * self.se
        crit = self.quantile(1 - alpha / 2)
        df = self.df
        floor = self.se_measure
        if floor is not None and math.isfinite(floor) and floor > 0:
            # the s.e. of over_seeds is floored at the measurement error: the test never divides
            # by less, so the noncentral t (which counts the samples whose spread came out
            # small) overstated its power: 0.75 instead of 0.80 on 2 df at the floor
            ratio = min(floor / self.se, 1.0)
            return _floored_detectable(crit, df, ratio, power) * self.se

        def short(ncp: float) -> float:
            lower = float(stats.nct.cdf(-crit, df, ncp))  # the far tail: NaN where it underflows
            return float(stats.nct.sf(crit, df, ncp)) + (lower if math.isfinite(lower) else 0.0) \
                - power

        hi = crit + self.quantile(power)
        while short(hi) < 0:
            hi *= 2
        return float(optimize.brentq(short, 0.0, hi, xtol=1e-10)) * self.se


def _check_levels(who: str, alpha: float, power: float) -> None:
    """Refuse a level or power outside (0, 1): alpha = 0 or a power of 1 (or 80, a percentage)
    looped for ever in the search for the detectable effect, alpha = 5 failed deep in scipy, and
    alpha = 1 "supported" an effect at a zero-width interval, "at 0%"."""
    for name, x, usual in (("alpha", alpha, ALPHA), ("power", power, POWER)):
        if not 0 < x < 1:  # NaN fails too
            raise ValueError(f"{who}: {name} = {x} is not a probability strictly between 0 and "
                             f"1; pass a share, not a percentage (the default is {usual})")


def _floored_detectable(crit: float, df: float, ratio: float, power: float) -> float:
    r"""The noncentrality (effect / s.e.) at which the test of :func:`over_seeds` — the mean
    over its s.e. ``max(s/√n, floor)`` against ±``crit`` — rejects with ``power``, where the
    seeds' spread is the plug-in s.e. and the floor is ``ratio`` of it: with
    :math:`V = \chi^2_\nu/\nu`, the power at noncentrality :math:`\lambda` is
    :math:`E\,[\Phi(\lambda - c\,m) + \Phi(-\lambda - c\,m)]`,
    :math:`m = \max(\sqrt V, \text{ratio})` (``ratio`` 0 is the noncentral t's)."""
    log_norm = math.log(df / 2) - math.lgamma(df / 2)  # the density of V = χ²_ν / ν

    def density(v: float) -> float:
        return math.exp(log_norm + (df / 2 - 1) * math.log(df * v / 2) - df * v / 2) \
            if v > 0 else 0.0

    def phi(x: float) -> float:
        return 0.5 * math.erfc(-x / math.sqrt(2))

    below = float(stats.chi2.cdf(df * ratio * ratio, df))  # V ≤ ratio²: the floor's s.e.

    def achieved(ncp: float) -> float:
        at_floor = below * (phi(ncp - crit * ratio) + phi(-ncp - crit * ratio))
        above, _ = integrate.quad(
            lambda v: (phi(ncp - crit * math.sqrt(v)) + phi(-ncp - crit * math.sqrt(v)))
            * density(v), ratio * ratio, math.inf, limit=200)
        return at_floor + above - power

    hi = 2 * crit + 2
    while achieved(hi) < 0:
        hi *= 2
    return float(optimize.brentq(achieved, 0.0, hi, xtol=1e-10))


def measured(value: float, se: float, what: str = "") -> Effect:
    """One estimate with its measurement standard error (one training run: seed-to-seed
    variation is not in it)."""
    return Effect(float(value), float(se), math.inf, 1, float(se), None, what, "measurement")


def over_seeds(values: Sequence[float], measure_ses: Sequence[float] | None = None,
               what: str = "", unit: str = "seed") -> Effect:
    """The mean of one value per training seed, with Student's t on ``len(values) − 1`` degrees
    of freedom; ``measure_ses``: each value's measurement standard error (to split the
    uncertainty into its two parts). One seed: :func:`measured` (NaN standard error without
    ``measure_ses``). ``unit`` names what each value comes from when it is not one seed of one
    setting (e.g. ``"setting"``: one run per task setting), for the words of the verdict."""
    vals = [float(v) for v in values]
    if measure_ses is not None and len(measure_ses) != len(vals):
        raise ValueError(f"over_seeds: {len(vals)} values but {len(measure_ses)} standard errors")
    if not vals:
        raise ValueError("over_seeds: no values (no seed produced this quantity)")
    n = len(vals)
    ses = None if measure_ses is None else [float(s) for s in measure_ses]
    if ses is not None and any(s < 0 for s in ses):
        raise ValueError(f"over_seeds ({what}): a negative measurement standard error among "
                         f"{ses} (a standard error is a square root: a negative one is a "
                         "difference or an estimate passed in its place); pass NaN where a "
                         "seed's error is unknown")
    # hypot: a sum of squares that neither underflows (tiny values) nor overflows (huge ones).
    # A seed whose error is unknown (NaN) made the whole floor NaN, and the comparison with NaN
    # then dropped it without a word: seeds that agreed closely were judged on their spread
    # alone. The seeds that have an error still bound it from below.
    unknown = 0 if ses is None else sum(1 for s in ses if math.isnan(s))
    floor = None if ses is None else math.hypot(*(s for s in ses if not math.isnan(s))) / n
    se_m = math.nan if unknown else floor
    if n == 1:  # a measurement error of 0 is none: no standard error, not an exact value
        return Effect(vals[0], se_m if se_m else math.nan, math.inf, 1, se_m, None, what,
                      f"measurement (one {unit})", unit)
    mean = sum(vals) / n
    if not math.isfinite(mean) and all(math.isfinite(v) for v in vals):
        # the sum overflowed (three seeds of 1e308): the mean itself is finite, and "cannot be
        # judged (the value is not finite)" was said of finite seeds
        mean = sum(v / n for v in vals)
    sd = math.hypot(*(v - mean for v in vals)) / math.sqrt(n - 1)
    se = sd / math.sqrt(n)
    if math.isinf(se) and math.isfinite(mean) and all(math.isfinite(v) for v in vals):
        # a deviation overflowed (seeds of ±1.7e308): halved, each is finite, and the s.e. is
        # taken without passing through the spread (which may itself exceed the largest float)
        se = math.hypot(*(v / 2 - mean / 2 for v in vals)) / math.sqrt(n * (n - 1)) * 2
    method = f"mean over {n} {unit}s (t)"
    partly = (f"the measurement error of the {n - unknown} {unit}s that have one; {unknown} "
              f"without" if unknown else "the measurement error")
    tied = (all(math.isfinite(v) for v in vals)
            and max(vals) - min(vals) <= TIE_TOLERANCE * max(abs(v) for v in vals))
    if floor is not None and (se < floor or (tied and floor > 0)):
        # a small spread cannot undo a known measurement error
        se, method = floor, f"mean over {n} {unit}s (t; s.e. floored at {partly})"
    elif tied:  # no spread and no measurement error: nothing to estimate the s.e. from
        se = math.nan
        method = (f"mean over {n} {unit}s (t); {NO_SE}the {n} {unit}s tied, more {unit}s are "
                  "needed")
    elif unknown:
        method = (f"mean over {n} {unit}s (t; measurement error unknown for {unknown} of them, "
                  "the spread is above the rest's)")
    se_seed = None if se_m is None else math.sqrt(max(se * se - se_m * se_m, 0.0))
    return Effect(mean, se, n - 1, n, se_m, se_seed, what, method, unit)


def paired_by_seed(low: Mapping[Any, tuple[float, float]], high: Mapping[Any, tuple[float, float]],
                   what: str = "") -> Effect:
    """``high − low`` paired by seed: ``{seed: (value, measurement se)}`` of each side; the seeds
    both sides have (by seed id, not by position). A seed that only one side has is left out,
    and the part's ``method`` says which, after :data:`UNPAIRED` (:func:`describe` repeats it).
    The measurement standard error of one difference is taken as
    :math:`\\sqrt{\\mathrm{se}_\\text{low}^2 + \\mathrm{se}_\\text{high}^2}` (an upper bound
    when both were measured on the same draws)."""
    seeds = sorted(set(low) & set(high), key=str)
    if not seeds:
        raise ValueError(f"paired_by_seed ({what}): no seed has both sides")
    e = over_seeds([high[s][0] - low[s][0] for s in seeds],
                   [math.hypot(high[s][1], low[s][1]) for s in seeds], what)
    alone = [f"{', '.join(map(str, sorted(set(side) - set(seeds), key=str)))} ({name} only)"
             for name, side in (("low", low), ("high", high)) if set(side) - set(seeds)]
    if alone:  # before the reason for no standard error, which describe() quotes to the end
        head, no_se, why = e.method.partition(NO_SE)
        e = replace(e, method=f"{head.rstrip('; ')}; {UNPAIRED}{'; '.join(alone)}"
                              + (f"; {no_se}{why}" if no_se else ""))
    return e


def bootstrap(units: Sequence[Any], statistic: Callable[[list[Any]], float], what: str = "",
              resamples: int = BOOTSTRAP, seed: int = 0) -> Effect:
    r"""``statistic(units)`` with the bootstrap standard error over ``units`` (runs) resampled
    with replacement, ``resamples`` times from a generator seeded with ``seed``, times
    :math:`\sqrt{n/(n-1)}` (the resamples' spread is the plug-in one: of a mean, exactly
    :math:`s\sqrt{(n-1)/n}/\sqrt n`); Student's t on ``len(units) − 1`` degrees of freedom.
    Resamples on which the statistic is undefined (NaN, e.g. a slope over one value of n) are
    left out; fewer than half defined: NaN, and the ``method`` says so after :data:`NO_SE` (as
    it does for fewer than 2 runs; before 2026-12-07 neither said why). Resamples that all give
    the same value (up to rounding: every resample of two or three runs in a perfect order has
    the same rank correlation) have a standard error of exactly 0, which :func:`judge` does not
    decide on."""
    if resamples < 2:  # one resample has no spread; none divided by zero
        raise ValueError(f"bootstrap ({what}): {resamples} resamples; a standard deviation needs "
                         f"at least 2 (the default is {BOOTSTRAP})")
    units = list(units)
    value = float(statistic(units))
    n = len(units)
    if n < 2:  # the reason after NO_SE, as every part without a standard error gives one
        return Effect(value, math.nan, math.inf, n, None, None, what,
                      f"bootstrap over runs; {NO_SE}{n} run{'s' if n != 1 else ''}: a bootstrap "
                      "needs at least 2, more runs are needed", "run")
    rng = random.Random(seed)
    reps = []
    for _ in range(resamples):
        r = float(statistic([units[rng.randrange(n)] for _ in range(n)]))
        if math.isfinite(r):
            reps.append(r)
    method = f"bootstrap over {n} runs"
    if len(reps) < resamples / 2:
        se = math.nan
        method += (f"; {NO_SE}the statistic was undefined on {resamples - len(reps)} of the "
                   f"{resamples} resamples, more than half: more runs are needed")
    elif max(reps) - min(reps) <= TIE_TOLERANCE * max(abs(r) for r in reps):
        # no spread at all: the rounding of the mean (1.6e-13 on three runs in perfect order)
        # read as a standard error, "supported" with a zero-width interval
        se = 0.0
    else:
        m = sum(reps) / len(reps)
        # × √(n/(n − 1)): the resamples' spread is the plug-in one (of the mean: s·√((n−1)/n)
        # over √n), which Student's t on n − 1 df does not expect; without it a mean over 3–11
        # runs at a true 0 was decided in 6–7% of simulations at the 5% level
        se = math.sqrt(sum((r - m) ** 2 for r in reps) / (len(reps) - 1) * n / (n - 1))
    return Effect(value, se, n - 1, n, None, None, what, method, "run")


def _without_zero_se(e: Effect) -> Effect:
    """``e``, or — when its standard error is exactly 0 — ``e`` without one (NaN), its
    ``method`` saying why. A standard error of 0 claims an exact value: a zero-width interval,
    p = 0 and "supported" for any non-zero effect (three runs exactly on a line, a bootstrap
    whose every resample gave the same value, a measurement error of 0). Runs that agree
    exactly are chance, not precision, as tied seeds are in :func:`over_seeds`."""
    if e.se != 0:
        return e
    if NO_SE in e.method:
        return replace(e, se=math.nan)
    units = f"{e.seeds} {e.unit}{'s' if e.seeds != 1 else ''}"
    if e.method.startswith("bootstrap"):
        why = (f"every resample of the {units} gave the same value: a bootstrap over so few "
               f"has no spread to draw on, more {e.unit}s are needed")
    else:
        why = (f"a standard error of exactly 0 claims an exact value, which {units} cannot "
               f"show, more {e.unit}s are needed")
    return replace(e, se=math.nan, method=f"{e.method}; {NO_SE}{why}")


def _decide(effect: Effect, alpha: float) -> str:
    lo, hi = effect.interval(alpha)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return INCONCLUSIVE
    if lo > 0:
        return SUPPORTED
    if hi < 0:
        return CONTRADICTED
    return INCONCLUSIVE


def judge(parts: Mapping[str, Effect], alpha: float = ALPHA,
          power: float = POWER) -> dict[str, Any]:
    """Decide every part (Holm-corrected when there are several) and the claim.

    Returns ``{"verdict", "parts": {name: {verdict, what, effect, se, interval, level, df,
    seeds, se_measure, se_seed, p, detectable, method}}, "correction", "alpha"}``;
    ``detectable`` is set for inconclusive parts only.
    """
    if not parts:
        raise ValueError("judge: a claim needs at least one part")
    _check_levels("judge", alpha, power)
    # before the Holm order: an s.e. of 0 gave p = 0, the first place and the full level
    parts = {name: _without_zero_se(e) for name, e in parts.items()}
    m = len(parts)
    order = sorted(parts, key=lambda k: (math.isnan(parts[k].p_value()), parts[k].p_value()))
    levels: dict[str, float] = {}
    stopped: float | None = None
    for i, name in enumerate(order):
        level = alpha / (m - i)
        # significant: decided at this level, the interval's test (p < level can disagree with it
        # when |t| is within rounding of the critical value)
        if stopped is None and _decide(parts[name], level) == INCONCLUSIVE:
            stopped = level
        levels[name] = level if stopped is None else stopped
    out: dict[str, dict[str, Any]] = {}
    for name, e in parts.items():
        a = levels[name]
        word = _decide(e, a)
        lo, hi = e.interval(a)
        entry = asdict(e)
        entry.pop("value")
        entry.update(verdict=word, effect=e.value, interval=[lo, hi], level=1 - a,
                     p=e.p_value(), detectable=None)
        # no power claim without a value, or without a standard error (an s.e. of exactly 0
        # would claim that the runs detect any effect at all)
        if word == INCONCLUSIVE and math.isfinite(e.value) and math.isfinite(e.se) and e.se > 0:
            entry["detectable"] = e.detectable(a, power)
        out[name] = _plain(entry)
    words = [p["verdict"] for p in out.values()]
    if CONTRADICTED in words:
        overall = CONTRADICTED
    elif all(w == SUPPORTED for w in words):
        overall = SUPPORTED
    else:
        overall = INCONCLUSIVE
    return {"verdict": overall, "parts": out, "alpha": alpha, "power": power,
            "correction": f"Holm over {m} parts" if m > 1 else "none (one part)"}


def plain(value: Any) -> Any:
    """``value`` with every non-finite float as None (and tuples as lists), so that a verdict is
    plain JSON and reads back equal (NaN ≠ NaN): an infinite ``df`` (normal reference) or an
    unknown s.e. is None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


_plain = plain  # the name the verdict helpers below use


def _num(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:+.3g}" if math.isfinite(x) else str(x)


def describe(name: str, part: Mapping[str, Any]) -> str:
    """One part in words: ``name: what = +0.012 [+0.004, +0.020] (95%, 3 seeds) supported``."""
    lo, hi = part["interval"]
    what = part.get("what") or name
    seeds = part.get("seeds", 1)
    unit = part.get("unit") or ("run" if part.get("method", "").startswith("bootstrap")
                                else "seed")
    level = f"{100 * part['level']:.4g}%"
    text = (f"{what} = {_num(part['effect'])} [{_num(lo)}, {_num(hi)}] ({level}, "
            f"{seeds} {unit}{'s' if seeds != 1 else ''}) {part['verdict']}")
    if part["verdict"] == INCONCLUSIVE:
        det = part.get("detectable")
        eff = part["effect"]
        if eff is None or not math.isfinite(eff):  # not finite (plain JSON: None)
            text += ", cannot be judged (the value is not finite)"
        else:
            method = part.get("method") or ""
            why = method.split(NO_SE, 1)[1] if NO_SE in method else ""
            text += (f", could detect ≥ {abs(det):.3g}" if det is not None
                     else ", no uncertainty estimate" + (f" ({why})" if why else ""))
    method = part.get("method") or ""
    if UNPAIRED in method:
        text += f" ({UNPAIRED}{method.split(UNPAIRED, 1)[1].split(NO_SE, 1)[0].rstrip('; ')})"
    if seeds == 1 and part.get("method", "").startswith("measurement"):
        se_m = part.get("se_measure")
        if isinstance(se_m, int | float) and math.isfinite(se_m) and se_m > 0:
            text += " (measurement noise only)"
        else:  # an exact quantity, or one without a known error: no noise of any kind in it
            text += (f" (one {unit}, without a measurement error: seed-to-seed variation needs "
                     f"at least 2 {unit}s)")
    return text


def verdict(parts: Mapping[str, Effect], claim: str = "", evidence: dict[str, Any] | None = None,
            note: str = "", alpha: float = ALPHA) -> dict[str, Any]:
    """An experiment's verdict from its claim's parts: ``{"verdict", "reason", "evidence",
    "effects", "correction"}``; the reason is ``claim`` (a short restatement), each part in
    words (:func:`describe`), then ``note``."""
    j = judge(parts, alpha)
    body = "; ".join(describe(k, p) for k, p in j["parts"].items())
    reason = f"{claim}: {body}" if claim else body
    if note:
        reason += f". {note}"
    return {"verdict": j["verdict"], "reason": reason, "evidence": evidence or {},
            "effects": j["parts"], "correction": j["correction"]}


def not_comparable(reason: str, evidence: dict[str, Any] | None = None) -> dict[str, Any]:
    """The verdict of runs that failed the claim's precondition."""
    return {"verdict": NOT_COMPARABLE, "reason": reason, "evidence": evidence or {},
            "effects": {}}
