r"""One allocation design run with many seeds on a real case: is it unbiased there, is its
standard error the spread it has, and how much does its time vary?

``real_models.py`` times each method once (seed 0). An adaptive design's time and estimate vary
from seed to seed, and a design whose estimate leans one way shows it only over seeds. This
script runs ``token_sensitivity`` with the options of one ``real_models`` row (by default
``"senslab adaptive allocation"``) for seeds 1..N on the same case, and reports the mean estimate
and its standard error over seeds, the spread of the estimates against the mean reported
standard error, and the seconds and forwards per run.

For ``allocation="linear"`` rows it also splits each run's reported variance: a token measured
by one unit in a round (or drawn with probability below one) reports its value squared, whose
mean is :math:`p` where its variance is :math:`p(1 - p)`, so the reported variance exceeds the
estimate's by the sum of those tokens' weighted :math:`p^2` (:func:`single_excess`). That
excess is estimated in the run from the product of a token's values in the first two rounds;
``single_excess_share`` is its share of the reported variance — how much sooner a design with
an unbiased variance could have stopped, by this cause.

    python benchmarks/allocation_seeds.py --case minilm --seeds 10 \
        --out benchmarks/results/allocation-seeds-minilm.json
    python benchmarks/allocation_seeds.py --case minilm --seeds 30 --first-seed 11 \
        --merge benchmarks/results/allocation-seeds-minilm.json \
        --out benchmarks/results/allocation-seeds-minilm-40.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_models  # noqa: E402

from senslab.measure import TokenSensitivity, _alloc  # noqa: E402


def row_options(case: Any, label: str) -> dict[str, Any]:
    """The options of the ``real_models`` row ``label`` on ``case``."""
    target = real_models.target_for(case.n)
    for name, options, _ in real_models.senslab_methods(case, target):
        if name == label:
            return dict(options)
    raise SystemExit(f"no row {label!r} in real_models.senslab_methods")


@contextmanager
def recorded_rounds() -> Iterator[list[dict[str, Any]]]:
    """While open, every batch that ``allocation="linear"`` measures appends
    ``{"valid": (B, T), "rounds": [(y, var, e), ...]}``: its real tokens, and each round's token
    values, their variance estimates and expected units (what
    :func:`senslab.measure._alloc.token_values` returns and is given)."""
    batches: list[dict[str, Any]] = []
    rounds_fn, values_fn = _alloc.linear_rounds, _alloc.token_values

    def linear_rounds(x: Any, valid: Any, *args: Any, **kwargs: Any) -> Any:
        batches.append({"valid": valid.detach().cpu(), "rounds": []})
        return rounds_fn(x, valid, *args, **kwargs)

    def token_values(u: Any, usrc: Any, utok: Any, n: Any, e: Any) -> Any:
        y, var = values_fn(u, usrc, utok, n, e)
        batches[-1]["rounds"].append(tuple(t.detach().double().cpu() for t in (y, var, e)))
        return y, var

    _alloc.linear_rounds, _alloc.token_values = linear_rounds, token_values
    try:
        yield batches
    finally:
        _alloc.linear_rounds, _alloc.token_values = rounds_fn, values_fn


def single_excess(valid: torch.Tensor, rounds: list[tuple[torch.Tensor, ...]]
                  ) -> tuple[float, float | None]:
    r"""One batch's reported variance of its mean (the rounds combined by their sizes, as
    ``_alloc.linear_rounds`` does) and the part of it that is the single-unit tokens'
    :math:`p^2` (None with one round). Round :math:`r` of size
    :math:`b_r` reports, for a token with expected units :math:`e`, :math:`p^2` too much with
    weight :math:`c = 1` below one unit and :math:`c = 1 - (e - \lfloor e\rfloor)` (the
    chance of one unit) below two (``_alloc.reported_variance``); :math:`p^2` itself is
    :math:`y_1 y_2`, the product of the first two rounds' values, unbiased where the pilot never
    ends the run (the second round's values are unbiased given the first's). Products with later
    rounds would not be: whether a third round runs depends on the values before it. The
    weights :math:`c` of the later rounds depend on the first only through the batch's fitted
    scale and variance so far, which leaves a small bias on a large batch. Single copies only
    (antithetic pairs report :math:`\mu_2` differently)."""
    b = valid.shape[0]
    k = valid.sum(1).double().clamp(min=1)
    w2 = (1.0 / (b * k) ** 2)[:, None] * valid
    sizes = [float(e[valid].mean()) for _, _, e in rounds]
    spent = sum(sizes)
    reported = sum((size / spent) ** 2 * float((w2 * var).sum())
                   for size, (_, var, _) in zip(sizes, rounds, strict=True))
    if len(rounds) < 2:
        return reported, None
    p2 = rounds[0][0] * rounds[1][0]
    excess = 0.0
    for size, (_, _, e) in zip(sizes, rounds, strict=True):
        frac = e - e.floor()
        c = torch.where(e < 1, torch.ones_like(e),
                        torch.where(e < 2, 1 - frac, torch.zeros_like(e)))
        excess += (size / spent) ** 2 * float((w2 * c * p2).sum())
    return reported, excess


def run_seeds(case: Any, options: dict[str, Any], seeds: int, log: Any = print,
              first: int = 1) -> dict[str, Any]:
    runs = []
    split = options.get("allocation") == "linear" and not options.get("antithetic")
    for seed in range(first, first + seeds):
        with recorded_rounds() if split else nullcontext([]) as batches:
            start = time.perf_counter()
            metric = TokenSensitivity(case.model, case.tokens, sigma=case.sigma,
                                      estimand="subset", generator=seed, **options)
            metric.update(case.inputs)
            res = metric.compute()
            seconds = time.perf_counter() - start
        run = {"seed": seed, "estimate": res.estimate, "se": res.stderr_subset,
               "forwards": res.num_forward, "seconds": seconds,
               "tangent_scale": metric.last_tangent_scale}
        if split and batches:
            run.update(split_variance(batches))
        runs.append(run)
        share = run.get("single_excess_share")
        log(f"  seed {seed}: {res.estimate:.4f} ± {res.stderr_subset:.4f}, "
            f"{res.num_forward} forwards, {seconds:.1f} s"
            + (f", rounds {run['round_sizes']}, single-unit p² {share:.1%} of the reported "
               "variance" if share is not None else ""))
    return {"runs": runs, "summary": summarise(runs)}


def split_variance(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's rounds (each batch's sizes, in units per token) and :func:`single_excess` over
    its batches, each batch's share weighted by its examples (the estimate is the mean over all
    examples): the reported variance of the estimate and the excess's share of it (None where a
    batch had one round)."""
    n = sum(b["valid"].shape[0] for b in batches)
    reported, excess = 0.0, 0.0
    for b in batches:
        rep, exc = single_excess(b["valid"], b["rounds"])
        f = (b["valid"].shape[0] / n) ** 2
        reported += f * rep
        excess = None if excess is None or exc is None else excess + f * exc
    sizes = [[round(float(e[b["valid"]].mean()), 4) for _, _, e in b["rounds"]]
             for b in batches]
    return {"round_sizes": sizes[0] if len(sizes) == 1 else sizes,
            "reported_variance": reported,
            "single_excess_share": None if excess is None or reported <= 0
            else excess / reported}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Bias and calibration over the runs: the mean estimate and its standard error, the
    spread of the estimates against the mean reported standard error (``sd_over_reported``,
    with an approximate 95% interval from the spread's own standard error, 1/√(2(n − 1)) of
    it), and the seconds and forwards."""
    seeds = len(runs)
    est = [r["estimate"] for r in runs]
    summary = {"mean_estimate": statistics.mean(est),
               "se_of_mean": statistics.stdev(est) / math.sqrt(len(est)) if seeds > 1 else None,
               "sd_estimates": statistics.stdev(est) if seeds > 1 else None,
               "mean_reported_se": statistics.mean(r["se"] for r in runs),
               "median_seconds": statistics.median(r["seconds"] for r in runs),
               "min_seconds": min(r["seconds"] for r in runs),
               "max_seconds": max(r["seconds"] for r in runs),
               "mean_forwards": statistics.mean(r["forwards"] for r in runs)}
    shares = [r["single_excess_share"] for r in runs if r.get("single_excess_share") is not None]
    if shares:
        # the spread over reported s.e. that the single-unit excess alone would explain
        mean_share = statistics.mean(shares)
        summary["mean_single_excess_share"] = mean_share
        summary["sd_over_reported_if_only_excess"] = math.sqrt(max(0.0, 1 - mean_share))
    if seeds > 1:
        ratio = summary["sd_estimates"] / summary["mean_reported_se"]
        half = 1.96 * ratio / math.sqrt(2 * (seeds - 1))
        summary["sd_over_reported"] = ratio
        summary["sd_over_reported_ci95"] = [ratio - half, ratio + half]
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", default="minilm", choices=real_models.CASES)
    p.add_argument("--row", default="senslab adaptive allocation")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=1,
                   help="seeds first..first+N−1 (to extend an earlier record)")
    p.add_argument("--merge", type=Path, help="an earlier record of the same row and case "
                   "whose runs join these in the summary")
    p.add_argument("--examples", type=int, default=real_models.EXAMPLES)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    case = real_models.make_case(args.case, args.examples)
    options = row_options(case, args.row)
    print(f"{args.case} {args.row}: {options}, {args.seeds} seeds, {args.threads} threads")
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "threads": args.threads, "case": args.case,
              "examples": case.n, "row": args.row,
              "options": {k: str(v) for k, v in options.items()},
              **run_seeds(case, options, args.seeds, first=args.first_seed)}
    if args.merge:
        old = json.loads(args.merge.read_text())
        if (old["case"], old["row"], old["examples"]) != (args.case, args.row, case.n):
            raise SystemExit(f"{args.merge} is a record of another case, row or size")
        seen = {r["seed"] for r in result["runs"]}
        if seen & {r["seed"] for r in old["runs"]}:
            raise SystemExit(f"{args.merge} has some of these seeds already: pick --first-seed "
                             "beyond them")
        result["runs"] = old["runs"] + result["runs"]
        result["merged_from"] = {"file": args.merge.name, "date": old["date"]}
        result["summary"] = summarise(result["runs"])
    s = result["summary"]
    print(f"mean {s['mean_estimate']:.4f} ± {s['se_of_mean'] or 0:.4f} over seeds; spread "
          f"{s['sd_estimates'] or 0:.4f} against a mean reported s.e. of "
          f"{s['mean_reported_se']:.4f} (ratio {s.get('sd_over_reported', 0):.2f}, "
          f"95% {s.get('sd_over_reported_ci95', [0, 0])[0]:.2f}–"
          f"{s.get('sd_over_reported_ci95', [0, 0])[1]:.2f}); {s['median_seconds']:.1f} s median "
          f"({s['min_seconds']:.1f}–{s['max_seconds']:.1f})")
    if "mean_single_excess_share" in s:
        print(f"single-unit tokens' p²: {s['mean_single_excess_share']:.1%} of the reported "
              f"variance on average (alone, a spread of "
              f"{s['sd_over_reported_if_only_excess']:.2f}× the reported s.e.)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
