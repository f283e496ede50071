"""Coverage of senslab's token-wise 95% intervals on toys whose flip rates are exact.

Run (one thread, about 4 minutes in all):

    OMP_NUM_THREADS=1 python benchmarks/allocation_coverage.py \
        --before OLD_ALLOC_PY --out benchmarks/results/allocation-coverage-target.json

``--before`` names a copy of an older ``senslab/measure/_alloc.py`` (e.g. ``git show
a7d1801:src/senslab/measure/_alloc.py``) to run beside the working tree's; without it only the
working tree's runs.

Toy: one logit z(x) = Σ_t w_t·x_t + c + a Σ_t (u_t·x_t)² over tokens of D = 2 features with
u_t ⟂ w_t. Noise N(0, σ²I) on token t moves it by σ|w_t| N1 + a(2 s_t σ|u_t| N2 + σ²|u_t|² N2²),
s_t = u_t·x_t, N1 and N2 independent standard normals, so each token's flip probability is a
1-D Gauss–Hermite integral over N2 of Φ(·) (checked against 200,000 draws). a = 0: a linear
model, whose tangent is exact (q = p).

``allocation="linear"`` is simulated by calling ``_alloc.linear_rounds`` itself (the code the
metric runs) with copies that flip with the exact p, and the tangent's x given: exact
(x = Φ⁻¹(1 − p)), or three times too steep (x/3: the tangent overstates the flips, κ = 1/3).
It runs the working tree's ``_alloc`` and, with ``--before``, an older copy in the same
run. One setting also runs through TokenSensitivity itself,
as a check that the direct simulation is what the metric does.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import math
import time
import warnings

import numpy as np
import torch

from senslab.measure import _alloc, token_sensitivity
from senslab.tokens import Sequence

torch.set_num_threads(1)
warnings.simplefilter("ignore")
SIGMA = 1.0
ROWS: list[dict] = []


def load_orig(path: str):
    loader = importlib.machinery.SourceFileLoader("senslab.measure._alloc_orig", path)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def case(seed: int, b: int, t: int, bias: float, small: float, big_tokens: int, a: float = 0.0,
         big: float = 1.0):
    """The toy model, its inputs (B, T, 2), the exact mean flip rate and every token's (B, T)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.full((t,), small, dtype=torch.float64)
    scale[:big_tokens] = big
    ang = torch.rand(t, generator=g, dtype=torch.float64) * 2 * math.pi
    w = torch.stack([ang.cos(), ang.sin()], 1) * scale[:, None]  # (T, 2)
    uu = torch.stack([-ang.sin(), ang.cos()], 1) * 0.5  # ⟂ w, |u| = 0.5
    x = torch.randn(b, t, 2, generator=g, dtype=torch.float64)

    def model(inp: torch.Tensor) -> torch.Tensor:
        inp = inp.double()
        return (inp * w).sum((1, 2)) + bias + a * ((inp * uu).sum(2) ** 2).sum(1)

    z = model(x)
    nodes, wts = np.polynomial.hermite_e.hermegauss(80)  # ∫ f(n) φ(n) dn
    n2 = torch.tensor(nodes)[None, None, :]
    wq = torch.tensor(wts / wts.sum())
    s = (x * uu).sum(2)[..., None]
    un = uu.norm(dim=1)[None, :, None]
    wn = w.norm(dim=1)[None, :, None]
    shift = a * (2 * s * SIGMA * un * n2 + (SIGMA * un * n2) ** 2)
    sgn = z.sign()[:, None, None]
    p = (torch.special.ndtr(-(z.abs()[:, None, None] + sgn * shift) / (SIGMA * wn)) * wq).sum(2)
    return model, x, p.mean().item(), p


def report(name, est, se, truth, cost, secs):
    e, s = np.asarray(est), np.asarray(se)
    cover = np.mean(np.abs(e - truth) <= 1.96 * s)
    print(f"{name:46s} cover {cover:.3f}  bias/se {(e.mean() - truth) / s.mean():+.2f}  "
          f"sd/se {e.std() / s.mean():.2f}  copies {np.mean(cost):6.0f}  ({secs:.0f}s)",
          flush=True)
    ROWS.append({"case": name, "coverage": float(cover), "reps": len(e),
                 "bias_over_se": float((e.mean() - truth) / s.mean()),
                 "sd_over_se": float(e.std() / s.mean()), "copies": float(np.mean(cost)),
                 "seconds": round(secs, 1)})
    return cover


def linear_direct(mod, p, steep, budget, target, reps):
    """``allocation="linear"`` by ``mod.linear_rounds`` on exact rates p (B, T): (est, se,
    copies) per replicate, as TokenSensitivity(estimand="subset") reports them."""
    b, t = p.shape
    valid = torch.ones(b, t, dtype=torch.bool)
    x = -torch.special.ndtri(p).float() / steep
    cap = 64 * budget * b * t
    out = []
    for seed in range(reps):
        gen = torch.Generator().manual_seed(seed)
        flips = torch.Generator().manual_seed(100_000 + seed)
        events = [0]

        def evaluate(src, tok, flips=flips, events=events):
            v = (torch.rand(len(src), generator=flips, dtype=torch.float64)
                 < p[src, tok]).float()
            events[0] += int(v.sum())
            return v

        y, var, copies, _ = mod.linear_rounds(x, valid, budget, gen, evaluate, target=target,
                                              max_copies=cap, rounds_at_zero=2)
        within = float((var.sum(1) / t**2).sum())
        if target is not None and events[0] == 0:  # TokenSensitivity's rule-of-three floor
            counts = torch.full((b, t), copies / (b * t), dtype=torch.float64)
            within = max(within, mod.zero_floor(counts, valid))
        out.append((float(y.mean()), math.sqrt(within) / b, copies))
    return np.array(out)


def api(model, x, truth, reps, name, **opt):
    t0 = time.time()
    est, se, fw = [], [], []
    for seed in range(reps):
        r = token_sensitivity(model, x, Sequence(), sigma=SIGMA, generator=seed,
                              estimand="subset", **opt)
        est.append(r.estimate)
        se.append(r.stderr)
        fw.append(r.num_forward - 2 * x.shape[0])
    return report(name, est, se, truth, fw, time.time() - t0)


LOW = dict(seed=0, b=8, t=10, bias=2.0, small=0.05, big_tokens=2)  # mean rate 0.016
MID = dict(seed=3, b=16, t=8, bias=0.3, small=0.05, big_tokens=3)  # more examples, rate ≈ 0.06

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", help="an older _alloc.py to run beside the working tree's")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args()
    reps = args.reps
    versions = [("after", _alloc)] if args.before is None else [
        ("before", load_orig(args.before)), ("after", _alloc)]
    for label, cfg, budget, target in [("low-rate", LOW, 0.25, 0.005),
                                       ("16 examples", MID, 0.25, 0.006)]:
        _, _, truth, p = case(**cfg)
        for steep in (1.0, 3.0):
            for tag, mod in versions:
                t0 = time.time()
                r = linear_direct(mod, p, steep, budget, target, reps)
                report(f"{label} target {target} tangent ×{steep:g} {tag}", r[:, 0], r[:, 1],
                       truth, r[:, 2], time.time() - t0)
    # the same through the metric itself (the working tree): matches the direct simulation
    model, x, truth, _ = case(**LOW)
    api(model, x, truth, 150, "low-rate target 0.005 via TokenSensitivity",
        allocation="linear", budget=0.25, target_stderr=0.005)
    # the other two options of the brief, through the metric (not changed here)
    api(model, x, truth, 150, "low-rate uniform budget 0.25 target 0.005",
        allocation="uniform", budget=0.25, target_stderr=0.005)
    model, x, truth, _ = case(seed=1, b=16, t=64, bias=1.0, small=0.05, big_tokens=3)
    api(model, x, truth, 150, "1024 tokens uniform budget 0.25 target 0.003",
        allocation="uniform", budget=0.25, target_stderr=0.003)
    for a, bias in [(-0.5, 1.5), (0.3, 1.5)]:
        model, x, truth, _ = case(**dict(LOW, a=a, bias=bias))
        api(model, x, truth, 150, f"bent toy a={a} control_variate repeats=1",
            control_variate="linear", repeats=1)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "rows": ROWS}, f, indent=2)
