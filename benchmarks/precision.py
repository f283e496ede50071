r"""Forward passes needed to reach a standard error: plain Monte Carlo vs senslab's techniques.

Plain Monte Carlo over (example, token, noise) triples of a fixed set of examples (all of the same
length) has variance :math:`\bar p(1-\bar p)/F` after :math:`F` perturbed forward passes — exact
for flip indicators, with :math:`\bar p` the flip rate (here the mean of the techniques'
estimates, all unbiased). A technique that reached the fixed-subset standard error :math:`s` with
:math:`F` perturbed forwards has cost :math:`c = s^2 F` per unit variance, so it needs
:math:`c/s_*^2` forwards for a target :math:`s_*`; the saving is :math:`\bar p(1-\bar p)/c`. The
control variate's gradient pass is charged as 3 forward passes per example (forward + backward).
``adaptive`` runs ``target_stderr`` (half the stratified run's s.e.) and reports the forwards it
actually spent against those plain Monte Carlo needs for that s.e.

To keep the runs short only ``tokens`` evenly spaced tokens of each example (first and last
included) are perturbed (a ``mask``; the model still sees every token), so the estimand is the
flip rate over those tokens.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from senslab.measure import token_sensitivity
from senslab.tokens import Patches

TECHNIQUES: dict[str, dict[str, Any]] = {
    "stratified": {"repeats": 4},
    "antithetic": {"repeats": 4, "antithetic": True},
    "control variate": {"repeats": 4, "control_variate": "linear"},
    "cv + antithetic": {"repeats": 4, "antithetic": True, "control_variate": "linear"},
}


def savings(model: Any, x: Any, tokens_spec: Any, sigma: float, tokens: int,
            length: int) -> dict[str, Any]:
    """Per technique: estimate, subset s.e., perturbed forwards, cost and saving over plain MC;
    then an adaptive run. ``x``: the examples; ``tokens`` of their ``length`` are measured."""
    n = len(x) if isinstance(x, torch.Tensor) else len(next(iter(x.values())))
    mask = torch.zeros(n, length, dtype=torch.bool)
    # evenly spaced, first and last included (a CLS read-out and an LSTM's last state alike)
    mask[:, torch.linspace(0, length - 1, tokens).round().long()] = True
    rows: dict[str, Any] = {"sigma": sigma, "examples": n, "tokens": tokens}
    runs = {}
    for name, opts in TECHNIQUES.items():
        r = token_sensitivity(model, x, tokens_spec, sigma=sigma, estimand="subset", mask=mask,
                              generator=1, **opts)
        cv = "control_variate" in opts
        perturbed = r.num_forward - n - (n if cv else 0) + (3 * n if cv else 0)
        runs[name] = (r, perturbed)
    p = sum(r.estimate for r, _ in runs.values()) / len(runs)
    plain = p * (1 - p)
    rows["flip_rate"] = p
    rows["plain_cost"] = plain
    for name, (r, perturbed) in runs.items():
        cost = r.stderr**2 * perturbed
        rows[name] = {"estimate": r.estimate, "stderr": r.stderr, "forwards": perturbed,
                      "cost": cost, "saving": plain / cost if cost > 0 and plain > 0 else None,
                      # every unit of every cell equal: the technique is exact here
                      "exact": cost == 0 and plain > 0}
    target = runs["stratified"][0].stderr / 2
    if target > 0 and plain > 0:
        r = token_sensitivity(model, x, tokens_spec, sigma=sigma, estimand="subset", mask=mask,
                              generator=2, repeats=2, antithetic=True, control_variate="linear",
                              target_stderr=target)
        spent = r.num_forward - 2 * n + 3 * n
        need = plain / target**2
        rows["adaptive"] = {"target": target, "stderr": r.stderr, "forwards": spent,
                            "plain_forwards": need, "saving": need / spent}
    return rows


def trained_digits_mlp(seed: int = 0, steps: int = 300) -> tuple[nn.Module, torch.Tensor]:
    """A 64-128-10 LeakyReLU MLP trained (full-batch SGD, ``steps`` steps, ~1 s) on scikit-learn's
    8×8 digits, pixels scaled to [−1, 1]: flip rates of a *trained* classifier, where most
    (example, patch) cells never flip and a few flip often. Returns the model and 64 training
    images (1, 8, 8)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32).view(-1, 1, 8, 8) / 8 - 1
    y = torch.tensor(d.target)
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.LeakyReLU(), nn.Linear(128, 10))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1 / math.sqrt(p.shape[-1])))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval(), x[torch.randperm(len(x), generator=g)[:64]]


def digits_savings(sigma: float = 1.0, examples: int = 64, steps: int = 300) -> dict[str, Any]:
    """:func:`savings` on the trained digits MLP, 2×2 patches (16 tokens)."""
    model, x = trained_digits_mlp(steps=steps)
    return savings(model, x[:examples], Patches(2), sigma, 16, 16)
