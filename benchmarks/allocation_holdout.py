r"""How much an allocation of draws could gain on a real case, judged on draws it did not see.

``real_models.py --ceiling`` bounds what an *oracle* allocation could gain from the flips of R
draws per token; a token that never flipped in those draws counts there as one that never can,
so the plug-in oracle is an upper bound. This script measures allocations on draws they were not
chosen from. Every real token of the first ``--examples`` examples of a case gets ``--draws``
draws (the naive loop's noise); the draws are split into halves A and B. A design chooses
each token's expected draws :math:`e_{bt}` from half A (or from the tangent alone), and half B
judges it: with :math:`h` flips in the :math:`m` draws of B, :math:`h/m`, :math:`h(h-1)/(m(m-1))`
and :math:`h(m-h)/(m(m-1))` are unbiased for :math:`p`, :math:`p^2` and :math:`p(1-p)`, so

.. math::

    V(e) = \sum_{bt} w_b^2\, V_{bt}(e_{bt}), \qquad
    V_{bt}(e) = \frac{p(1-p)}{e}\ (e \ge 1), \qquad \frac{p}{e} - p^2\ (e < 1)

(below one draw a token is drawn with probability :math:`e`, once, and weighted by
:math:`1/e`) is estimated without bias, :math:`w_b = 1/(nK_b)`. A draw of example :math:`b`
costs :math:`c_b`, its real length (padding-aware batching), so the cost is
:math:`C(e) = \sum e_{bt} c_b`; the time to a standard error goes as :math:`V \cdot C`, and a
design's gain is equal draws' :math:`V \cdot C` over its own, at each of ``--budgets`` draws per
token on average (equal draws: the same number for every token). The halves then swap roles and
the two gains are averaged.

**Designs** (each :math:`e \propto s_b\,\sqrt{\hat v}`, :math:`s_b = 1/(K_b\sqrt{c_b})`, floored
at a fifth of the budget as ``allocation="linear"`` does):

* ``length``: :math:`\hat v` = 1 (the weights and costs alone);
* ``tangent κ=k``: :math:`\hat v = q(1-q)`, :math:`q = \Phi(-m/(k\sigma\lVert g\rVert))`, the
  tangent of senslab's allocation with its σ scaled by k; ``κ fitted`` takes k from
  ``_alloc.fit_scale`` on half A's flips (what the adaptive rounds fit), ``κ best`` the k that
  does best on half B (in hindsight: not a design, a bound on choosing k);
* ``token oracle from A``: :math:`\hat v` the Beta(½, ½) posterior mean of :math:`p(1-p)` from
  half A's flips (what a design that had already spent half A's draws would know);
* ``plug-in oracle on B``: :math:`\hat v` from half B itself, judged on B: optimistic (the
  in-sample bound of ``--ceiling``), shown for comparison.

    python benchmarks/allocation_holdout.py --case minilm --examples 64 --draws 32 \
        --out benchmarks/results/allocation-holdout-minilm.json

**An oracle of the exact rates** (``rate_oracle``): no design knows the rates, and the two oracles
above know them only from 16 draws, or judge themselves. The distribution of the rates over
tokens is deconvolved from all the draws (nonparametric maximum likelihood), and the gain of
Neyman's allocation at the exact rates, unfloored, is averaged over the tokens' posterior rates:
an upper bound on what any allocation of draws to tokens could gain.

``--from-record`` recomputes the judgements (and the simulation below) from such a record.
**Simulated rounds.** The judgements above are of one round at a fixed budget. senslab's
adaptive allocation runs a pilot round of a quarter draw per token, refits κ after each round,
sizes the next one by the refitted tangent's prediction for the target, and stops on its own
(conservative) standard error. The script runs that code (``_alloc.linear_rounds``)
on worlds whose tokens flip independently with rates taken from the record — the plug-in
rates, one draw of the deconvolved posterior rates (where a token that never flipped keeps a
small rate, as on a real model: on MiniLM this world's cost comes closest to the real runs'),
and Jeffreys' rates (no token safe) — and reports its cost
against equal draws at the same standard error, with its bias, spread and coverage, and what
one round costs at each budget (``round_price``): its true variance, and the variance its own
estimate reports, which is what the rounds stop on.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_models  # noqa: E402

from senslab.measure import _alloc  # noqa: E402
from senslab.measure._control import LinearControl  # noqa: E402
from senslab.measure.outputs import predictions  # noqa: E402

KAPPAS = (1.0, 1.5, 2.0, 3.0)


def tangent_x(case: Any) -> list[Tensor]:
    """Per example, :math:`m/(\\sigma\\lVert g_t\\rVert)` of its real tokens (senslab's tangent)."""
    with torch.inference_mode(), case.tokens.bind(case.model, case.inputs) as bound:
        ref = predictions(bound.clean_output, "logits")
        control = LinearControl(bound, ref, case.sigma, 32, "logits")
        return [control.x[b, bound.valid[b]].double() for b in range(case.n)]


def judge(e: Tensor, hits: Tensor, m: int, w2: Tensor, cost: Tensor) -> tuple[float, float]:
    """Unbiased :math:`V(e)` from ``hits`` of ``m`` held-out draws, and the cost :math:`C(e)`."""
    h = hits.double()
    p = h / m
    p2 = h * (h - 1) / (m * (m - 1))
    pq = h * (m - h) / (m * (m - 1))
    safe = e.clamp(min=1e-300)
    v = torch.where(e >= 1, pq / safe, p / safe - p2)
    return float((w2 * v).sum()), float((e * cost).sum())


def allocate(vhat: Tensor, s: Tensor, budget: float) -> Tensor:
    """:math:`e \\propto s\\sqrt{\\hat v}` with mean ``budget``, floored at
    ``_alloc.FLOOR`` × budget × s (s normalised to mean 1), as ``allocation="linear"``."""
    s = s / s.mean()
    a = vhat.clamp(min=0).sqrt() * s
    floor = _alloc.FLOOR * budget * s
    if a.sum() <= 0:
        return budget * s
    lo, hi = 0.0, 1.0
    while float(torch.maximum(hi * a, floor).mean()) < budget:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if float(torch.maximum(mid * a, floor).mean()) < budget:
            lo = mid
        else:
            hi = mid
    return torch.maximum(hi * a, floor)


def gains(flips: list[Tensor], x: list[Tensor], budget: float) -> dict[str, Any]:
    """Every design's gain over equal draws, judged on held-out halves (module docstring)."""
    n = len(flips)
    r = flips[0].shape[1]
    half = r // 2
    k = torch.cat([torch.full((f.shape[0],), float(f.shape[0])) for f in flips]).double()
    w2 = 1.0 / (n * k) ** 2
    cost = k  # a copy costs the example's real length
    s = 1.0 / (k * cost.sqrt())
    xs = torch.cat(x)
    out: dict[str, list[float]] = {}
    for first, second in ((slice(0, half), slice(half, 2 * half)),
                          (slice(half, 2 * half), slice(0, half))):
        a = torch.cat([f[:, first].double().sum(1) for f in flips])
        b = torch.cat([f[:, second].double().sum(1) for f in flips])
        equal = judge(torch.full_like(k, budget), b, half, w2, cost)
        base = equal[0] * equal[1]
        fitted = _alloc.fit_scale(xs, a, torch.full_like(a, float(half)))
        designs = {"length": torch.ones_like(k)}
        for name, kappa in [*((f"tangent κ={c:g}", c) for c in KAPPAS),
                            ("tangent κ fitted", fitted)]:
            q = torch.special.ndtr(-xs / kappa)
            designs[name] = q * (1 - q)
        pa, pb = a + 0.5, half - a + 0.5
        designs["token oracle from A"] = pa * pb / ((pa + pb) * (pa + pb + 1))
        designs["plug-in oracle on B"] = b * (half - b) / (half * (half - 1))
        best = (0.0, 1.0)
        for kappa in sorted({*_alloc.SCALE_GRID[::4].tolist(), *KAPPAS, fitted}):
            q = torch.special.ndtr(-xs / kappa)
            v, c = judge(allocate(q * (1 - q), s, budget), b, half, w2, cost)
            best = max(best, (base / (v * c), kappa))
        for name, vhat in designs.items():
            v, c = judge(allocate(vhat, s, budget), b, half, w2, cost)
            out.setdefault(name, []).append(base / (v * c))
        out.setdefault("tangent κ best", []).append(best[0])
        out.setdefault("κ fitted on A", []).append(fitted)
        out.setdefault("κ best on B", []).append(best[1])
    return {name: sum(v) / len(v) for name, v in out.items()}


#: the rate grid of :func:`rate_oracle`: 0 and 400 rates from 1e-5 to 1, evenly spaced in log
RATE_GRID = torch.cat([torch.zeros(1, dtype=torch.float64),
                       torch.logspace(-5, 0, 400, dtype=torch.float64)])


def rate_posterior(counts: list[Tensor], draws: int, iterations: int = 5000) -> Tensor:
    """Every token's posterior over :data:`RATE_GRID` given its flips in ``draws`` draws (N,
    grid), under the rates' distribution over tokens estimated by nonparametric maximum
    likelihood (EM on the mixing weights of binomial likelihoods)."""
    h = torch.cat([c.double() for c in counts])
    grid = RATE_GRID
    logp = torch.log(grid.clamp(min=1e-300))[None]
    log1p = torch.log1p(-grid.clamp(max=1 - 1e-15))[None]
    loglik = h[:, None] * logp + (draws - h[:, None]) * log1p
    loglik[:, 0] = torch.where(h == 0, 0.0, -math.inf)  # rate 0: only a token that never flipped
    loglik[:, -1] = torch.where(h == draws, 0.0, -math.inf)  # rate 1: only one that always did
    lik = (loglik - loglik.max(1, keepdim=True).values).exp()
    mix = torch.full((len(grid),), 1.0 / len(grid), dtype=torch.float64)
    for _ in range(iterations):
        post = lik * mix
        post /= post.sum(1, keepdim=True)
        new = post.mean(0)
        done = float((new - mix).abs().max()) < 1e-10
        mix = new
        if done:
            break
    post = lik * mix
    return post / post.sum(1, keepdim=True)


def rate_oracle(counts: list[Tensor], draws: int, replicates: int = 400, seed: int = 0,
                iterations: int = 5000) -> dict[str, float]:
    r"""What an allocation that knew every token's *exact* flip rate could gain, in variance ×
    cost against equal draws: :math:`\big(\sum w_b^2 p(1-p)\big)\big(\sum c_b\big) /
    \big(\sum w_b \sqrt{c_b\,p(1-p)}\big)^2` (Neyman's draws :math:`e \propto
    w_b\sqrt{p(1-p)/c_b}`, fractional and unfloored: an upper bound on any allocation of draws
    to tokens), with :math:`w_b = 1/(nK_b)` and :math:`c_b = K_b`.

    The rates are unknown, only their flips in ``draws`` draws: the rates' distribution over
    tokens is deconvolved (:func:`rate_posterior`), each token's rate is drawn from its
    posterior given its flips, and the gain is averaged over ``replicates`` such draws
    (``gain_lo`` / ``gain_hi``: their 2.5% and 97.5% quantiles). Unlike the plug-in
    (flips/draws), which takes a token that never flipped for one that never can, the
    deconvolution lets such a token keep the small rates its flips cannot exclude."""
    h = torch.cat([c.double() for c in counts])
    k = torch.cat([torch.full((len(c),), float(len(c)), dtype=torch.float64) for c in counts])
    w = 1.0 / (len(counts) * k)
    post = rate_posterior(counts, draws, iterations)
    grid = RATE_GRID

    def gain(p: Tensor) -> float:
        v = p * (1 - p)
        return float((w**2 * v).sum() * k.sum() / ((w * (k * v).sqrt()).sum()) ** 2)

    gen = torch.Generator().manual_seed(seed)
    g = torch.tensor([gain(grid[torch.multinomial(post, 1, generator=gen).squeeze(1)])
                      for _ in range(replicates)], dtype=torch.float64)
    lo, hi = g.quantile(torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return {"gain": float(g.mean()), "gain_lo": lo, "gain_hi": hi,
            "plug_in_gain": gain(h / draws),
            "tokens_never_flipped": float((h == 0).double().mean()),
            "mass_at_zero": float(post.mean(0)[0])}


#: the worlds :func:`simulate` can run on (:func:`world_tensors`)
WORLDS = ("plug-in", "posterior", "jeffreys")


def world_tensors(counts: list[Tensor], draws: int, x: list[Tensor], world: str = "plug-in",
                  seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Per-example flip counts of ``draws`` draws and tangents as right-padded (B, T) tensors:
    the real tokens, their flip rates and their tangent ``x`` (inf on padding). The rates, by
    ``world``: ``"plug-in"`` flips/draws (a token that never flipped never can);
    ``"posterior"`` one draw from each token's posterior given its flips
    (:func:`rate_posterior`, generator ``seed``): a token that never flipped keeps a small rate
    its flips cannot exclude, as almost every token of a real model does; ``"jeffreys"``
    (flips + ½)/(draws + 1), so no token is safe and none is rare."""
    if world not in WORLDS:
        raise ValueError(f"world must be one of {WORLDS}, got {world!r}")
    n, width = len(counts), max(len(c) for c in counts)
    valid = torch.zeros(n, width, dtype=torch.bool)
    p = torch.zeros(n, width, dtype=torch.float64)
    xs = torch.full((n, width), torch.inf, dtype=torch.float64)
    drawn = None
    if world == "posterior":
        gen = torch.Generator().manual_seed(seed)
        post = rate_posterior(counts, draws)
        drawn = RATE_GRID[torch.multinomial(post, 1, generator=gen).squeeze(1)]
    at = 0
    for b, (c, v) in enumerate(zip(counts, x, strict=True)):
        h = c.double()
        valid[b, :len(c)] = True
        if drawn is not None:
            p[b, :len(c)] = drawn[at:at + len(c)]
        else:
            p[b, :len(c)] = h / draws if world == "plug-in" else (h + 0.5) / (draws + 1)
        xs[b, :len(c)] = v
        at += len(c)
    return valid, p, xs


def round_price(counts: list[Tensor], draws: int, x: list[Tensor], kappa: float,
                budgets: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)) -> dict[str, dict[str, float]]:
    """What one round of ``allocation="linear"`` (``_alloc.expected_units`` at the tangent
    scaled by ``kappa``) costs against equal draws at 2 per token, on the world of the recorded
    rates: ``true`` from its exact variance, ``reported`` from the expected variance its own
    estimate reports (conservative by p² where a token is drawn once), both as gains in
    variance × cost. Rounds of a small budget draw most tokens with probability below one,
    which adds p²(1/π − 1) to the true variance and makes the report's excess larger."""
    n = len(counts)
    valid, p, xs = world_tensors(counts, draws, x)
    k = valid.sum(1).double()
    w2 = (1.0 / (n * k) ** 2)[:, None] * valid
    cost = k[:, None] * valid
    scale = 1.0 / (k * k.sqrt())

    def price(e: Tensor) -> tuple[float, float]:
        whole = e.floor()
        frac = e - whole
        inv_n = (1 - frac) / whole.clamp(min=1) + frac / (whole + 1)  # E[1/n], n ≥ 1
        safe = e.clamp(min=1e-300)
        true = torch.where(e >= 1, p * (1 - p) * inv_n, p / safe - p * p)
        c = float((e * cost).sum())
        return float((w2 * true).sum()) * c, _alloc.reported_variance(p, e, w2) * c

    equal = price(torch.full_like(p, 2.0) * valid)[0]
    q = torch.special.ndtr(-xs / kappa)
    out = {}
    for budget in budgets:
        true, reported = price(_alloc.expected_units(q, valid, budget, scale))
        out[str(budget)] = {"true": equal / true, "reported": equal / reported}
    return out


def simulate(counts: list[Tensor], draws: int, x: list[Tensor], budget: float, target: float,
             replicates: int, seed: int = 0, world: str = "plug-in") -> dict[str, float]:
    """senslab's own adaptive ``allocation="linear"`` (``_alloc.linear_rounds``, rounds of
    ``budget`` to a subset standard error of ``target``) run ``replicates`` times on a world
    whose tokens flip independently with the recorded rates (``world``: :func:`world_tensors`):
    its cost in token positions
    against equal draws' (the same standard error from every token drawn alike, fractional
    draws allowed), and its bias, spread and coverage against the world's exact rate."""
    n = len(counts)
    valid, p, xs = world_tensors(counts, draws, x, world, seed)
    k = valid.sum(1).double()
    truth = float(((p * valid).sum(1) / k).mean())
    equal = float(((p * (1 - p) * valid).sum(1) / k**2).sum()) / n**2 / target**2
    equal_cost = equal * float((k * k).sum())  # every token `equal` draws at its length
    gen = torch.Generator().manual_seed(seed)
    spent = [0.0, 0]  # token positions, rounds

    def evaluate(src: Tensor, tok: Tensor) -> Tensor:
        spent[0] += float(k[src].sum())
        spent[1] += 1
        return torch.bernoulli(p[src, tok], generator=gen)

    est, se, cost, rounds, units, kappas = [], [], [], [], [], []
    for _ in range(replicates):
        spent[:] = [0.0, 0]
        y, var, copies, kappa = _alloc.linear_rounds(xs, valid, budget, gen, evaluate,
                                                     target=target)
        est.append(float(((y * valid).sum(1) / k).mean()))
        se.append(float(((var * valid).sum(1) / k**2).sum()) ** 0.5 / n)
        cost.append(spent[0])
        rounds.append(spent[1])
        units.append(copies / float(k.sum()))
        kappas.append(kappa)
    e, s = torch.tensor(est), torch.tensor(se)
    return {"world": world, "truth": truth, "equal_draws_per_token": equal,
            "gain": equal_cost / (sum(cost) / len(cost)),
            "mean_rounds": sum(rounds) / len(rounds), "max_rounds": max(rounds),
            "copies_per_token": sum(units) / len(units), "mean_kappa": sum(kappas) / len(kappas),
            # the same cost at the spread the estimates really had (a run that stops short of
            # the target, or past it, counts at its own precision)
            "gain_at_spread": equal_cost * target**2 / (sum(cost) / len(cost))
            / float(e.var()),
            "mean_se_over_target": float(s.mean()) / target,
            "bias_over_se": float((e.mean() - truth) / s.mean()),
            "sd_over_se": float(e.std() / s.mean()),
            "coverage95": float(((e - truth).abs() <= 1.96 * s).double().mean())}


def from_record(path: Path) -> tuple[dict[str, Any], list[Tensor], dict[str, Any]]:
    """The flips (each half's flips first in its draws: only their counts are kept) and the
    tangent of a record this script wrote."""
    old = json.loads(path.read_text())
    half = old["draws"] // 2
    flips = []
    for a, b in old["flip_counts_halves"]:
        cols = torch.arange(half)
        first = cols[None, :] < torch.tensor(a)[:, None]
        second = cols[None, :] < torch.tensor(b)[:, None]
        flips.append(torch.cat([first, second], dim=1))
    x = [torch.tensor([math.inf if v is None else v for v in xs], dtype=torch.float64)
         for xs in old["tangent_x"]]
    return {"flips": flips, "estimate": old["estimate"]}, x, old


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", default="minilm", choices=("minilm", "gpt2"))
    p.add_argument("--examples", type=int, default=64)
    p.add_argument("--draws", type=int, default=32, help="draws per token (split in halves)")
    p.add_argument("--budgets", type=float, nargs="+", default=[0.25, 1.0, 2.0])
    p.add_argument("--replicates", type=int, default=200,
                   help="simulated runs of the adaptive allocation per world")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--from-record", type=Path,
                   help="recompute the judgements from a record's flips and tangent (no draws)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.draws < 4 or args.draws % 2:
        raise SystemExit(f"--draws must be even and at least 4, got {args.draws}")
    torch.set_num_threads(args.threads)
    if args.from_record:
        row, x, old = from_record(args.from_record)
        args.case, args.draws, n, seconds = old["case"], old["draws"], old["examples"], \
            old["seconds"]
        sigma = old["sigma"]
    else:
        case = real_models.make_case(args.case, args.examples)
        start = time.perf_counter()
        row = real_models.naive_loop(case, repeats=args.draws)
        x = tangent_x(case)
        seconds = time.perf_counter() - start
        n, sigma = case.n, case.sigma
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "threads": args.threads, "case": args.case,
              "examples": n, "draws": args.draws, "sigma": sigma,
              "estimate": row["estimate"], "seconds": seconds,
              "gains": {str(b): gains(row["flips"], x, b) for b in args.budgets},
              # flips per token in each half of the draws, per example: for other analyses
              "flip_counts_halves": [[f[:, :args.draws // 2].sum(1).tolist(),
                                      f[:, args.draws // 2:].sum(1).tolist()]
                                     for f in row["flips"]],
              "tangent_x": [v.tolist() for v in x]}
    counts = [f.sum(1) for f in row["flips"]]
    result["rate_oracle"] = rate_oracle(counts, args.draws)
    ro = result["rate_oracle"]
    print(f"  an oracle of every token's exact rate (deconvolved from all {args.draws} draws): "
          f"{ro['gain']:.2f}× ({ro['gain_lo']:.2f}–{ro['gain_hi']:.2f}); the plug-in rates "
          f"{ro['plug_in_gain']:.2f}× ({ro['tokens_never_flipped']:.1%} of the tokens never "
          "flipped)")
    target = real_models.target_for(n)
    result["simulated"] = [simulate(counts, args.draws, x, real_models.ALLOCATION_BUDGET,
                                    target, args.replicates, world=w)
                           for w in WORLDS]
    print(f"{args.case}: {n} examples, {args.draws} draws per token, estimate "
          f"{row['estimate']:.4f}, {seconds:.0f} s")
    for b, g in result["gains"].items():
        print(f"  budget {b} draws per token: " + ", ".join(
            f"{k} {v:.2f}" for k, v in g.items()))
    kappas = {"1": 1.0, "simulated κ̂": result["simulated"][0]["mean_kappa"]}
    result["round_price"] = {name: round_price(counts, args.draws, x, kappa)
                             for name, kappa in kappas.items()}
    for name, prices in result["round_price"].items():
        print(f"  one round at κ = {name}, gain in variance × cost against 2 draws each "
              "(true / as reported): " + ", ".join(
                  f"budget {b} {v['true']:.2f} / {v['reported']:.2f}" for b, v in prices.items()))
    for sim in result["simulated"]:
        print(f"  adaptive allocation simulated ({sim['world']} world): " + ", ".join(
            f"{k} {v:.3f}" for k, v in sim.items() if k != "world"))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1).replace("Infinity", "null") + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
