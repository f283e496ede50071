r"""One allocation design run with many seeds on a real case: is it unbiased there, is its
standard error the spread it has, and how much does its time vary?

``real_models.py`` times each method once (seed 0). An adaptive design's time and estimate vary
from seed to seed, and a design whose estimate leans one way shows it only over seeds. This
script runs ``token_sensitivity`` with the options of one ``real_models`` row (by default
``"senslab adaptive allocation"``) for seeds 1..N on the same case, and reports the mean estimate
and its standard error over seeds, the spread of the estimates against the mean reported
standard error, and the seconds and forwards per run.

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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_models  # noqa: E402

from senslab.measure import TokenSensitivity  # noqa: E402


def row_options(case: Any, label: str) -> dict[str, Any]:
    """The options of the ``real_models`` row ``label`` on ``case``."""
    target = real_models.target_for(case.n)
    for name, options, _ in real_models.senslab_methods(case, target):
        if name == label:
            return dict(options)
    raise SystemExit(f"no row {label!r} in real_models.senslab_methods")


def run_seeds(case: Any, options: dict[str, Any], seeds: int, log: Any = print,
              first: int = 1) -> dict[str, Any]:
    runs = []
    for seed in range(first, first + seeds):
        start = time.perf_counter()
        metric = TokenSensitivity(case.model, case.tokens, sigma=case.sigma, estimand="subset",
                                  generator=seed, **options)
        metric.update(case.inputs)
        res = metric.compute()
        runs.append({"seed": seed, "estimate": res.estimate, "se": res.stderr_subset,
                     "forwards": res.num_forward, "seconds": time.perf_counter() - start,
                     "tangent_scale": metric.last_tangent_scale})
        log(f"  seed {seed}: {res.estimate:.4f} ± {res.stderr_subset:.4f}, "
            f"{res.num_forward} forwards, {runs[-1]['seconds']:.1f} s")
    return {"runs": runs, "summary": summarise(runs)}


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
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
