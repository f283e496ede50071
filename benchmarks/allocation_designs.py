r"""Sequential allocation designs simulated on recorded flips (issue 18, item 4: "draws may go
where flips happen, as long as the estimator stays unbiased and its standard error calibrated").

``real_models.py --ceiling`` records, per token, how often it flipped in R draws, and
``allocation_ceiling`` bounds what an *oracle* allocation could gain. This script asks what a
design without an oracle gains: one that learns where flips happen from its own earlier
rounds. Each token's flip probability is taken as known (the recorded rate; or, as a second
truth, never-flipped tokens at :data:`FLOOR_P`), and each design is run
:data:`REPLICATES` times with Bernoulli draws from it, rounds until the reported standard error
reaches the record's target (at least two rounds).

**Designs** (``budget``: mean draws per token and round):

* ``equal``: every token the same expected draws in every round;
* ``token``: from round 2, draws ∝ √(q(1−q)) with q each token's flips so far, shrunk towards
  its example's rate, never below a fifth of the budget;
* ``example``: the same with q the example's rate so far (all its tokens alike);
* ``uniform``: senslab's own ``allocation="uniform"`` (:class:`senslab.measure._alloc.Sampled`,
  the code itself, on Bernoulli flips): a pilot of ``budget`` of every example's tokens at one
  draw each (a quarter two), then rounds to the share the pilot's variance predicts, until its
  reported standard error reaches the target (one round may do); its estimator is its own
  (below), not the one that follows.

**Estimator.** A token's expected draws e < 2 become a pair of draws with probability e/2, else
⌊e⌋ or ⌊e⌋+1 draws: every drawn token has two draws or more, so each round's
Horvitz–Thompson estimate :math:`Y = \mathbf 1[\text{drawn}]\,\bar v/\pi` has the unbiased
variance estimate :math:`(\bar v^2/\pi - U)/\pi` (U: the unbiased estimate of p² from the
token's draws). Rounds are conditionally unbiased given the past (allocations depend only on
earlier rounds), so the estimate is the mean of the rounds and its variance the sum of theirs
over the number of rounds squared.

    python benchmarks/allocation_designs.py benchmarks/results/ceiling-minilm-16.json \
        --out benchmarks/results/allocation-designs-minilm.json
    python benchmarks/allocation_designs.py benchmarks/results/ceiling-images-64-8.json \
        --designs uniform --out benchmarks/results/allocation-designs-images-64-uniform.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from senslab.measure import _alloc

REPLICATES = 200
SEED = 0
FLOOR = _alloc.FLOOR  #: smallest expected draws of a token, as a share of the round's budget
SHRINK = 2.0  #: pseudo-draws of the example's rate in a token's q (design ``token``)
FLOOR_P = 0.01  #: the second truth's flip probability of tokens that never flipped
MAX_ROUNDS = 200
DESIGNS = (("equal", 0.5), ("equal", 1.0), ("token", 0.25), ("token", 0.5),
           ("example", 0.25), ("example", 0.5), ("uniform", 1 / 16))


def spread(q: np.ndarray, budget: float) -> np.ndarray:
    """Expected draws per token: mean ``budget``, ∝ √(q(1−q)) above the floor — senslab's own
    rule (:func:`senslab.measure._alloc.expected_units`)."""
    qt = torch.from_numpy(np.asarray(q, dtype=np.float64)).unsqueeze(0)
    return _alloc.expected_units(qt, torch.ones_like(qt, dtype=torch.bool), budget)[0].numpy()


def run_design(p: np.ndarray, example: np.ndarray, target: float, design: str, budget: float,
               rng: np.random.Generator) -> tuple[float, float, float]:
    """One replicate: (estimate, reported standard error, draws per token)."""
    n_ex = int(example.max()) + 1
    k = np.bincount(example, minlength=n_ex).astype(float)
    w = 1.0 / (n_ex * k[example])  # each token's weight in the estimate
    hits, draws = np.zeros(len(p)), np.zeros(len(p))
    ys: list[float] = []
    vs: list[float] = []
    spent = 0
    for r in range(MAX_ROUNDS):
        if r == 0 or design == "equal":
            e = np.full(len(p), budget)
        else:
            h_ex = np.bincount(example, weights=hits, minlength=n_ex)
            d_ex = np.bincount(example, weights=draws, minlength=n_ex)
            rate = (h_ex + 0.5) / (d_ex + 1.0)  # an example's rate so far
            if design == "token":
                q = (hits + SHRINK * rate[example]) / (draws + SHRINK)
            else:
                q = rate[example]
            e = spread(q, budget)
        small = e < 2
        pi = np.where(small, e / 2, 1.0)
        whole = np.floor(e)
        n = np.where(small, 2 * (rng.random(len(p)) < pi),
                     whole + (rng.random(len(p)) < e - whole)).astype(int)
        f = rng.binomial(n, p)
        drawn = n > 0
        vbar = np.where(drawn, f / np.maximum(n, 1), 0.0)
        u = np.where(n >= 2, f * (f - 1) / np.maximum(n * (n - 1), 1), 0.0)
        y = np.where(drawn, vbar / pi, 0.0)
        v = np.where(drawn, (vbar**2 / pi - u) / pi, 0.0)
        ys.append(float((w * y).sum()))
        vs.append(float((w * w * v).sum()))
        hits += f
        draws += n
        spent += int(n.sum())
        se = math.sqrt(max(sum(vs), 0.0)) / len(ys)
        if len(ys) >= 2 and se <= target:
            break
    return float(np.mean(ys)), se, spent / len(p)


def run_uniform(p: np.ndarray, example: np.ndarray, target: float, budget: float,
                rng: np.random.Generator) -> tuple[float, float, float]:
    """One replicate of ``allocation="uniform"`` as ``TokenSensitivity`` runs it (the same
    class, the same stopping rule): (estimate, reported standard error, draws per token)."""
    n_ex = int(example.max()) + 1
    k = np.bincount(example, minlength=n_ex)
    pos = np.arange(len(p)) - np.repeat(np.cumsum(k) - k, k)
    valid = torch.zeros(n_ex, int(k.max()), dtype=torch.bool)
    valid[example, pos] = True
    rate = torch.zeros(valid.shape, dtype=torch.float64)
    rate[example, pos] = torch.from_numpy(p)
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    plan = _alloc.Sampled(valid, gen, budget)

    def flips(src: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        return (torch.rand(len(src), generator=gen, dtype=torch.float64)
                < rate[src, tok]).double()

    plan.run(flips, target, MAX_ROUNDS * len(p))
    y, _ = plan.values()
    se = plan.stderr()
    est = float(((y * valid).sum(1) / valid.sum(1)).mean())
    return est, se, plan.copies / len(p)


def simulate(flip_counts: list[list[int]], draws: int, target: float,
             replicates: int = REPLICATES, designs: tuple = DESIGNS) -> list[dict[str, Any]]:
    """Every design under both truths (the recorded rates; never-flipped at :data:`FLOOR_P`)."""
    hits = np.concatenate([np.asarray(c, float) for c in flip_counts])
    example = np.repeat(np.arange(len(flip_counts)), [len(c) for c in flip_counts])
    k = np.bincount(example).astype(float)
    w = 1.0 / (len(flip_counts) * k[example])
    rows = []
    for truth in ("recorded", "never-flipped at 0.01"):
        p = hits / draws if truth == "recorded" else np.where(hits > 0, hits / draws, FLOOR_P)
        true_mean = float((w * p).sum())
        # equal draws with every token drawn, n per token: variance Σw²p(1−p)/n
        stratified = float((w * w * p * (1 - p)).sum()) / target**2
        for design, budget in designs:
            rng = np.random.default_rng(SEED)
            out = np.array([run_uniform(p, example, target, budget, rng) if design == "uniform"
                            else run_design(p, example, target, design, budget, rng)
                            for _ in range(replicates)])
            est, se, spent = out[:, 0], out[:, 1], out[:, 2]
            rows.append({
                "truth": truth, "design": design, "budget": budget, "replicates": replicates,
                "draws_per_token": float(spent.mean()),
                "stratified_draws_per_token": max(stratified, 1.0),
                "bias": float(est.mean() - true_mean),
                "bias_se": float(est.std(ddof=1) / math.sqrt(replicates)),
                "true_sd": float(est.std(ddof=1)), "mean_reported_se": float(se.mean()),
            })
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| truth | design | budget/round | draws per token | equal draws need | bias (± s.e.) "
             "| sd of the estimates | mean reported s.e. |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['truth']} | {r['design']} | {r['budget']:g} | "
                     f"{r['draws_per_token']:.2f} | {r['stratified_draws_per_token']:.2f} | "
                     f"{r['bias']:+.1e} (± {r['bias_se']:.0e}) | {r['true_sd']:.5f} | "
                     f"{r['mean_reported_se']:.5f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path, help="a real_models.py --ceiling record")
    parser.add_argument("--replicates", type=int, default=REPLICATES)
    parser.add_argument("--designs", nargs="+", default=None, metavar="DESIGN",
                        choices=sorted({d for d, _ in DESIGNS}),
                        help="only these designs (default: all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.replicates < 2:
        raise SystemExit(f"--replicates needs at least 2, got {args.replicates}")
    record = json.loads(args.record.read_text())
    cases = [c for c in record.get("cases", []) if "flip_counts" in c]
    if not cases:
        raise SystemExit(f"{args.record} holds no flip counts: pass a record written with "
                         "real_models.py --ceiling")
    result: dict[str, Any] = {
        "record": str(args.record), "date": datetime.datetime.now(datetime.timezone.utc)
        .isoformat(timespec="seconds"), "seed": SEED, "cases": []}
    for c in cases:
        a = c["allocation_ceiling"]
        designs = tuple(d for d in DESIGNS if args.designs is None or d[0] in args.designs)
        rows = simulate(c["flip_counts"], int(a["draws"]), a["target_se"], args.replicates,
                        designs)
        result["cases"].append({"case": c["case"], "target_se": a["target_se"], "rows": rows})
        print(f"**{c['case']}** (s.e. target {a['target_se']:g})\n\n{markdown(rows)}\n",
              flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
