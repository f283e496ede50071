r"""Within a token: does any feature of the noise predict its flips?

Allocations (``allocation_holdout.py``) move draws *between* tokens; the variance left is each
token's own :math:`p(1-p)` per draw. A feature :math:`f(\varepsilon)` of the noise whose
distribution is known could cut it by stratification: a token's R draws taken one from each of
R equal-probability strata of :math:`f`, unbiased whatever the model, with variance

.. math::

    \frac{1}{R^2}\sum_{s=1}^{R} p_s(1-p_s) \quad\text{against}\quad \frac{p(1-p)}{R}

(:math:`p_s` the flip rate within stratum s). A feature that decides the flip (a threshold on
it) leaves almost nothing; one unrelated to the flip gains nothing. This script draws every real
token of the first ``--examples`` examples ``--draws`` times (the naive loop's forwards, noise
from ``--seed``), records each draw's flip and these features of its noise, all cheap to
compute for a copy:

* ``tangent``: :math:`g^\top\varepsilon/(\sigma\lVert g\rVert)`, the noise along the gradient
  of the clean margin at that token (what the control variate and the allocation's tangent use);
* ``norm``: :math:`\lVert\varepsilon\rVert`;
* ``token``: :math:`x^\top\varepsilon/\lVert x\rVert`, along the token's own clean vector, and
  ``|token|``.

Each feature's gain, plain over stratified in :math:`\sum_{bt} w_b^2 \operatorname{Var}` with
:math:`w_b = 1/(nK_b)`, is estimated per token by ranking its draws on the feature and cutting
them into R equal groups (the groups stand in for the strata; :math:`h(m-h)/(m(m-1))` is
unbiased for each group's :math:`p_s(1-p_s)`), at R = 2, 4, 8, 16. The ranks of a finite set of
draws only approximate the strata, so the gains are estimates, not bounds.

    python benchmarks/noise_strata.py --case minilm --examples 64 --draws 32 \
        --out benchmarks/results/noise-strata-minilm.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_models  # noqa: E402

from senslab.measure._control import LinearControl  # noqa: E402
from senslab.measure.outputs import predictions  # noqa: E402

STRATA = (2, 4, 8, 16)


def pq(h: Tensor, m: int) -> Tensor:
    """Unbiased :math:`p(1-p)` from ``h`` flips in ``m`` draws."""
    return h * (m - h) / (m * (m - 1))


def strata_gain(flips: list[Tensor], feature: list[Tensor], strata: int) -> float:
    r"""Plain over stratified variance, :math:`\sum w_b^2` of each token's, for ``flips`` and
    ``feature`` (per example (K, draws)); the draws of each token ranked on the feature and cut
    into ``strata`` equal groups (the draws must divide by ``strata``, with at least 2 a
    group)."""
    n = len(flips)
    plain = stratified = 0.0
    for f, v in zip(flips, feature, strict=True):
        k, m = f.shape
        if m % strata or m // strata < 2:
            raise ValueError(f"{m} draws cannot be cut into {strata} groups of at least 2")
        w2 = 1.0 / (n * k) ** 2
        fd = f.double()
        plain += w2 * float(pq(fd.sum(1), m).sum())
        ranked = fd.gather(1, v.argsort(1)).view(k, strata, m // strata)
        stratified += w2 * float(pq(ranked.sum(2), m // strata).mean(1).sum())
    return plain / stratified if stratified > 0 else float("inf")


def draws(case: Any, repeats: int, seed: int) -> dict[str, Any]:
    """Every real token's ``repeats`` draws, one example at a time at its real length (the
    naive loop itself, :func:`real_models.naive_loop`): flips and noise features, per example
    (K, repeats)."""
    with torch.inference_mode(), case.tokens.bind(case.model, case.inputs) as bound:
        ref = predictions(bound.clean_output, "logits")
        grad = LinearControl(bound, ref, case.sigma, 32, "logits").g
    dim = real_models.token_dim(case)
    seen: dict[str, Tensor] = {}  # the token module's last output: the clean one, when observed
    feats: dict[str, list[Tensor]] = {"tangent": [], "norm": [], "token": [], "|token|": []}

    def observe(b: int, noise: Tensor) -> None:
        k = int(case.lengths[b])
        x = seen["x"][0, :k].double()
        e = noise.view(k, repeats, dim).double()
        g = grad[b, :k].double()
        u = g / g.norm(dim=1, keepdim=True).clamp(min=1e-300)
        feats["tangent"].append((e * u[:, None]).sum(-1) / case.sigma)
        feats["norm"].append(e.norm(dim=-1))
        along = (e * (x / x.norm(dim=1, keepdim=True))[:, None]).sum(-1)
        feats["token"].append(along)
        feats["|token|"].append(along.abs())

    module = case.model.get_submodule(case.tokens.module)
    handle = module.register_forward_hook(lambda m, a, out: seen.__setitem__("x", out.detach()))
    try:
        row = real_models.naive_loop(case, seed=seed, repeats=repeats, observe=observe)
    finally:
        handle.remove()
    return {"flips": row["flips"], "features": feats}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", default="minilm", choices=("minilm", "gpt2"))
    p.add_argument("--examples", type=int, default=64)
    p.add_argument("--draws", type=int, default=32, help="draws per token")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    strata = [r for r in STRATA if args.draws % r == 0 and args.draws // r >= 2]
    if not strata:
        raise SystemExit(f"--draws must allow 2 strata of 2 draws, got {args.draws}")
    torch.set_num_threads(args.threads)
    case = real_models.make_case(args.case, args.examples)
    start = time.perf_counter()
    d = draws(case, args.draws, args.seed)
    seconds = time.perf_counter() - start
    flips = d["flips"]
    k = torch.tensor([f.shape[0] for f in flips], dtype=torch.float64)
    rate = float((torch.stack([f.double().mean() for f in flips])).mean())
    gains = {name: {str(r): strata_gain(flips, v, r) for r in strata}
             for name, v in d["features"].items()}
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "threads": args.threads, "case": args.case,
              "examples": case.n, "draws": args.draws, "seed": args.seed, "sigma": case.sigma,
              "tokens": int(k.sum()), "flip_rate": rate, "seconds": seconds,
              "stratification_gain": gains}
    print(f"{args.case}: {case.n} examples, {int(k.sum())} tokens, {args.draws} draws each, "
          f"flip rate {rate:.4f}, {seconds:.0f} s")
    for name, g in gains.items():
        print(f"  stratified on {name}: " + ", ".join(f"{r} strata {v:.2f}×"
                                                      for r, v in g.items()))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
