r"""Shared pieces of the Hahn & Rofin experiments: settings, training loop, measures
(docs/definitions.md#hahn-and-rofin-setup).

Every run trains senslab's ``boolean_transformer`` (post-LN, bit ⊕ position embedding, scalar
read-out at the last position) with AdamW on the MSE to {0, 1} targets, either on fresh uniform
strings every step or full-batch on a fixed subset of the cube, and logs at each evaluation

* ``train/loss`` (mean training MSE since the last evaluation), ``test/loss``, ``test/acc``
  (fixed held-out strings; for subset training ``train/acc`` on the subset and ``test/acc`` on
  the rest of the cube),
* ``sharpness/loss`` (± ``sharpness/loss_se``): :math:`4\,(\mathbb E_\Delta L(\theta+\Delta) -
  L(\theta))`, :math:`\Delta \sim \mathcal N(0, 0.02^2)` on every weight but the positional
  embeddings, ×4 for the ±1 scale (:func:`senslab.measure.sharpness.loss_sharpness`),
* ``blowup`` (mean over the evaluation strings of the per-string LayerNorm blow-up) and
  ``blowup/log10`` (mean of its log10, robust to one exploding string),
* ``param_norm``: :math:`\lVert\theta\rVert_2` without positional embeddings,
* ``bool_sens``: the average sensitivity as(f̂) of the *learned* Boolean function
  f̂(x) = 1[model(x) > 1/2] (exact up to n = 12, else 2,000 sampled strings); for MEAN the
  "real" rule on the ±1 scale, (2Δ)²/4 summed over bits.

Accuracy: a prediction is right when it lands on the correct side of 1/2 (MEAN: when it rounds to
the correct fraction, |ŷ − y| < 1/(2n)). A run *converged* when its final ``test/acc`` > 0.99
(docs/definitions.md#hahn-and-rofin-setup).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ...data.synthetic import BOOLEAN_FUNCTIONS
from ...measure import boolean_sensitivity
from ...measure.sharpness import layernorm_blowup, loss_sharpness, parameter_norm
from ...models import create_model
from ...train.config import matching, ranged
from ...train.rundir import RunDir
from .._manual import finished_summary, start_run

SIGMA = 0.02  # weight-noise std of the sharpness (docs/definitions.md#loss-sharpness)
SHARPNESS_SCALE = 4.0  # MSE on {0, 1} targets → the ±1 scale
CONVERGED_ACC = 0.99


@dataclass
class Setup:
    """Training and measurement settings common to all four experiments (defaults: the paper's).

    ``batch``: fresh strings per step; ``eval_size``: fixed held-out strings for loss, accuracy,
    sharpness and blow-up; ``sharp_draws``: weight draws per sharpness estimate;
    ``device``: "auto" picks CUDA when available.
    """

    dim: int = ranged(128, ge=1)
    layers: int = ranged(2, ge=1)
    heads: int = ranged(2, ge=1)
    steps: int = ranged(10_000, ge=1)
    batch: int = ranged(1024, ge=1)
    lr: float = ranged(3e-4, gt=0)
    weight_decay: float = ranged(0.1, ge=0)
    eval_every: int = ranged(500, ge=1)
    eval_size: int = ranged(1024, ge=1)
    sharp_draws: int = ranged(20, ge=1)
    device: str = matching("auto", r"auto|cpu|mps|cuda(:\d+)?", "auto, cpu, cuda, cuda:N or mps")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def fresh_strings(function: str, n: int, size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """``size`` uniform ±1 strings of length n from ``gen`` and their {0, 1} (MEAN: [0, 1])
    targets."""
    x = torch.randint(0, 2, (size, n), generator=gen).float() * 2 - 1
    return x, BOOLEAN_FUNCTIONS[function](x)


def accuracy(out: Tensor, y: Tensor, function: str, n: int) -> float:
    if function == "mean":
        return ((out - y).abs() < 0.5 / n).float().mean().item()
    return ((out > 0.5) == (y > 0.5)).float().mean().item()


def learned_sensitivity(model: nn.Module, n: int, function: str, gen: torch.Generator) -> float:
    """as(f̂) of the function the model computes (see the module docstring), in eval mode."""
    method = "exact" if n <= 12 else "sample"
    was = model.training
    model.eval()
    try:
        if function == "mean":
            device = next(model.parameters()).device

            def pm(x: Tensor) -> Tensor:  # the model's output on the ±1 scale
                return 2 * model(x.to(device)) - 1

            return boolean_sensitivity(pm, n, method=method, output="real",
                                       generator=gen).average
        return boolean_sensitivity(
            model, n, method=method, output="sign", threshold=0.5, generator=gen
        ).average
    finally:
        model.train(was)


def measure(model: nn.Module, x: Tensor, y: Tensor, function: str, n: int, draws: int,
            gen: torch.Generator) -> dict[str, float]:
    """Loss, accuracy, sharpness (×4), blow-up, parameter norm and as(f̂) on the batch (x, y)."""
    was = model.training
    model.eval()  # no dropout in this model, but the measures must not depend on that
    try:
        with torch.no_grad():
            out = model(x)
        sharp = loss_sharpness(model, F.mse_loss, x, y, sigma=SIGMA, draws=draws,
                               exclude=("pos",), generator=gen, scale=SHARPNESS_SCALE)
        blow = layernorm_blowup(model, x)
        sens = learned_sensitivity(model, n, function, gen)
    finally:
        model.train(was)
    return {
        "loss": F.mse_loss(out, y).item(),
        "acc": accuracy(out, y, function, n),
        "sharpness/loss": sharp.estimate,
        "sharpness/loss_se": sharp.stderr,
        "blowup": blow.mean().item(),
        "blowup/log10": blow.log10().mean().item(),
        "param_norm": parameter_norm(model),
        "bool_sens": sens,
    }


def train_boolean(
    path: Path,
    *,
    label: str,
    function: str,
    n: int,
    seed: int,
    setup: Setup,
    config: dict[str, Any] | None = None,
    train_set: tuple[Tensor, Tensor] | None = None,
    test_set: tuple[Tensor, Tensor] | None = None,
    sharp_set: tuple[Tensor, Tensor] | None = None,
    stop_below: float | None = None,
    extra: Callable[[nn.Module], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Train one model into the run directory ``path`` and return its summary.

    Fresh sampling (``train_set=None``): ``setup.batch`` new strings per step, evaluation on
    ``setup.eval_size`` fixed held-out strings. Subset training: full batch on ``train_set``,
    ``train/loss`` and ``train/acc`` on it, sharpness and blow-up on ``sharp_set`` (default: the
    training set), ``test/acc`` on ``test_set``.
    ``stop_below`` ends training at the first evaluation whose training loss is below it.
    ``extra(model)`` adds metrics at every evaluation. The summary holds ``first_below_001``,
    the first step whose training batch loss was < 0.01 (None if never). A finished run
    (summary.json present) is reused; an unfinished one restarts from scratch (runs are short).
    The run directory is locked while the run trains.
    """
    # the per-run settings: the Setup fields (not a subclass's run-selecting fields such as the
    # list of n values or the number of seeds), the early stop and the caller's extras
    settings = {f.name: getattr(setup, f.name) for f in dataclasses.fields(Setup)}
    settings.update({"stop_below": stop_below, **(config or {})})
    resolved = {"name": path.name, "label": label, "seed": seed, "function": function, "n": n,
                **settings}
    done = finished_summary(path)
    if done is not None:
        _check_reusable(RunDir(path), resolved)
        return done
    with RunDir(path).writing():  # one writer at a time
        device = pick_device(setup.device)
        # a killed run restarts (no checkpoint is worth keeping here): a fresh metric log
        rd = start_run(path, resolved, device)

        model = create_model("boolean_transformer", n_bits=n, dim=setup.dim, ff_dim=setup.dim,
                             layers=setup.layers, heads=setup.heads, seed=seed).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=setup.lr, weight_decay=setup.weight_decay)
        data_gen = torch.Generator().manual_seed(1_000_003 * seed + 17)
        measure_gen = torch.Generator().manual_seed(seed)
        if train_set is None:
            eval_x, eval_y = fresh_strings(function, n, setup.eval_size,
                                           torch.Generator().manual_seed(10_007 * seed + 5))
            held = (eval_x, eval_y)
        else:
            eval_x, eval_y = sharp_set if sharp_set is not None else train_set
            held = test_set
        eval_x, eval_y = eval_x.to(device), eval_y.to(device)

        start = time.perf_counter()
        first_below: int | None = None
        losses: list[float] = []
        record: dict[str, Any] = {}
        for step in range(1, setup.steps + 1):
            if train_set is None:
                x, y = fresh_strings(function, n, setup.batch, data_gen)
            else:
                x, y = train_set
            loss = F.mse_loss(model(x.to(device)), y.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if first_below is None and losses[-1] < 0.01:
                first_below = step
            if step % setup.eval_every and step != setup.steps:
                continue
            m = measure(model, eval_x, eval_y, function, n, setup.sharp_draws, measure_gen)
            record = {"step": step, "epoch": float(step), "train/loss": sum(losses) / len(losses)}
            if train_set is None:
                record.update({"test/loss": m.pop("loss"), "test/acc": m.pop("acc")})
            else:
                del m["loss"], m["acc"]  # on the sharpness set; the fit is judged on the train set
                with torch.no_grad():
                    out = model(train_set[0].to(device))
                y_train = train_set[1].to(device)
                record.update({"train/loss": F.mse_loss(out, y_train).item(),
                               "train/acc": accuracy(out, y_train, function, n)})
                if held is not None:
                    with torch.no_grad():
                        out = model(held[0].to(device))  # no dropout: train mode is deterministic
                    record["test/acc"] = accuracy(out, held[1].to(device), function, n)
            record.update(m)
            if extra is not None:
                record.update(extra(model))
            record["time"] = time.perf_counter() - start
            rd.log(record)
            losses = []
            if stop_below is not None and record["train/loss"] < stop_below:
                break
        acc_key = "test/acc" if train_set is None else "train/acc"
        summary = {
            "label": label, "name": path.name, "final": record,
            "seconds": time.perf_counter() - start, "function": function, "n": n, "seed": seed,
            "converged": bool(record[acc_key] > CONVERGED_ACC), "first_below_001": first_below,
            "config": settings,
        }
        rd.write_json("summary.json", summary)
        return summary


def _check_reusable(rd: RunDir, resolved: dict[str, Any]) -> None:
    """A finished run is reused only if its config.json agrees with the settings asked for
    (keys an older config.json lacks are not compared)."""
    old = rd.read_json("config.json") if (rd.path / "config.json").exists() else {}
    changed = sorted(k for k, v in resolved.items() if k in old and old[k] != v)
    if changed:
        diff = ", ".join(f"{k}: {old[k]!r} → {resolved[k]!r}" for k in changed)
        raise ValueError(
            f"{rd.path} holds a finished run with other settings ({diff}); use a new --out "
            "directory, or delete that run directory to retrain it"
        )


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares slope, its standard error and the intercept of y on x.

    se(slope) = sqrt(Σ r² / (m − 2) / Σ (x − x̄)²) for m points (NaN for m ≤ 2)."""
    m = len(xs)
    if m < 2 or len(set(xs)) < 2:
        raise ValueError(f"a slope needs at least two distinct x values, got {sorted(set(xs))}")
    xbar, ybar = sum(xs) / m, sum(ys) / m
    sxx = sum((x - xbar) ** 2 for x in xs)
    slope = sum((x - xbar) * (y - ybar) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = ybar - slope * xbar
    if m <= 2:
        return slope, math.nan, intercept
    rss = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, math.sqrt(rss / (m - 2) / sxx), intercept
