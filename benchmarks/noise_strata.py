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

* ``through M`` (``--through M``, any number): the margin predicted by running the model exactly
  up to module ``M`` (its output; ``M:in``, its input) and linearly after it,
  :math:`m_0 + \nabla_{h}m\cdot(h(\varepsilon) - h(0))`, the gradient taken on the clean example
  at its real length. A feature of the noise like the others, but not free: it costs the model's
  forward up to ``M``, whose share of a whole forward's FLOPs the record keeps (``prefix_share``).
  Such a surrogate can also choose which draws to evaluate whole (*two-phase sampling*, below).

Each feature's gain, plain over stratified in :math:`\sum_{bt} w_b^2 \operatorname{Var}` with
:math:`w_b = 1/(nK_b)`, is estimated per token by ranking its draws on the feature and cutting
them into R equal groups (the groups stand in for the strata; :math:`h(m-h)/(m(m-1))` is
unbiased for each group's :math:`p_s(1-p_s)`), at R = 2, 4, 8, 16. The ranks of a finite set of
draws only approximate the strata, so the gains are estimates, not bounds.

**Two-phase sampling** with a ``through`` surrogate :math:`s` (its predicted margin): every draw
runs the prefix, and goes on to a whole forward with probability :math:`\pi = 1` where
:math:`s < \tau`, :math:`\pi_0` elsewhere; the flip counts :math:`1/\pi` if evaluated, 0 if
not — unbiased whatever the surrogate. Per draw it costs :math:`c + \mathbb E\pi` forwards
(:math:`c` the prefix share; the whole forward is not resumed from the prefix, as a model's own
call cannot be) for a variance :math:`p(1-p) + \mathbb E[f(1/\pi - 1)]`. Its gain over plain
draws, the product of cost and variance summed over tokens with the estimate's weights, is
reported for the :math:`(\tau, \pi_0)` best on the first half of every token's draws, judged
on the second half (``two_phase``), and again as if the prefix cost nothing (``free``).

    python benchmarks/noise_strata.py --case minilm --examples 64 --draws 32 \
        --out benchmarks/results/noise-strata-minilm.json
    python benchmarks/noise_strata.py --case minilm --examples 64 --draws 32 \
        --through bert.encoder.layer.0.attention.output.dense:in bert.encoder.layer.0 \
        bert.encoder.layer.1 bert.encoder.layer.2 \
        --out benchmarks/results/noise-strata-minilm-through.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_models  # noqa: E402

from senslab.measure._control import LinearControl  # noqa: E402
from senslab.measure.outputs import predictions  # noqa: E402
from senslab.tokens.base import call_model  # noqa: E402

STRATA = (2, 4, 8, 16)
#: the thresholds τ (margin units) and sampling probabilities π₀ two-phase sampling chooses among
TAUS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
FLOORS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5)


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


def two_phase_gain(flips: list[Tensor], score: list[Tensor], tau: float, floor: float,
                   cost: float) -> float:
    r"""Plain draws over two-phase sampling (module docstring) with threshold ``tau`` on
    ``score`` (per example (K, draws), the surrogate's margin), probability ``floor`` above it and
    prefix share ``cost``: :math:`\sum_t 1 \cdot \sum_t w_b^2 p(1-p)` over
    :math:`\sum_t (c + \bar\pi) \cdot \sum_t w_b^2 (p(1-p) + \overline{f(1/\pi - 1)})`, each
    token's p its own flip share."""
    n = len(flips)
    plain_v = v = plain_c = c = 0.0
    for f, sc in zip(flips, score, strict=True):
        fd = f.double()
        k = fd.shape[0]
        w2 = 1.0 / (n * k) ** 2
        pi = torch.where(sc < tau, 1.0, floor).double()
        p = fd.mean(1)
        plain_v += w2 * float((p * (1 - p)).sum())
        v += w2 * float((p * (1 - p) + (fd * (1 / pi - 1)).mean(1)).sum())
        plain_c += k
        c += float((cost + pi.mean(1)).sum())
    return plain_v * plain_c / (v * c) if v > 0 else float("inf")


def two_phase(flips: list[Tensor], score: list[Tensor], cost: float) -> dict[str, float]:
    """Two-phase sampling's gain with the (τ, π₀) of :data:`TAUS` × :data:`FLOORS` best on the
    first half of every token's draws, judged on the second half, at prefix share ``cost`` and
    free (``cost`` 0, the same choice)."""
    m = flips[0].shape[1] // 2
    if m < 1:
        raise ValueError("two-phase sampling needs at least 2 draws per token")
    first = ([f[:, :m] for f in flips], [s[:, :m] for s in score])
    second = ([f[:, m:] for f in flips], [s[:, m:] for s in score])
    fit, tau, floor = max((two_phase_gain(*first, t, f0, cost), t, f0)
                          for t in TAUS for f0 in FLOORS)
    return {"tau": tau, "floor": floor, "fitted": fit, "cost": cost,
            "two_phase": two_phase_gain(*second, tau, floor, cost),
            "free": two_phase_gain(*second, tau, floor, 0.0)}


def _where(model: torch.nn.Module, name: str) -> tuple[torch.nn.Module, bool]:
    """The module a ``--through`` name means, and whether its input (``M:in``) is meant."""
    path, _, side = name.partition(":")
    if side not in ("", "in"):
        raise ValueError(f"--through {name!r}: write a module's name, or name:in for its input")
    return model.get_submodule(path), side == "in"


@contextmanager
def _seen(model: torch.nn.Module, name: str, fn: Callable[[Tensor], None]) -> Iterator[None]:
    """Calls ``fn`` with the tensor ``name`` names on every forward (a tuple output's first)."""
    module, inp = _where(model, name)
    if inp:
        handle = module.register_forward_pre_hook(lambda m, a: fn(a[0]))
    else:
        handle = module.register_forward_hook(
            lambda m, a, o: fn(o[0] if isinstance(o, tuple) else o))
    try:
        yield
    finally:
        handle.remove()


class _Stop(Exception):
    """Raised by a hook to end a forward at the module it watches."""


def _raise(_: Tensor) -> None:
    raise _Stop


def prefix_share(case: Any, name: str) -> float:
    """FLOPs of the model's forward up to ``name`` over a whole forward's, on the first example
    at its real length (attention counted as its matrix products)."""
    one = real_models._example(case, 0)
    whole, _ = real_models._count(lambda: call_model(case.model, one))

    def part() -> None:
        with _seen(case.model, name, _raise):
            try:
                call_model(case.model, one)
            except _Stop:
                pass

    return real_models._count(part)[0] / whole


def clean_states(case: Any, names: list[str]) -> list[dict[str, tuple[Tensor, Tensor, float]]]:
    """Per example, at its real length: each ``through`` tensor's clean value, the gradient of
    the margin (predicted class over the runner-up) at it, and that margin."""
    out = []
    for b in range(case.n):
        one = real_models._example(case, b)
        got: dict[str, Tensor] = {}

        def keep(name: str, got: dict[str, Tensor] = got) -> Callable[[Tensor], None]:
            def fn(t: Tensor) -> None:
                t.retain_grad()
                got[name] = t
            return fn

        with torch.enable_grad():
            with ExitStack() as stack:
                for n in names:
                    stack.enter_context(_seen(case.model, n, keep(n)))
                logits = call_model(case.model, one)[0].float()
            pred = int(logits.argmax())
            m = logits[pred] - logits.masked_fill(
                torch.arange(len(logits)) == pred, -torch.inf).max()
            m.backward()
        case.model.zero_grad(set_to_none=True)
        out.append({n: (got[n].detach()[0].double(), got[n].grad[0].double(), float(m.detach()))
                    for n in names})
    return out


def draws(case: Any, repeats: int, seed: int, through: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every real token's ``repeats`` draws, one example at a time at its real length (the
    naive loop itself, :func:`real_models.naive_loop`): flips and noise features, per example
    (K, repeats); ``through``: the margins of those surrogates (module docstring) too."""
    states = clean_states(case, list(through)) if through else []
    with torch.inference_mode(), case.tokens.bind(case.model, case.inputs) as bound:
        ref = predictions(bound.clean_output, "logits")
        grad = LinearControl(bound, ref, case.sigma, 32, "logits").g
    dim = real_models.token_dim(case)
    seen: dict[str, Tensor] = {}  # the token module's last output: the clean one, when observed
    feats: dict[str, list[Tensor]] = {"tangent": [], "norm": [], "token": [], "|token|": []}
    for name in through:
        feats[f"through {name}"] = []
    now = {"b": -1}

    def surrogate(name: str) -> Callable[[Tensor], None]:
        def fn(t: Tensor) -> None:
            b = now["b"]
            k = int(case.lengths[b])
            if b < 0 or t.shape[0] != k * repeats:  # the clean forward of the example
                return
            h0, g, m0 = states[b][name]
            m = m0 + ((t.double() - h0) * g).flatten(1).sum(1)
            feats[f"through {name}"].append(m.view(k, repeats))
        return fn

    def observe(b: int, noise: Tensor) -> None:
        now["b"] = b
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
        with ExitStack() as stack:
            for name in through:
                stack.enter_context(_seen(case.model, name, surrogate(name)))
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
    p.add_argument("--through", nargs="*", default=[], metavar="MODULE",
                   help="surrogates exact up to MODULE's output (MODULE:in, its input), linear "
                        "after")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    strata = [r for r in STRATA if args.draws % r == 0 and args.draws // r >= 2]
    if not strata:
        raise SystemExit(f"--draws must allow 2 strata of 2 draws, got {args.draws}")
    torch.set_num_threads(args.threads)
    case = real_models.make_case(args.case, args.examples)
    start = time.perf_counter()
    d = draws(case, args.draws, args.seed, tuple(args.through))
    seconds = time.perf_counter() - start
    shares = {name: prefix_share(case, name) for name in args.through}
    flips = d["flips"]
    k = torch.tensor([f.shape[0] for f in flips], dtype=torch.float64)
    rate = float((torch.stack([f.double().mean() for f in flips])).mean())
    gains = {name: {str(r): strata_gain(flips, v, r) for r in strata}
             for name, v in d["features"].items()}
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "threads": args.threads, "case": args.case,
              "examples": case.n, "draws": args.draws, "seed": args.seed, "sigma": case.sigma,
              "tokens": int(k.sum()), "flip_rate": rate, "seconds": seconds,
              "stratification_gain": gains,
              "two_phase": {name: two_phase(d["flips"], d["features"][f"through {name}"],
                                            shares[name]) for name in args.through}}
    print(f"{args.case}: {case.n} examples, {int(k.sum())} tokens, {args.draws} draws each, "
          f"flip rate {rate:.4f}, {seconds:.0f} s")
    for name, g in gains.items():
        print(f"  stratified on {name}: " + ", ".join(f"{r} strata {v:.2f}×"
                                                      for r, v in g.items()))
    for name, t in result["two_phase"].items():
        print(f"  two-phase through {name} (prefix {t['cost']:.1%} of a forward): "
              f"{t['two_phase']:.2f}× on held-out draws ({t['free']:.2f}× were it free), "
              f"τ {t['tau']}, π₀ {t['floor']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
