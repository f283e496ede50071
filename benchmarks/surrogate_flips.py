r"""A cheaper copy of the model as a control variate: how well do its flips track float32's?

The checked precisions (``precision="bf16-checked"``/``"int8-checked"``) keep float32's
decisions by re-evaluating every copy whose margin a cheap copy of the model could have got
wrong; on MiniLM int8's error sends most copies back. A cheap copy could instead serve as a
*control variate* (multi-fidelity Monte Carlo), unbiased whatever its error: per token, the
surrogate's flip :math:`G` on :math:`M` draws and float32's :math:`F` on :math:`n \le M` of
them,

.. math::

    \hat p = \frac1M\sum_{j\le M} G_j + \frac1n\sum_{j\le n} (F_j - G_j),

costs :math:`cM + n` float32 forwards (:math:`c`: the surrogate's time per forward over
float32's) for a variance of about :math:`\operatorname{Var}G/M + \operatorname{Var}(F-G)/n`.
At the best split, against :math:`\operatorname{Var}F` per float32 forward, that gains at most

.. math::

    \frac{\operatorname{Var}F}{\big(\sqrt{c\operatorname{Var}G} + \sqrt{\operatorname{Var}(F-G)}
    \big)^2}

(each variance summed over tokens with the estimate's squared weights :math:`1/(nK_b)^2`). It
pays only where the surrogate is cheap *and* disagrees with float32 on far fewer copies than
float32's own :math:`p(1-p)`. This script draws every real token of the first ``--examples``
examples ``--draws`` times (the naive loop, the same noise for every precision), times the
perturbed forwards of float32 and each surrogate side by side, and prints each one's
disagreement and that bound:

* ``int8``: every eligible linear layer as a dynamic int8 product (senslab's
  :class:`~senslab.measure._int8.Int8Linears`);
* ``int8-ffn``: only the feed-forward layers (inputs or outputs of the intermediate width);
* ``bf16``, ``fp16``: autocast.

    python benchmarks/surrogate_flips.py --case minilm --examples 32 --draws 8 \
        --out benchmarks/results/surrogate-flips-minilm.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_models  # noqa: E402

from senslab.measure import _int8  # noqa: E402

SURROGATES = ("int8", "int8-ffn", "bf16", "fp16")


class _SomeInt8(_int8.Int8Linears):
    """:class:`Int8Linears` on the layers whose weights are in ``keep`` only."""

    def __init__(self, keep: set[int]) -> None:
        super().__init__()
        self.keep = keep

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        weight = args[1] if len(args) > 1 else (kwargs or {}).get("weight")
        if func is F.linear and id(weight) not in self.keep:
            return func(*args, **(kwargs or {}))
        return super().__torch_function__(func, types, args, kwargs)


def surrogate(name: str, model: torch.nn.Module) -> AbstractContextManager[Any]:
    """The context that makes ``model``'s forwards run as surrogate ``name``."""
    if name == "int8":
        return _int8.Int8Linears()
    if name == "int8-ffn":
        widths = [m.weight.shape for m in model.modules() if isinstance(m, torch.nn.Linear)]
        inner = max(max(s) for s in widths)  # the feed-forward's intermediate width
        return _SomeInt8({id(m.weight) for m in model.modules()
                          if isinstance(m, torch.nn.Linear) and inner in m.weight.shape})
    if name in ("bf16", "fp16"):
        dtype = torch.bfloat16 if name == "bf16" else torch.float16
        return torch.autocast("cpu", dtype=dtype)
    raise ValueError(f"unknown surrogate {name!r}; one of {SURROGATES}")


def unbiased_pq(x: Tensor) -> Tensor:
    """Per token (rows), the unbiased variance of its draws (columns)."""
    return x.double().var(1, unbiased=True)


def weighted(per_example: list[Tensor]) -> float:
    """:math:`\\sum_b \\sum_t v_{bt}/(nK_b)^2` of per-token values ``per_example`` (K_b,)."""
    n = len(per_example)
    return sum(float(v.sum()) / (n * len(v)) ** 2 for v in per_example)


def best_gain(var_f: float, var_g: float, var_d: float, cost: float) -> float:
    """The control variate's best precision per float32 forward over plain draws' (module
    docstring): float32's variance ``var_f``, the surrogate's ``var_g``, their difference's
    ``var_d``, the surrogate's ``cost`` per forward in float32 forwards. NaN where the
    surrogate's variances are both 0 (no flips at all)."""
    denominator = (math.sqrt(cost * var_g) + math.sqrt(var_d)) ** 2
    return var_f / denominator if denominator > 0 else math.nan


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", default="minilm", choices=("minilm", "gpt2"))
    p.add_argument("--examples", type=int, default=32)
    p.add_argument("--draws", type=int, default=8, help="draws per token (at least 2)")
    p.add_argument("--surrogates", nargs="+", default=list(SURROGATES), choices=SURROGATES)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.draws < 2:
        raise SystemExit("--draws must be at least 2 (the variances need two draws a token)")
    torch.set_num_threads(args.threads)
    case = real_models.make_case(args.case, args.examples)
    real_models.naive_loop(real_models.dataclasses.replace(case, inputs=real_models.select(
        case.inputs, torch.arange(1))), seed=args.seed, repeats=2)  # warm
    start = time.perf_counter()
    ref = real_models.naive_loop(case, seed=args.seed, repeats=args.draws)
    rows: dict[str, Any] = {}
    vf = weighted([unbiased_pq(f) for f in ref["flips"]])
    for name in args.surrogates:
        with surrogate(name, case.model):
            row = real_models.naive_loop(case, seed=args.seed, repeats=args.draws)
        g = row["flips"]
        c = row["t_perturbed"] / ref["t_perturbed"]
        vg = weighted([unbiased_pq(x) for x in g])
        vd = weighted([unbiased_pq(f.double() - x.double()) for f, x in
                       zip(ref["flips"], g, strict=True)])
        disagree = float(torch.cat([(f != x).flatten() for f, x in
                                    zip(ref["flips"], g, strict=True)]).double().mean())
        gain = best_gain(vf, vg, vd, c)
        rows[name] = {"time_ratio": c, "t_perturbed": row["t_perturbed"],
                      "flip_rate": row["estimate"], "disagreement": disagree,
                      "var_g": vg, "var_f_minus_g": vd, "best_gain": gain}
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "threads": args.threads, "case": args.case,
              "examples": case.n, "draws": args.draws, "seed": args.seed, "sigma": case.sigma,
              "tokens": sum(len(f) for f in ref["flips"]), "flip_rate": ref["estimate"],
              "float32_t_perturbed": ref["t_perturbed"], "var_f": vf,
              "seconds": time.perf_counter() - start, "surrogates": rows}
    print(f"{args.case}: {case.n} examples, {result['tokens']} tokens × {args.draws} draws, "
          f"float32 flip rate {result['flip_rate']:.4f}, float32 {ref['t_perturbed']:.1f} s "
          f"({args.threads} threads)")
    for name, r in rows.items():
        print(f"  {name:9s} time {r['time_ratio']:.2f}× float32's, flip rate "
              f"{r['flip_rate']:.4f}, disagrees on {r['disagreement']:.4f} of copies; "
              f"Var(F−G)/Var F {r['var_f_minus_g'] / max(vf, 1e-300):.2f}; best gain "
              f"{r['best_gain']:.2f}×")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
