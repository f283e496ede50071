r"""Time to precision on real models and real data (issue 18, items 3 and 4).

**Quantity.** Seconds to reach a fixed-subset standard error (``estimand="subset"``: only the
noise counts, the examples are fixed) of :data:`TARGET_SE` = 0.002 on :data:`EXAMPLES` = 256
examples, at a noise level σ fixed per case in :data:`SIGMA` before any run.

**Rule for runs with fixed draws.** A run that took ``t_clean`` seconds for its clean forwards and
``t_perturbed`` for its perturbed ones and reached standard error ``s`` needs
:math:`(s/0.002)^2` times as many perturbed forwards for 0.002 (the variance of a mean of
independent draws falls as 1/forwards), so its time to precision is

.. math::  t_{0.002} = t_\text{clean} + t_\text{perturbed}\,\max\big((s / 0.002)^2,\ 1/R\big) .

The references time ``t_clean`` and ``t_perturbed`` inside their loops. For senslab's fixed-draw
runs ``t_clean`` is a clean forward of the same examples measured separately (one batched forward
at the padded width; per-example calls: one forward per example) and ``t_perturbed`` the rest of
the run, so the run's one-time costs (the trimming check, the checked precisions' calibration,
local and prefix reuse's clean caches) are scaled with the perturbed time: conservative for
senslab where the factor is above 1, in its favour where it is below — as in the README's
records (ResNet-18 0.22 floored to 0.5 at R = 2, GPT-2 0.33 at R = 3, MiniLM 0.65, ViT-small
0.94). On 64 MNIST images at R = 2 (ResNet-18, 2 threads, a loaded machine) a run at one draw
per token took 1.22× the rule's time for senslab's defaults and 1.08× for the paper code. Each
row keeps its factor (``ttp_factor``) and the table says where it was below 1. ``--direct``
removes that bias: each row the rule scales down runs again at the whole draws below what the
target needs (one draw per token where the floor binds) and its time to precision is read
between the two runs (:func:`interpolated_seconds`), its one-time costs paid once, as they are;
the rule's value stays in ``ttp_rule`` and the table prints their ratio. The factor is
floored at one draw per token (:math:`1/R` for a run of R draws): below that the rule would
extrapolate to fractional draws, which only token sampling could realise, at a higher variance.
On 256 examples the floor binds often — 256 × 64 patches at R = 5 reach s ≤ √(¼ / 81,920) ≈
0.0017 whatever the flip rates — so on images the target asks for one draw per patch or fewer.
Adaptive senslab runs
(``target_stderr=0.002``, rounds of 2 draws: the fewest that give a within-token variance and
antithetic pairs) are timed as they run (``ttp_rule`` in the JSON holds the floored rule's
value for them too).

**Methods** (all on the same examples, same threads, in one process, GEMMs interleaved):

* ``naive loop`` — one example at a time, cut to its real length, all its tokens × R draws in one
  forward, plain Monte Carlo (every token, R i.i.d. draws); float32 and bf16 autocast.
* ``paper code`` — the papers' algorithm: every example padded to the longest; for each position
  a batched forward (:data:`PAPER_BATCH` examples × R copies) with that position perturbed in
  every example, padding positions evaluated too (their flips are not counted: padding is no
  token); R = 3 for text, 5 for images; float32 and bf16.
* ``senslab`` — ``token_sensitivity`` with its defaults (R draws, ``precision="auto"``, padding
  trimmed, one batched call), then one factor changed at a time: padding
  (``trim_padding=False``), reuse of the clean computation where the model offers it
  (``reuse_local=False`` / ``reuse_prefix=False``: full forwards; on the CPU, ResNet's local
  copies with direct convolutions instead of Winograd's, ``winograd=False``), precision
  (``"float32"``
  ``"bf16-checked"`` and ``"int8-checked"``), batching
  (one call per example), variance reduction (``target_stderr=0.002`` with 2 draws a round:
  plain, antithetic, control variate, both; the tangent's allocation, a pilot of a quarter
  draw per token and then rounds sized for the target), and token sampling
  (``allocation="uniform"``: a pilot of :data:`SAMPLING_SHARE` of every example's tokens at
  one draw each, a quarter of them two, then rounds to the share the pilot's variance predicts
  for the target — the design that goes below the floor of one draw per token with a
  standard error it can report).
* compilation, only when named in ``--methods``: ``senslab compile=True`` and ``paper code
  float32 compiled`` (the paper code's forwards through ``torch.compile``, so that the ratios
  against the paper code count compilation on both sides). Compiling is timed as part of the run:
  the paper code's in its clean forwards (not extrapolated), senslab's in its perturbed time
  (scaled with it by the rule above, which favours that row).

Both references draw their noise from the stream senslab draws from (same seed, same
example-major order), so with float32 their flips equal senslab's float32 flips up to rounding at
a decision boundary; the run prints how many examples differ and whether every method's estimate
agrees with the naive loop's within its interval, and checks that senslab's float32 flips and
its bf16-checked and int8-checked ones are identical.

**Throughput.** Model FLOPs per forward at the lengths each method evaluates
(``torch.utils.flop_counter``, attention through the math backend; a copy resumed from the clean
prefix the FLOPs its own ``forward_suffix`` does, counted per real length and token,
:func:`suffix_shares`; one evaluated by local reuse its windows and the rest of the model,
counted on one image, :func:`local_copy_flops`; a static int8 copy a whole forward),
achieved FLOP/s of the run (not the extrapolation) and its fraction of the float32 and the bf16
GEMM peaks (square :data:`GEMM_N`² products of every dtype, measured between the methods of every
case). Where a target is missed, its bounds include two ceilings (:func:`ceilings`): the ratio
each senslab row would reach with every FLOP at 100% of its unit's measured peak, and the
fewest-FLOP row's on the fastest unit the machine has, in that unit's own decisions; and for
a model whose local copies run a softmax (ViT-small), the bf16 peak fraction no bf16 forward
of it can pass: each copy's FLOPs at the bf16 peak beside its softmax values
(:func:`local_copy_softmax`) at the bf16 softmax rate measured after the rows
(:func:`softmax_rate`).
``--recount RECORD`` counts an earlier record's FLOPs this way and writes them back.

    python benchmarks/real_models.py --threads 2 --out benchmarks/results/real-2threads.json
    python benchmarks/real_models.py --quick --threads 1    # 8 sentences, 2 images: smoke run
    python benchmarks/real_models.py --cases minilm gpt2    # a subset of the cases
    python benchmarks/real_models.py --device cuda          # on a GPU (float32 without TF32)
    python benchmarks/real_models.py --export-offline DIR   # what the cases read, for a machine
                                                            # without the packages (gpu_session.sh)

**Allocation ceiling** (``--ceiling R``, untimed): the naive loop with R draws per token, and
from its flips the fewest forwards any allocation of draws over tokens could reach the target
with (:func:`allocation_ceiling`): how much "draws where flips happen" could gain on the case at
best, beside the GEMM rate and the exact cuts.

``--quick`` and ``--examples n`` ask for s.e. 0.002·√(256/n), the same draws per token. Runtime
(every row runs once): ``--quick`` ~10 min on one loaded core; the full run several hours on 2
cores, most of it ViT-small's and MiniLM's fixed-draw rows (256 × 64 patches × 5 draws of a
0.9 GFLOP forward per row), so run it one case at a time (``--cases``) if needed.

Cases and their training: :mod:`_real` (MiniLM and its fitted head; the zoo's GPT-2 and
ViT-small with random-init bodies and fitted last layers; ResNet-18 trained briefly on MNIST;
cached under ``~/.cache/senslab-bench``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import machine  # noqa: E402
from _real import RealCase, export_offline, gpt2_case, image_case, minilm_case  # noqa: E402

from senslab.measure import TokenSensitivity, token_sensitivity  # noqa: E402
from senslab.measure._int8 import StaticInt8  # noqa: E402
from senslab.measure._noise import NoiseStream  # noqa: E402
from senslab.measure._precision import _clock as now  # noqa: E402
from senslab.tokens.base import call_model, select  # noqa: E402

# -- fixed before any run ----------------------------------------------------------------------
EXAMPLES = 256
QUICK_EXAMPLES = {"text": 8, "image": 2}  #: --quick: a smoke run of every row
TARGET_SE = 0.002
SEED = 0
#: noise standard deviation per case (text: on the embedding LayerNorm's output; images: on
#: pixels in [−1, 1])
SIGMA = {"minilm": 1.0, "gpt2": 1.0, "vit_small": 1.5, "resnet18": 1.5}
CASES = ["minilm", "vit_small", "resnet18", "gpt2"]
TRANSFORMERS = ("minilm", "vit_small", "gpt2")
PAPER_BATCH = 64  #: examples per forward of the paper code (× R copies)
ADAPTIVE_REPEATS = 2  #: draws per token and round of the adaptive runs (pairs for antithetic)
GEMM_N = {"full": 2048, "quick": 1024}
GEMM_N_GPU = 8192  #: a GPU's peak needs a larger product
#: issue 18, item 4
TARGET_VS_NAIVE = {"minilm": 4.0}
TARGET_VS_PAPER = {"vit_small": 3.0, "resnet18": 3.0}
TARGET_BF16_GEMM = 0.40

#: mean units per token of the allocation rows' first round (later rounds sized for the target)
ALLOCATION_BUDGET = 0.25
#: share of every example's tokens in the uniform-sampling row's pilot round (and the least
#: each later round adds)
SAMPLING_SHARE = 1 / 16

VARIANCE_REDUCTION = {
    "adaptive plain": {},
    "adaptive antithetic": {"antithetic": True},
    "adaptive control variate": {"control_variate": "linear"},
    "adaptive cv + antithetic": {"antithetic": True, "control_variate": "linear"},
    # draws where the tangent says flips happen: a pilot of a quarter draw per token, then
    # rounds sized for the target
    "adaptive allocation": {"repeats": 1, "allocation": "linear", "budget": ALLOCATION_BUDGET},
    "adaptive allocation autocast=bf16": {"repeats": 1, "allocation": "linear",
                                          "budget": ALLOCATION_BUDGET,
                                          "autocast": torch.bfloat16},
    # float32's decisions from checked bf16 whatever "auto"'s timed judgement (which can fall
    # either side of its threshold on the allocation's small rounds)
    "adaptive allocation bf16-checked": {"repeats": 1, "allocation": "linear",
                                         "budget": ALLOCATION_BUDGET,
                                         "precision": "bf16-checked"},
    "adaptive allocation + antithetic": {"repeats": 2, "antithetic": True,
                                         "allocation": "linear", "budget": ALLOCATION_BUDGET},
    # a share of every example's tokens, one draw each (a quarter two): a pilot of a sixteenth
    # of the tokens, then the share its variance predicts; below one draw per token where that
    # is all the target needs
    "adaptive uniform sampling": {"repeats": 1, "allocation": "uniform",
                                  "budget": SAMPLING_SHARE},
    # the same under bf16's own decisions, as the references' bf16 rows decide
    "adaptive uniform sampling autocast=bf16": {"repeats": 1, "allocation": "uniform",
                                                "budget": SAMPLING_SHARE,
                                                "autocast": torch.bfloat16},
}


# -- estimator arithmetic ----------------------------------------------------------------------


def stratified(flips: list[Tensor]) -> tuple[float, float, Tensor]:
    """Estimate, fixed-subset standard error and per-example rates from per-example (K_b, R)
    flip indicators (every real token, R ≥ 2 draws each): the mean over examples of each
    example's mean, with :math:`\\mathrm{Var}(\\hat m_b) = K_b^{-2} \\sum_t s^2_{bt}/R`
    (the formula senslab uses for the same design)."""
    per_sample = torch.stack([f.double().mean() for f in flips])
    if min(f.shape[1] for f in flips) < 2:  # one draw (a ``--direct`` run): no such variance
        return float(per_sample.mean()), math.nan, per_sample
    var = sum(float(f.double().var(dim=1).sum()) / (f.shape[1] * f.shape[0] ** 2) for f in flips)
    return float(per_sample.mean()), math.sqrt(var) / len(flips), per_sample


def seconds_to_precision(t_clean: float, t_perturbed: float, se: float,
                         target: float = TARGET_SE, draws: float | None = None) -> float:
    """Time to ``target`` of a run with fixed draws (module docstring): perturbed forwards scale
    as 1/s², but never below one draw per token when the run made ``draws`` per token (every
    token is still evaluated once). A run without any flip (s = 0) and no ``draws`` costs
    ``t_clean``."""
    factor = (se / target) ** 2
    if draws:
        factor = max(factor, 1.0 / draws)
    return t_clean + t_perturbed * factor


def target_for(n: int) -> float:
    """The standard error asked of ``n`` examples: :data:`TARGET_SE` at :data:`EXAMPLES`, scaled
    by √(EXAMPLES/n) for other counts (``--quick``, ``--examples``), so that the draws per token
    it takes stay those of the 256-example measurement."""
    return TARGET_SE * math.sqrt(EXAMPLES / n)


def time_to_precision(row: dict[str, Any], target: float) -> tuple[float, float]:
    """(seconds to ``target``, the rule's value): the rule for runs with fixed draws; adaptive
    runs as they ran, unless they stopped at their forward cap above the target."""
    rule = seconds_to_precision(row["t_clean"], row["t_perturbed"], row["se"], target,
                                row["draws"])
    return (row["seconds"] if row["adaptive"] and row["se"] <= target else rule), rule


def agree(a: float, sa: float, b: float, sb: float) -> tuple[bool, float]:
    """Whether two estimates agree within their 95% intervals (|a − b| ≤ 1.96·√(sa² + sb²))."""
    scale = math.hypot(sa, sb)
    z = abs(a - b) / scale if scale > 0 else (0.0 if a == b else math.inf)
    return z <= 1.96, z


def allocation_ceiling(flips: list[Tensor], target: float) -> dict[str, float]:
    r"""The fewest perturbed forwards any allocation of draws over tokens could reach ``target``
    with, from per-example (K_b, R) flip indicators of many draws (R ≥ 2).

    The estimate is :math:`\sum_{bt} w_{bt}\,\hat p_{bt}` with :math:`w_{bt} = 1/(n K_b)`. A design
    that gives token :math:`bt` an expected :math:`e_{bt}` draws (fewer than one: drawn with that
    probability and weighted by its inverse) has variance at least
    :math:`\sum w^2_{bt} v_{bt}/e_{bt}`, :math:`v = p(1-p)` (below one draw the inclusion adds
    :math:`p^2(1/e - 1)`). For a total :math:`E` this is smallest at :math:`e \propto w\sqrt v`
    (Neyman), where it is :math:`(\sum w\sqrt v)^2/E`: an *oracle* that knew every token's flip
    probability needs :math:`E = (\sum w \sqrt v)^2/s^2` forwards for standard error :math:`s`.
    Against it: equal draws for every token (stratified, as the references and senslab's fixed
    runs; never below one draw per token) and ``num_tokens``-style uniform token sampling within
    each example (variance :math:`\sum_b m_b(1-m_b)/(n^2 K_b e)` at ``e`` draws per token on
    average, below one draw per token too).

    :math:`v_{bt}` is estimated by :math:`\hat p(1-\hat p)\,R/(R-1)` (unbiased); its square root
    is biased low (Jensen), and a token that never flipped in R draws counts as one that never
    can, so the oracle's forwards come out too few and ``gain_over_stratified`` too large: an
    upper bound. ``gain_jeffreys`` takes instead the posterior mean of :math:`\sqrt{p(1-p)}`
    under a Beta(½, ½) prior, which credits every token with some chance to flip (too much for
    tokens that never can): a lower estimate of the same oracle. ``gain_example_oracle``: an
    oracle that knows only each example's mean within-token variance :math:`\bar v_b` (well
    estimated: K_b·R draws) and gives all tokens of an example the same draws, needing
    :math:`(\sum_b \sqrt{\bar v_b})^2/(n^2 s^2)` forwards.

    These three leave out the inclusion term below one draw per token, which is what makes an
    allocation hard where the floor binds: a token that flips often and is drawn with
    probability e < 1 adds :math:`w^2 p^2 (1/e - 1)`. The ``*_inclusion`` fields count it
    (:func:`fewest_draws`): the fewest forwards of an oracle by token (plug-in, an upper bound on
    the gain; and with the Beta(½, ½) posterior means of p and p(1 − p)), by example (plug-in
    sums, well estimated), and of equal draws that go below one per token by drawing every token
    with the same probability (Horvitz–Thompson). Their gains are against the same floored equal
    draws as the others. ``equal_reported_draws_per_token``: the same design with one draw per
    drawn token cannot estimate :math:`p^2`, so the standard error it reports (senslab's
    allocation rule: :math:`\bar v^2/\pi^2` per drawn token) is too large by
    :math:`\sum w^2 p^2`; it reports the target at :math:`e = \sum w^2 p / s^2` (above 1 the
    design does not apply). ``*_reported``: the oracles by token and by example restricted to
    designs that can report their standard error without that excess where it matters — below
    one draw per token a single draw and the conservative :math:`\bar v^2/\pi^2`, otherwise at
    least two draws per token (an unbiased within-token variance)."""
    n = len(flips)
    tokens = sum(f.shape[0] for f in flips)
    draws = flips[0].shape[1]
    w2v = wsv = wsj = example = uniform = 0.0
    by_token: list[tuple[Tensor, ...]] = []  # (size, w², Σv, Σp) of every token or example
    by_jeffreys: list[tuple[Tensor, ...]] = []
    by_ex: list[tuple[float, ...]] = []
    for f in flips:
        k, r = f.shape
        hits = f.double().sum(1)
        p = hits / r
        v = p * (1 - p) * r / (r - 1)
        w = 1.0 / (n * k)
        one = torch.ones_like(p)
        by_token.append((one, one * w * w, v, p))
        a, b = hits + 0.5, r - hits + 0.5  # Beta posterior: E p and E p(1 − p)
        by_jeffreys.append((one, one * w * w, a * b / ((a + b) * (a + b + 1)), a / (a + b)))
        by_ex.append((float(k), w * w, float(v.sum()), float(p.sum())))
        w2v += float((w * w * v).sum())
        wsv += float((w * v.sqrt()).sum())
        wsj += w * sum(_jeffreys_sqrt(int(h), r) for h in hits.tolist())
        example += math.sqrt(float(v.mean())) / n
        m = float(p.mean())
        uniform += m * (1 - m) / (n * n * k)
    s2 = target * target
    stratified = tokens * max(w2v / s2, 1.0)  # equal draws per token, at least one each
    oracle = wsv * wsv / s2
    jeffreys, by_example = wsj * wsj / s2, example * example / s2
    token_groups, jeffreys_groups = (tuple(torch.cat(x) for x in zip(*g, strict=True))
                                     for g in (by_token, by_jeffreys))
    example_groups = tuple(torch.tensor(x, dtype=torch.float64) for x in zip(*by_ex, strict=True))
    w2p = (token_groups[1] * token_groups[3]).sum().reshape(1)
    # one group of every token, drawn alike: its weighted variance terms add up
    equal_group = (torch.tensor([float(tokens)]), torch.ones(1), torch.tensor([w2v]), w2p)
    needed = {"oracle_inclusion": fewest_draws(*token_groups, s2),
              "jeffreys_inclusion": fewest_draws(*jeffreys_groups, s2),
              "example_oracle_inclusion": fewest_draws(*example_groups, s2),
              "equal_inclusion": fewest_draws(*equal_group, s2),
              "oracle_reported": fewest_draws(*token_groups, s2, reported=True),
              "example_oracle_reported": fewest_draws(*example_groups, s2, reported=True)}
    # drawn alike with probability e, once: the standard error a one-draw design can report
    # (senslab's allocation: v̄²/π² per drawn token, over by p²) reaches s² at e = Σw²p/s²
    extra: dict[str, float] = {"equal_reported_draws_per_token": float(w2p) / s2}
    for key, draws_needed in needed.items():
        extra[f"{key}_draws_per_token"] = draws_needed / tokens
        extra[f"gain_{key}"] = stratified / draws_needed if draws_needed > 0 else math.inf
    return {"draws": float(draws), "tokens": float(tokens), "target_se": target,
            "se_one_draw": math.sqrt(w2v), "stratified_draws_per_token": stratified / tokens,
            "uniform_sampling_draws_per_token": uniform / s2,
            "oracle_draws_per_token": oracle / tokens,
            "gain_over_stratified": stratified / oracle if oracle > 0 else math.inf,
            "gain_uniform_sampling": stratified / (uniform / s2 * tokens) if uniform > 0
            else math.inf,
            "oracle_jeffreys_draws_per_token": jeffreys / tokens,
            "gain_jeffreys": stratified / jeffreys,
            "example_oracle_draws_per_token": by_example / tokens,
            "gain_example_oracle": stratified / by_example if by_example > 0 else math.inf,
            "never_flipped": sum(int((f.sum(1) == 0).sum()) for f in flips) / tokens,
            **extra}


def fewest_draws(size: Tensor, c: Tensor, a: Tensor, s: Tensor, s2: float,
                 reported: bool = False) -> float:
    r"""The fewest draws :math:`\sum_g K_g e_g` over groups g (tokens, or the tokens of an
    example, which share their expected draws per token :math:`e_g`) for which the variance
    :math:`\sum_g c_g V_g(e_g)` reaches ``s2``, where :math:`c_g` is the squared weight of a
    token, :math:`a_g = \sum v` and :math:`s_g = \sum p` over the group's tokens, and

    .. math::  V_g(e) = a_g / e \ (e \ge 1), \qquad V_g(e) = s_g / e - (s_g - a_g)\ (e < 1):

    below one draw a token is drawn with probability e, once, and weighted by 1/e
    (Horvitz–Thompson); both pieces are lower bounds for fractional draws (Jensen), so the result
    is a lower bound on the forwards. Convex in each :math:`e_g`, so a Lagrange multiplier found by
    bisection gives the optimum: :math:`e = \sqrt{\lambda c a / K}` where that is ≥ 1, else
    :math:`\sqrt{\lambda c s / K}` where that is ≤ 1, else 1. A group that never flipped
    (``s`` = 0) gets no draws.

    ``reported``: the variance a design can *report* — :math:`V_g(e) = s_g/e` for e ≤ 1 (one
    draw per drawn token, the conservative estimate) and :math:`a_g/e` for e ≥ 2 (two draws or
    more; between 1 and 2 not allowed). Each group takes the branch of smaller Lagrangian, so
    the multiplier's bisection finds a feasible plan on the convex hull (near the optimum)."""
    ca, cs = c * a, c * s

    def plan(lam: float) -> tuple[Tensor, float]:
        if reported:
            e1 = (lam * cs / size).sqrt().clamp(max=1.0)
            e2 = (lam * ca / size).sqrt().clamp(min=2.0)
            v1 = torch.where(cs > 0, cs / e1.clamp(min=1e-300), torch.zeros_like(e1))
            v2 = ca / e2
            first = size * e1 + lam * v1 <= size * e2 + lam * v2
            return torch.where(first, e1, e2), float(torch.where(first, v1, v2).sum())
        hi = (lam * ca / size).sqrt()
        lo = (lam * cs / size).sqrt()
        e = torch.where(hi >= 1, hi, torch.where(lo <= 1, lo, torch.ones_like(lo)))
        safe = e.clamp(min=1e-300)
        var = torch.where(e >= 1, ca / safe, torch.where(cs > 0, cs / safe - (cs - ca),
                                                          torch.zeros_like(e)))
        return e, float(var.sum())

    if float(cs.sum()) <= 0:
        return 0.0
    lo_l, hi_l = 1e-30, 1.0
    while plan(hi_l)[1] > s2:
        hi_l *= 4.0
    for _ in range(200):
        mid = math.sqrt(lo_l * hi_l)
        if plan(mid)[1] > s2:
            lo_l = mid
        else:
            hi_l = mid
    return float((size * plan(hi_l)[0]).sum())


def _jeffreys_sqrt(hits: int, draws: int) -> float:
    """Posterior mean of √(p(1−p)) after ``hits`` flips in ``draws`` under a Beta(½, ½) prior:
    B(a + ½, b + ½)/B(a, b) with a = hits + ½, b = draws − hits + ½."""
    a, b = hits + 0.5, draws - hits + 0.5
    lg = math.lgamma
    return math.exp(lg(a + 0.5) + lg(b + 0.5) - lg(a + b + 1) - lg(a) - lg(b) + lg(a + b))


# -- references --------------------------------------------------------------------------------


class _TokenNoise:
    """Forward hook on the token module: adds ``delta`` (copies, T, D) to its output."""

    def __init__(self) -> None:
        self.delta: Tensor | None = None
        self.dim = 0

    def __call__(self, module: nn.Module, args: Any, out: Tensor) -> Tensor | None:
        self.dim = out.shape[-1]
        return None if self.delta is None else out + self.delta.to(out.dtype)


@contextmanager
def token_noise(case: RealCase) -> Iterator[_TokenNoise]:
    hook = _TokenNoise()
    handle = None
    if case.kind == "text":
        module = case.tokens.module  # type: ignore[attr-defined]
        handle = case.model.get_submodule(module).register_forward_hook(hook)
    try:
        yield hook
    finally:
        if handle is not None:
            handle.remove()


def token_dim(case: RealCase) -> int:
    """Entries of one token's noise vector (text: the token module's width; images: C·p²)."""
    if case.kind == "image":
        p = case.tokens.size  # type: ignore[attr-defined]
        return case.inputs.shape[1] * p * p  # type: ignore[union-attr]
    with token_noise(case) as hook, torch.inference_mode():
        call_model(case.model, select(case.inputs, torch.tensor([0])))
    return hook.dim


def _precision(bf16: bool, device: torch.device) -> Any:
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()


def _stream(seed: int, dim: int, device: torch.device) -> NoiseStream:
    """The noise stream senslab draws from for an int seed: a generator on the model's device."""
    return NoiseStream(torch.Generator(device=device).manual_seed(seed), dim, device)


def _classes(case: RealCase, inputs: Any) -> Tensor:
    return call_model(case.model, inputs).argmax(-1)


def _perturbed(case: RealCase, inputs: Any, tok: Tensor, noise: Tensor,
               hook: _TokenNoise) -> Any:
    """Copies of ``inputs`` (already one row per copy) with ``noise[i]`` on token ``tok[i]``."""
    if case.kind == "text":
        width = inputs["input_ids"].shape[1]
        delta = torch.zeros(len(tok), width, noise.shape[1], device=noise.device)
        delta[torch.arange(len(tok), device=tok.device), tok] = noise
        hook.delta = delta
        return inputs
    p = case.tokens.size  # type: ignore[attr-defined]
    n, c, h, w = inputs.shape
    v = inputs.clone().view(n, c, h // p, p, w // p, p)
    rows = torch.arange(n, device=tok.device)
    v[rows, :, tok // (w // p), :, tok % (w // p), :] += noise.view(n, c, p, p)
    return v.view(n, c, h, w)


def _example(case: RealCase, b: int) -> Any:
    """Example ``b`` alone, cut to its real length (text)."""
    one = select(case.inputs, torch.tensor([b]))
    if case.kind == "text":
        k = int(case.lengths[b])
        one = {key: v[:, :k] for key, v in one.items()}
    return one


def _expand(inputs: Any, copies: int) -> Any:
    if isinstance(inputs, dict):
        return {k: v.expand(copies, *v.shape[1:]) for k, v in inputs.items()}
    return inputs.expand(copies, *inputs.shape[1:])


def naive_loop(case: RealCase, seed: int = SEED, bf16: bool = False,
               repeats: int | None = None,
               observe: Callable[[int, Tensor], None] | None = None) -> dict[str, Any]:
    """One example at a time at its real length; its K tokens × R draws in one forward
    (``repeats``: R, default the case's). The row keeps the flips (``flips``: per example
    (K, R)). ``observe(b, noise)``: called with each example's noise (K·R rows, token-major)
    after its clean forward and before its perturbed one."""
    r, dim, dev = repeats or case.repeats, token_dim(case), case.device
    stream = _stream(seed, dim, dev)
    flips, t_clean, t_pert, forwards = [], 0.0, 0.0, 0
    with token_noise(case) as hook, torch.inference_mode(), _precision(bf16, dev):
        for b in range(case.n):
            start = now(dev)
            one = _example(case, b)
            k = int(case.lengths[b])
            hook.delta = None
            clean = _classes(case, one)
            mid = now(dev)
            noise = stream.take(k * r).mul_(case.sigma)
            if observe is not None:
                observe(b, noise)
            tok = torch.arange(k, device=dev).repeat_interleave(r)
            copies = _perturbed(case, _expand(one, k * r), tok, noise, hook)
            flips.append((_classes(case, copies) != clean).view(k, r))
            hook.delta = None
            t_clean += mid - start
            t_pert += now(dev) - mid
            forwards += 1 + k * r
    row = _reference_row(case, "naive loop", bf16, flips, t_clean, t_pert, forwards, r)
    row["flips"] = flips
    return row


def paper_code(case: RealCase, seed: int = SEED, bf16: bool = False,
               compiled: bool = False) -> dict[str, Any]:
    """All examples at the padded width; per position, batched forwards with that position
    perturbed in every example (padding positions too). ``compiled``: the forwards through
    ``torch.compile(model)`` (its compilation counted in the clean forwards' time)."""
    if compiled:
        case = dataclasses.replace(case, model=torch.compile(case.model))
    r, dim, n, width = case.repeats, token_dim(case), case.n, case.width
    lengths, dev = case.lengths, case.device
    with token_noise(case) as hook, torch.inference_mode(), _precision(bf16, dev):
        start = now(dev)
        clean = torch.cat([_classes(case, select(case.inputs, idx))
                           for idx in torch.arange(n).split(PAPER_BATCH)])
        mid = now(dev)
        # the stream's rows in senslab's example-major order; padding positions get zero noise
        stream = _stream(seed, dim, dev)
        noise = torch.zeros(n, width, r, dim, device=dev)
        for b in range(n):
            k = int(lengths[b])
            noise[b, :k] = stream.take(k * r).mul_(case.sigma).view(k, r, dim)
        flips = torch.zeros(n, width, r, dtype=torch.bool, device=dev)
        for t in range(width):
            for i in range(0, n, PAPER_BATCH):
                idx = torch.arange(i, min(n, i + PAPER_BATCH))
                copies = select(case.inputs, idx.repeat_interleave(r))
                tok = torch.full((len(idx) * r,), t, device=dev)
                copies = _perturbed(case, copies, tok, noise[idx, t].reshape(-1, dim), hook)
                out = _classes(case, copies)
                flips[idx, t] = (out != clean[idx].repeat_interleave(r)).view(len(idx), r)
                hook.delta = None
        t_pert = now(dev) - mid
    per = [flips[b, : int(lengths[b])] for b in range(n)]
    row = _reference_row(case, "paper code", bf16, per, mid - start, t_pert,
                         n + n * width * r, r)
    if compiled:
        row["precision"] += ", compiled"
    return row


def _reference_row(case: RealCase, method: str, bf16: bool, flips: list[Tensor],
                   t_clean: float, t_pert: float, forwards: int,
                   draws: int) -> dict[str, Any]:
    flips = [f.cpu() for f in flips]
    est, se, per_sample = stratified(flips)
    return {"method": method, "precision": "bf16" if bf16 else "float32", "estimate": est,
            "se": se, "forwards": forwards, "seconds": t_clean + t_pert, "t_clean": t_clean,
            "t_perturbed": t_pert, "adaptive": False, "draws": draws,
            "per_sample": per_sample}


# -- senslab ------------------------------------------------------------------------------------


def clean_seconds(case: RealCase, per_example: bool) -> float:
    """A clean float32 forward of every example: one batched call, or one call per example."""
    with torch.inference_mode():
        call_model(case.model, select(case.inputs, torch.arange(min(case.n, 4))))  # warm
        start = now(case.device)
        if per_example:
            for b in range(case.n):
                call_model(case.model, select(case.inputs, torch.tensor([b])))
        else:
            for idx in torch.arange(case.n).split(PAPER_BATCH):
                call_model(case.model, select(case.inputs, idx))
        return now(case.device) - start


#: what a row's ``work_per_example`` counts in (:func:`copies_per_example`); a record without
#: it counted a row that kept its padding as whole forwards of the padded width
WORK_UNIT = "forwards at the example's real length"


@contextmanager
def copies_per_example(case: RealCase, trimmed: bool = True,
                       first: list[int] | None = None) -> Iterator[Tensor]:
    """Tally, per example, the perturbed text copies a senslab row evaluates and the work they
    cost: a (2, n) float64 tensor, row 0 the copies, row 1 their work in forwards at the
    example's real length (:data:`WORK_UNIT`; 1 for a whole copy, or the padded width's forward
    over the real length's where the row keeps its padding, ``trimmed=False``; for a copy
    resumed from its clean prefix, prefix reuse, its counted FLOPs over a forward's,
    :func:`suffix_shares`: the suffix it recomputes, up to the last real token whether or not
    the padding is kept, and in the last block only the row the head reads). Row 1 is complete
    when the context exits (the copies are tallied per token during the run and weighed after
    it, so the counting is not timed). ``first``: a one-element list holding the index of the
    first example of the batch being measured (a row that calls ``update`` once per example
    sets it before each call), so that every copy is tallied to its own example. The control's
    gradient pass, whose noise requires a gradient, and the checks of the copies' code path
    (noiseless, and the few noisy copies that check reuse against full forwards) are not
    copies. Instrumentation only: an allocation's draws favour some examples, and prefix reuse
    recomputes suffixes, so FLOPs are counted where the copies went, not as if every copy were
    a whole forward of mean length."""
    from senslab.tokens.embedding import _BoundEmbedding

    n = case.n
    first = first if first is not None else [0]
    tally = torch.zeros(2, n, dtype=torch.float64)
    whole = torch.zeros(n, dtype=torch.float64)  # copies evaluated as whole forwards
    resumed = torch.zeros(n, case.width, dtype=torch.float64)  # copies per (example, token)
    original = _BoundEmbedding.forward_perturbed

    def tallied(bound: Any, src: Tensor, tok: Tensor | None, noise: Tensor,
                **kw: Any) -> Tensor:
        if tok is not None and not noise.requires_grad and bool(noise.any()) \
                and not getattr(bound, "verifying", False):
            s = src.cpu() + first[0]
            tally[0].add_(torch.bincount(s, minlength=n).double()[:n])
            if bound.reuse:
                resumed.index_put_((s, tok.cpu()), torch.ones(len(s), dtype=torch.float64),
                                   accumulate=True)
            else:
                whole.add_(torch.bincount(s, minlength=n).double()[:n])
        return original(bound, src, tok, noise, **kw)

    _BoundEmbedding.forward_perturbed = tallied  # type: ignore[method-assign]
    try:
        yield tally
    finally:
        _BoundEmbedding.forward_perturbed = original  # type: ignore[method-assign]
    lengths = case.lengths.tolist()
    if trimmed:
        tally[1].add_(whole)
    elif whole.any():  # a whole copy that keeps its padding runs at the padded width
        fl = flops_by_length(case)
        tally[1].add_(whole * torch.tensor([fl[case.width] / fl[k] for k in lengths],
                                           dtype=torch.float64))
    if resumed.any():
        shares = suffix_shares(case)
        for b, k in enumerate(lengths):
            tally[1, b] += float(resumed[b, :k] @ torch.tensor(shares[k], dtype=torch.float64))


def suffix_shares(case: RealCase) -> dict[int, list[float]]:
    """For a model that resumes copies from their clean prefix (``prefix_cache`` and
    ``forward_suffix``): per real length k of the case, the FLOPs of one copy perturbed at each
    token t < k (``forward_suffix`` of that copy, counted by :func:`_count`) over a forward's at
    length k, on the case's longest example cut to k tokens. Counted once per case (kept on
    it)."""
    known = getattr(case, "_suffix_shares", None)
    if known is not None:
        return known
    model, fl = case.model, flops_by_length(case)
    module = dict(model.named_modules())[model.prefix_module]
    longest = select(case.inputs, case.lengths.argmax().view(1))
    zero = torch.zeros(1, dtype=torch.long, device=case.device)
    shares = {}
    for k in sorted(set(case.lengths.tolist())):
        inputs = {key: v[:, :k] for key, v in longest.items()}
        seen: list[Tensor] = []
        handle = module.register_forward_hook(lambda m, a, out, seen=seen: seen.append(out))
        try:
            with torch.inference_mode():
                call_model(model, inputs)
        finally:
            handle.remove()
        with torch.inference_mode():
            cache = model.prefix_cache(seen[0], inputs)
        noise = torch.full((1, seen[0].shape[-1]), case.sigma, device=case.device)
        shares[k] = [_count(lambda t=t, cache=cache, noise=noise: model.forward_suffix(
            cache, zero, torch.full((1,), t, device=case.device), noise))[0] / fl[k]
            for t in range(k)]
    case._suffix_shares = shares  # type: ignore[attr-defined]
    return shares


def senslab_row(case: RealCase, method: str, options: dict[str, Any], t_clean: float,
                per_example: bool = False) -> dict[str, Any]:
    """``token_sensitivity`` (or one ``update`` per example) with ``options``; adaptive when
    ``target_stderr`` is among them. ``t_clean``: the clean forwards' share of the run (module
    docstring), the rest counts as perturbed."""
    options = dict(options)
    tokens = options.pop("tokens", case.tokens)  # a row that changes the tokens' own options
    switches = options.pop("model", {})  # a row that sets the model's own switches
    common = {"sigma": case.sigma, "estimand": "subset", "generator": SEED, **options}
    first = [0]  # the example a per-example call measures, for the tally
    tally = (copies_per_example(case, options.get("trim_padding", True), first)
             if case.kind == "text" else nullcontext(None))
    with tally as counts, model_switches(case.model, switches):
        start = now(case.device)
        metric = TokenSensitivity(case.model, tokens, **common)
        if per_example:
            for b in range(case.n):
                first[0] = b
                metric.update(select(case.inputs, torch.tensor([b])))
        else:
            metric.update(case.inputs)  # what token_sensitivity does
        res = metric.compute()
        seconds = now(case.device) - start
    checked = res.recheck_fraction is not None
    precision = precision_label(metric.checked_precision, res.recheck_fraction,
                                options.get("autocast"))
    # whether its copies ran whole in a static int8 copy of the model (:func:`flop_parts`)
    static = metric.checked_precision == "int8" and metric._check._static is not None
    return {"method": method, "precision": precision, "estimate": res.estimate,
            "static_int8": static,
            "se": res.stderr_subset, "forwards": res.num_forward,
            "forwards_fp32": res.num_forward_fp32, "seconds": seconds, "t_clean": t_clean,
            "t_perturbed": max(seconds - t_clean, 0.0), "adaptive": "target_stderr" in options,
            "draws": (res.num_forward - case.n * (2 if _gradient_pass(options) else 1))
            / float(case.lengths.sum()),
            "checked": checked, "options": {k: str(v) for k, v in options.items()},
            "model": switches,
            "tokens": repr(tokens),
            "control_variate": _gradient_pass(options),
            "per_sample": res.per_sample.double().cpu(), "per_position": _cpu(res.per_position),
            **({} if counts is None else {"copies_per_example": counts[0].tolist(),
                                          "work_per_example": counts[1].tolist(),
                                          "work_unit": WORK_UNIT})}


@contextmanager
def model_switches(model: nn.Module, switches: dict[str, Any]) -> Iterator[None]:
    """``model``'s attributes set to ``switches`` (e.g. ``{"winograd": False}``) while active,
    then restored."""
    before = {k: getattr(model, k) for k in switches}
    try:
        for k, v in switches.items():
            setattr(model, k, v)
        yield
    finally:
        for k, v in before.items():
            setattr(model, k, v)


def ran_winograd(case: RealCase, row: dict[str, Any], recorded: bool = True) -> bool:
    """Whether ``row``'s local-reuse copies ran the model's Winograd convolutions
    (``ResNet.winograd``): on where the model has the switch, unless the row turned it off;
    ``recorded``: whether the record's code had it (records before it ran direct convolutions)."""
    return (recorded and getattr(case.model, "winograd", False)
            and row.get("model", {}).get("winograd", True))


def _cpu(x: Any) -> Any:
    return x.cpu() if isinstance(x, Tensor) else x


def precision_label(low: str | None, recheck: float | None, autocast: Any = None) -> str:
    """What the copies ran in: float32, a checked precision and its re-checked share, or
    float32 after ``"auto"``'s timed calibration found that checking would not pay; under
    ``autocast=`` its precision, with its own decisions."""
    if autocast is not None:
        return f"{str(autocast).removeprefix('torch.').replace('bfloat16', 'bf16')} (autocast)"
    if low is None:
        return "float32"
    if low == "float32":
        return "float32 (auto's timed calibration judged checking not to pay)"
    return f"{low}-checked ({100 * (recheck or 0.0):.1f}% re-checked)"


def _gradient_pass(options: dict[str, Any]) -> bool:
    """Whether the run spends a forward and backward pass per example on the tangent."""
    return "control_variate" in options or options.get("allocation") == "linear"


def senslab_methods(case: RealCase, target: float) -> list[tuple[str, dict[str, Any], bool]]:
    """(label, options, per-example calls) of the senslab rows, defaults first."""
    r = {"repeats": case.repeats}
    rows = [("senslab defaults", r, False)]
    if case.kind == "text":
        rows.append(("senslab trim_padding=False", {**r, "trim_padding": False}, False))
    # the clean computation reused, or not, where the model implements the reuse
    for field, hook in (("reuse_local", "forward_local"), ("reuse_prefix", "forward_suffix")):
        if getattr(case.tokens, field, False) and hasattr(case.model, hook):
            rows.append((f"senslab {field}=False",
                         {**r, "tokens": dataclasses.replace(case.tokens, **{field: False})},
                         False))
    rows += [("senslab precision=float32", {**r, "precision": "float32"}, False),
             # local reuse's Winograd convolutions (ResNet) against direct ones, same precision
             *([("senslab precision=float32 winograd=False",
                 {**r, "precision": "float32", "model": {"winograd": False}}, False)]
               if getattr(case.model, "winograd", False) and case.device.type == "cpu"
               else []),
             ("senslab precision=bf16-checked", {**r, "precision": "bf16-checked"}, False),
             *([("senslab precision=int8-checked", {**r, "precision": "int8-checked"}, False)]
               if case.device.type == "cpu" else []),  # int8 products: a CPU's
             # bf16's own decisions, as the references' bf16 rows: what checking costs
             ("senslab autocast=bf16", {**r, "autocast": torch.bfloat16}, False),
             ("senslab per-example calls", r, True),
             ("senslab compile=True", {**r, "compile": True}, False)]
    for label, extra in VARIANCE_REDUCTION.items():
        rows.append((f"senslab {label}", {"repeats": ADAPTIVE_REPEATS,
                                          "target_stderr": target, **extra}, False))
    return rows


# -- throughput -----------------------------------------------------------------------------------


def gemm_flops(n: int, dtype: torch.dtype, reps: int = 3,
               device: torch.device | None = None) -> float:
    """FLOP/s (int8: operations/s) of an n×n @ n×n product in ``dtype`` on ``device`` (median of
    ``reps`` after a warm-up)."""
    device = device or torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    if dtype == torch.int8:  # int8 × int8 → int32 (VNNI where the CPU has it)
        a = torch.randint(-127, 128, (n, n), generator=g, dtype=torch.int8).to(device)
        b = torch.randint(-127, 128, (n, n), generator=g, dtype=torch.int8).to(device)

        def product() -> Any:
            return torch._int_mm(a, b)
    else:
        a = torch.randn(n, n, generator=g).to(device, dtype)
        b = torch.randn(n, n, generator=g).to(device, dtype)

        def product() -> Any:
            return a @ b
    return 2 * n**3 / _median_seconds(product, reps, device)


def _median_seconds(fn: Any, reps: int, device: torch.device) -> float:
    """The median time of ``reps`` calls of ``fn`` after a warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        start = now(device)
        fn()
        times.append(now(device) - start)
    return statistics.median(times)


def _count(fn: Any) -> tuple[float, Any]:
    """Model FLOPs of ``fn()`` (attention counted as its matrix products) and its result."""
    with sdpa_kernel(SDPBackend.MATH), torch.inference_mode(), \
            FlopCounterMode(display=False) as counter:
        out = fn()
    return float(counter.get_total_flops()), out


def flops_by_length(case: RealCase) -> dict[int, float]:
    """Model FLOPs of one forward of one example at each real length of the case (and at the
    padded width)."""
    if case.kind == "image":
        return {case.width: _count(lambda: case.model(case.inputs[:1]))[0]}
    longest = select(case.inputs, case.lengths.argmax().view(1))
    return {int(k): _count(lambda k=k: call_model(
                case.model, {key: v[:, :k] for key, v in longest.items()}))[0]
            for k in sorted({*case.lengths.tolist(), case.width})}


def _per_added_copy(case: RealCase, count: Any,
                    switches: dict[str, Any] | None = None) -> tuple[Any, int] | None:
    """What ``count(fn) -> (amount, result)`` measures of the copies local reuse adds on the
    first image between two draws per patch and one, and how many copies those are; None for a
    case whose tokens do not reuse the clean computation. The difference is exact, whatever the
    clean work (its caches, the clean forward) costs."""
    if (case.kind != "image" or not getattr(case.tokens, "reuse_local", False)
            or not hasattr(case.model, "forward_local")):
        return None
    x = case.inputs[:1]
    with model_switches(case.model, switches or {}):
        (a1, one), (a2, two) = [count(lambda r=r: token_sensitivity(
            case.model, x, case.tokens, sigma=case.sigma, repeats=r, precision="float32",
            generator=SEED)) for r in (1, 2)]
    return a2 - a1, two.num_forward - one.num_forward


def local_copy_flops(case: RealCase, switches: dict[str, Any] | None = None) -> float | None:
    """Model FLOPs of one perturbed copy as local reuse evaluates it (``forward_local``: the
    windows a patch reaches, then the rest of the model; with the model's ``switches`` set, e.g.
    ``{"winograd": False}``), for an image case whose tokens reuse the clean computation
    (:func:`_per_added_copy`); None for other cases."""
    added = _per_added_copy(case, _count, switches)
    return None if added is None else added[0] / added[1]


def local_copy_counts(case: RealCase) -> tuple[float | None, float | None]:
    """:func:`local_copy_flops` as the model runs local copies by default, and with its Winograd
    convolutions off (ResNet's ``winograd`` switch; the same count for a model without it)."""
    local = local_copy_flops(case)
    if not getattr(case.model, "winograd", False):
        return local, local
    return local, local_copy_flops(case, {"winograd": False})


class _SoftmaxCount(TorchDispatchMode):
    """While active, counts the values every softmax runs on (``aten.softmax``, ``_softmax``
    and its ``out`` variant, ``_safe_softmax``: whichever the call reaches the mode as; what it
    calls inside runs below the mode, so nothing is counted twice) by the length of the rows it
    normalises."""

    OPS = frozenset({"softmax", "_softmax", "_safe_softmax"})

    def __init__(self) -> None:
        super().__init__()
        self.values: Counter[int] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        packet = getattr(func, "overloadpacket", None)
        if getattr(packet, "__name__", None) in self.OPS:
            x, dim = args[0], args[1] if len(args) > 1 else kwargs.get("dim", -1)
            self.values[int(x.shape[dim])] += x.numel()
        return func(*args, **kwargs)


def _count_softmax(fn: Any) -> tuple[Counter[int], Any]:
    """The softmax values ``fn()`` runs, by row length (:class:`_SoftmaxCount`, attention
    through the math backend, as :func:`_count`), and its result."""
    with sdpa_kernel(SDPBackend.MATH), torch.inference_mode(), _SoftmaxCount() as mode:
        out = fn()
    return mode.values, out


def local_copy_softmax(case: RealCase) -> dict[str, float] | None:
    """The softmax values one perturbed copy evaluated by local reuse runs (counted as
    :func:`local_copy_flops` counts its FLOPs, :func:`_per_added_copy`) and the row length most
    of them have (``keys``); None for a case without local reuse or without a softmax."""
    added = _per_added_copy(case, _count_softmax)
    if added is None or not added[0]:  # Counter subtraction: the values the added copies ran
        return None
    extra, copies = added
    return {"values": sum(extra.values()) / copies,
            "keys": float(max(extra, key=lambda k: extra[k]))}


def softmax_rate(keys: int, dtype: torch.dtype, device: torch.device | None = None,
                 reps: int = 5) -> float:
    """Values per second of ``torch.softmax`` over rows of ``keys`` values in ``dtype`` (about
    2M values a call, the median of ``reps`` calls after a warm-up)."""
    device = device or torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(max(1, (1 << 21) // keys), keys, generator=g).to(device, dtype)
    return x.numel() / _median_seconds(lambda: x.softmax(-1), reps, device)


def _whole_low_copies(case: RealCase, row: dict[str, Any]) -> bool:
    """Whether ``row``'s low-precision copies were whole forwards: checked int8 on a
    convolutional model may run a static int8 copy of it (its float32 re-checks reuse
    locally)."""
    if "static_int8" in row:  # recorded by the run
        return bool(row["static_int8"])
    return (row["precision"].startswith("int8-checked") and case.kind == "image"
            and StaticInt8.applies(case.model))  # a record made before it was


def flop_parts(case: RealCase, row: dict[str, Any], fl: dict[int, float],
               local: float | None = None, local_low: float | None = None) -> dict[str, float]:
    """Model FLOPs of the forwards ``row`` made, each at the length it was evaluated at, in
    parts: ``clean`` (the clean forwards, and for a tangent the forward and backward pass),
    ``copies`` (the perturbed copies in the row's own precision) and ``rechecks`` (the copies a
    checked precision evaluated again in float32). ``local``: :func:`local_copy_flops` of an image
    case, for the copies local reuse evaluated (None: each counted as a whole forward);
    ``local_low``: the same for copies in the row's low precision, where it differs (default
    ``local``)."""
    lengths = case.lengths.tolist()
    n, r, full = case.n, case.repeats, fl[case.width]
    real = sum(k * fl[k] for k in lengths)  # one copy of every real token at its own length
    if row["method"] == "naive loop":
        return {"clean": sum(fl[k] for k in lengths), "copies": r * real, "rechecks": 0.0}
    if row["method"] == "paper code":
        return {"clean": n * full, "copies": n * full * case.width * r, "rechecks": 0.0}
    clean = n * (2 if row["control_variate"] else 1)
    copies = row["forwards"] - clean
    trimmed = case.kind == "text" and "trim_padding" not in row["options"]
    per_copy = real / sum(lengths) if trimmed else full
    reused = local is not None and "reuse_local=False" not in row.get("tokens", "")
    if reused:
        per_copy = local
    tally = row.get("copies_per_example")
    work = row.get("work_per_example") or tally  # records before prefix reuse was tallied
    # a row that kept its padding is counted from its tally only where the tally says it
    # weighed the padded width (WORK_UNIT); earlier records counted its copies whole, at full
    # width, even those resumed from their clean prefix
    counted = trimmed or row.get("work_unit") == WORK_UNIT
    if counted and tally is not None and sum(tally) > 0:
        # where the copies went (an allocation favours short sentences), each at its length
        # and for the share of it recomputed (prefix reuse)
        per_copy = sum(w * fl[k] for w, k in zip(work, lengths, strict=True)) / sum(tally)
    own = sum(fl[k] for k in lengths) if trimmed else n * full
    grads = 3 * own if row["control_variate"] else 0.0  # forward + backward per example
    low_copy = per_copy
    if reused:
        low_copy = full if _whole_low_copies(case, row) else (
            local if local_low is None else local_low)
    return {"clean": n * full + grads, "copies": copies * low_copy,
            "rechecks": row["forwards_fp32"] * per_copy}


def row_flops(case: RealCase, row: dict[str, Any], fl: dict[int, float],
              local: float | None = None) -> float:
    """Model FLOPs of the forwards ``row`` made (:func:`flop_parts`, summed)."""
    return sum(flop_parts(case, row, fl, local).values())


def count_row(case: RealCase, row: dict[str, Any], fl: dict[int, float], local: float | None,
              peaks: dict[str, float], direct: float | None = None,
              recorded: bool = True) -> None:
    """Set ``row``'s FLOPs (:func:`flop_parts` and their sum), its FLOP rate and that rate's
    fractions of the float32 and bf16 GEMM ``peaks``. ``local``: a local copy's FLOPs as the
    model runs it by default, ``direct``: with its Winograd convolutions off (default
    ``local``), for the copies that ran them (:func:`ran_winograd`: float32 ones only)."""
    direct = local if direct is None else direct
    f32 = local if ran_winograd(case, row, recorded) else direct
    low = f32 if row_unit(row) == "float32" else direct  # bf16/int8 convolutions: direct
    row["flop_parts"] = flop_parts(case, row, fl, f32, low)
    row["flops"] = sum(row["flop_parts"].values())
    row["flop_rate"] = row["flops"] / row["seconds"]
    row["fraction_fp32_gemm"] = row["flop_rate"] / peaks["float32"]
    row["fraction_bf16_gemm"] = row["flop_rate"] / peaks["bf16"]


# -- one case -------------------------------------------------------------------------------------


def case_runs(case: RealCase, target: float, t_batched: float,
              t_single: float) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """(label, run) of every method on ``case`` at its draws per token (``case.repeats``);
    ``t_batched`` / ``t_single``: the clean forwards' seconds of senslab's batched and
    per-example rows (:func:`clean_seconds`)."""
    runs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("naive loop float32", lambda: naive_loop(case)),
        ("naive loop bf16", lambda: naive_loop(case, bf16=True)),
        ("paper code float32", lambda: paper_code(case)),
        ("paper code bf16", lambda: paper_code(case, bf16=True)),
        ("paper code float32 compiled", lambda: paper_code(case, compiled=True)),
    ]
    for label, opts, single in senslab_methods(case, target):
        runs.append((label, lambda o=opts, s=single, lab=label: senslab_row(
            case, lab, o, t_single if s else t_batched, s)))
    return runs


def direct_plan(repeats: int, factor: float) -> tuple[float, int] | None:
    """(draws per token the target needs, the whole draws to time a run at) for a fixed-draw row
    of ``repeats`` draws whose rule factor is ``factor``; ``None`` where the rule scales up
    (factor ≥ 1: its one-time costs counted more often than they are paid, against senslab) or
    there are no fewer whole draws to run."""
    needed = repeats * factor
    low = max(1, math.floor(needed + 1e-9))
    if factor >= 1.0 or low >= repeats:
        return None
    return needed, low


def interpolated_seconds(needed: float, low: int, t_low: float, repeats: int,
                         t_repeats: float) -> float:
    """Seconds at ``needed`` draws per token from whole runs at ``low`` and ``repeats`` draws
    (straight between them: one-time costs are in both runs, so they are paid once)."""
    return t_low + (needed - low) / (repeats - low) * (t_repeats - t_low)


def measure_case(case: RealCase, gemm_n: int, reps: int = 1, log: Any = print,
                 target: float | None = None,
                 methods: list[str] | None = None, direct: bool = False) -> dict[str, Any]:
    """Every method on ``case`` (``reps`` rounds, order rotated, GEMMs of both dtypes between
    methods; medians of times), then ratios, FLOP rates and the agreement checks. ``target``:
    the standard error asked for (default :func:`target_for` the case's examples);
    ``methods``: only these rows (by label) beside the float32 references. ``direct``: every
    fixed-draw row the rule scales down (:func:`direct_plan`) is run again at the whole draws
    below what the target needs, and its time to precision is interpolated between the two runs
    (:func:`interpolated_seconds`) instead of the rule's scaling of the whole perturbed time."""
    target = target or target_for(case.n)
    t_batched, t_single = clean_seconds(case, False), clean_seconds(case, True)
    runs = case_runs(case, target, t_batched, t_single)
    if methods is not None:
        runs = keep_methods(runs, methods)
    else:
        runs = [(label, fn) for label, fn in runs if label not in OPT_IN]
    gemm: dict[str, list[float]] = {"float32": [], "bf16": [], "fp16": [], "int8": []}
    samples: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in runs}
    # warm-up (allocator, auto-precision probe); on a GPU every example, so that the kernels
    # of every trimmed width are chosen before the first timed row (the H200 record of
    # 2026-11-30 predates this: its first senslab row, "senslab defaults", paid for them)
    warm = case.n if case.device.type == "cuda" else min(case.n, 2)
    token_sensitivity(case.model, select(case.inputs, torch.arange(warm)), case.tokens,
                      sigma=case.sigma)
    failed: dict[str, str] = {}
    for rep in range(reps):
        order = runs[rep % len(runs):] + runs[: rep % len(runs)]
        for label, fn in order:
            for key, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16),
                               ("fp16", torch.float16), ("int8", torch.int8)):
                gemm[key].append(gemm_flops(gemm_n, dtype, device=case.device))
            if label in failed:
                continue
            try:
                row = fn()
            except Exception as err:  # one row's failure must not lose the case's other rows
                if label in REFERENCES:
                    raise
                failed[label] = f"{type(err).__name__}: {err}"
                log(f"  {case.name} {label}: FAILED {failed[label]}")
                continue
            row["ttp"], row["ttp_rule"] = time_to_precision(row, target)
            samples[label].append(row)
            log(f"  {case.name} {label}: {row['estimate']:.4f} ± {row['se']:.4f}, "
                f"{row['seconds']:.1f} s, to {target:.4f}: {row['ttp']:.1f} s")
    peaks = {k: statistics.median(v) for k, v in gemm.items()}
    fl = flops_by_length(case)
    cuts = (vit_exact_cuts(case.model, case.inputs) if case.kind == "image"
            else encoder_exact_cuts(case, fl))
    local, direct_flops = local_copy_counts(case)
    soft = local_copy_softmax(case)
    if soft is not None and local is not None:  # what the softmax alone bounds (:func:`targets`)
        soft["flops"] = local
        soft["rate_bf16"] = softmax_rate(int(soft["keys"]), torch.bfloat16, case.device)
    rows = []
    for label, _ in runs:
        if label in failed:
            continue
        row = merge_reps(samples[label])
        row["ttp_factor"] = None if row["adaptive"] else max(
            (row["se"] / target) ** 2, 1.0 / row["draws"] if row["draws"] else 0.0)
        row["label"] = label
        rows.append(row)
    if direct:
        time_directly(case, rows, target, t_batched, t_single, reps, log, failed)
    for row in rows:
        count_row(case, row, fl, local, peaks, direct_flops)
    result = finish_case(case, rows, peaks, fl, target, cuts, local, soft)
    return {**result, "failed": failed, "winograd": bool(getattr(case.model, "winograd", False)),
            "gflop_per_local_copy_direct": None if direct_flops is None else direct_flops / 1e9}


def time_directly(case: RealCase, rows: list[dict[str, Any]], target: float, t_batched: float,
                  t_single: float, reps: int, log: Any, failed: dict[str, str]) -> None:
    """The ``direct`` timing of :func:`measure_case`: each row the rule scales down runs again
    at fewer whole draws (``reps`` times, the median kept); its ``ttp`` becomes the interpolated
    seconds, ``ttp_rule`` keeps the rule's, ``direct`` holds the run (draws needed, draws run,
    their seconds). A row whose run at fewer draws fails keeps the rule's time, said in
    ``failed``."""
    plans = {}
    for row in rows:
        plan = None if row["adaptive"] else direct_plan(case.repeats, row["ttp_factor"])
        if plan is not None:
            plans.setdefault(plan[1], []).append((row, plan[0]))
    for low, planned in sorted(plans.items()):
        fewer = dict(case_runs(dataclasses.replace(case, repeats=low), target, t_batched,
                               t_single))
        for row, needed in planned:
            label = row["label"]
            try:
                seconds = statistics.median(fewer[label]()["seconds"] for _ in range(reps))
            except Exception as err:  # the row keeps the rule's time, and says why
                failed[f"{label} at {low} draws"] = f"{type(err).__name__}: {err}"
                log(f"  {case.name} {label} at {low} draws: FAILED {err}")
                continue
            row["ttp"] = interpolated_seconds(needed, low, seconds, case.repeats,
                                              row["seconds"])
            row["direct"] = {"draws_needed": needed, "draws": low, "seconds": seconds}
            log(f"  {case.name} {label} at {low} draws: {seconds:.1f} s; at {needed:.2f}: "
                f"{row['ttp']:.1f} s (the rule: {row['ttp_rule']:.1f} s)")


def merge_reps(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from a method's repetitions: the first's numbers (estimate, s.e., forwards: the
    same noise every time) with the median of their seconds and times to precision. A row whose
    repetitions ran in different precisions (``precision="auto"`` judges from timings, which
    a loaded machine moves) keeps each one's precision and seconds (``precision_by_rep``,
    ``seconds_by_rep``): its median then mixes them, and the table says so."""
    row = dict(samples[0])
    for key in ("seconds", "ttp", "ttp_rule"):
        row[key] = statistics.median(s[key] for s in samples)
    if len({s["precision"] for s in samples}) > 1:
        row["precision_by_rep"] = [s["precision"] for s in samples]
        row["seconds_by_rep"] = [s["seconds"] for s in samples]
    return row


def vit_exact_cuts(model: nn.Module, x: Tensor) -> dict[str, float] | None:
    """The exact cuts of a CLS-readout ViT (the zoo's ViT-small) per perturbed copy, as fractions
    of its forward FLOPs. Taken by its local reuse (``forward_local``): the last block's rows
    other than CLS (``last_block_beyond_cls``: nothing reads them; the CLS row computed alone
    must equal the full block's, else an error) and the first block's query/key/value rows of
    the tokens the perturbed patch does not reach (``first_block_rows``; measured: the rows of
    the tokenizer's output that change). Not taken: the query–key pairs among those tokens and
    their A·V terms (``first_block_pairs``), which the fused attention kernel cannot skip.
    ``bound_taken`` / ``bound``: the speed-up the taken cuts / all of them would give at this
    FLOP rate. None for other models."""
    from senslab.models.vit import ViTSmall

    if not isinstance(model, ViTSmall) or model.blocks[0].attn.kind != "softmax":
        return None
    x = x[:1]
    total, _ = _count(lambda: model(x))
    with torch.inference_mode():
        tok = model.tokenizer(x)
        side = math.isqrt(tok.shape[1])
        patch = x.shape[-1] // side
        r0 = (side // 2) * patch  # a patch away from the border: the most tokens it reaches
        bumped = x.clone()
        bumped[..., r0:r0 + patch, r0:r0 + patch] += 1.0
        changed = int((model.tokenizer(bumped) != tok).any(-1).sum())
        t = torch.cat([model.cls.expand(1, -1, -1), tok], dim=1) + model.pos
        first_in = t
        for block in model.blocks[:-1]:
            t = block(t)
    last = model.blocks[-1]
    f_last, full = _count(lambda: last(t))
    f_cls, cls = _count(lambda: last.forward_first_row(t))
    if not torch.allclose(cls, full[:, :1], rtol=1e-4, atol=1e-5):
        raise RuntimeError("the CLS row computed alone differs from the full last block's: "
                           "the cut is not exact for this model, so it is not counted")
    first = model.blocks[0]
    f_qkv, _ = _count(lambda: first.attn.qkv(first.ln1(first_in)))
    n = first_in.shape[1]
    f_proj, _ = _count(lambda: first.attn.out(torch.zeros(1, n, first.attn.out[0].in_features,
                                                           device=x.device)))
    f_mlp, _ = _count(lambda: first.mlp(first_in))
    f_block, _ = _count(lambda: first(first_in))
    f_attention = f_block - f_qkv - f_proj - f_mlp  # the two products Q·Kᵀ and A·V
    kept = (n - changed) / n
    last_cut = (f_last - f_cls) / total
    rows_cut, pairs_cut = f_qkv * kept / total, f_attention * kept**2 / total
    return {"flops": total, "tokens": float(n), "changed_tokens": float(changed),
            "last_block_beyond_cls": last_cut, "first_block_rows": rows_cut,
            "first_block_pairs": pairs_cut, "bound_taken": 1.0 / (1.0 - last_cut - rows_cut),
            "bound": 1.0 / (1.0 - last_cut - rows_cut - pairs_cut),
            # local reuse then runs every block on fused weights (no K/V projections), which
            # these fractions do not count; its first block updates the clean rows of the
            # tokens not reached (Attention._forward_reached), taking both first-block cuts
            "fused": float(model.blocks[0].attn.fused() is not None)}


def encoder_exact_cuts(case: RealCase, fl: dict[int, float]) -> dict[str, Any] | None:
    r"""The exact cuts of a bidirectional encoder whose every output row is read (MiniLM with
    mean pooling), per perturbed copy, as a fraction of the FLOPs of one copy of every real
    token at its length (``fl``: :func:`flops_by_length`). A perturbed token changes every
    position from the first layer's attention on, so only the first layer has work to spare;
    counted for the :math:`K - 1` tokens not perturbed:

    * ``first_layer_rows``: their query, key and value rows (the clean ones);
    * ``first_layer_pairs``: their query–key products and the mixing of their values
      (:math:`(K-1)^2` of :math:`K^2` pairs): a row's new softmax differs from the clean one
      only by its weight on the perturbed key and a common factor, so its mix is the clean mix
      less that key's share, rescaled, plus the new share of the perturbed value;
    * ``first_layer_projection``: their output projection, through the clean mixes projected
      head by head ahead of time; each row then recombines its heads' scaled projections
      (:math:`4 h d` FLOPs a row for :math:`h` heads of width :math:`d`, subtracted).

    ``bound``: the speed-up all of them would give at this FLOP rate. None for a model that is
    not a BERT-style encoder (``bert.encoder.layer``)."""
    model = getattr(case.model, "bert", None)
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if case.kind != "text" or layers is None:
        return None
    first = layers[0]
    attn = first.attention.self
    width = attn.query.in_features
    heads = attn.num_attention_heads

    def flops(fn: Any, k: int, width: int = width) -> float:
        return _count(lambda: fn(torch.zeros(1, k, width, device=case.device)))[0]

    total = rows = pairs = proj = 0.0
    for k, copies in Counter(case.lengths.tolist()).items():  # one copy per real token
        copies *= k
        f_q = sum(flops(m, k) for m in (attn.query, attn.key, attn.value))
        f_out = flops(first.attention.output.dense, k)
        f_ffn = (flops(first.intermediate.dense, k)
                 + flops(first.output.dense, k, first.output.dense.in_features))
        f_layer = flops(lambda h: first(h)[0], k)
        f_pairs = f_layer - f_q - f_out - f_ffn  # the two products Q·Kᵀ and A·V
        kept = (k - 1) / k
        total += copies * fl[k]
        rows += copies * f_q * kept
        pairs += copies * f_pairs * kept**2
        proj += copies * max(f_out * kept - (k - 1) * 4 * heads * width, 0.0)
    cut = {"first_layer_rows": rows / total, "first_layer_pairs": pairs / total,
           "first_layer_projection": proj / total}
    return {**cut, "kind": "encoder", "bound": 1.0 / (1.0 - sum(cut.values()))}


#: rows every run keeps: the ratios and the agreement checks are taken against them
REFERENCES = ("naive loop float32", "paper code float32")
#: rows that run only when named in --methods: torch.compile on both sides (compiling costs
#: minutes on a small CPU, counted in the time to precision). The compiled paper code is a
#: "paper code" row, so the ratios against the paper code then count the faster of the two.
OPT_IN = ("paper code float32 compiled", "senslab compile=True")


def keep_methods(runs: list[tuple[str, Any]], methods: list[str]) -> list[tuple[str, Any]]:
    """The references and the rows named in ``methods``; an unknown name is an error that lists
    the known ones."""
    labels = [label for label, _ in runs]
    unknown = [m for m in methods if m not in labels]
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; this case has: {labels}")
    return [(label, fn) for label, fn in runs if label in REFERENCES or label in methods]


def finish_case(case: RealCase, rows: list[dict[str, Any]], peaks: dict[str, float],
                fl: dict[int, float], target: float,
                cuts: dict[str, Any] | None = None,
                local: float | None = None,
                softmax: dict[str, float] | None = None) -> dict[str, Any]:
    """Ratios against the fastest row of each reference, the agreement checks, the targets
    (``cuts``: :func:`vit_exact_cuts` or :func:`encoder_exact_cuts` of the case's model, where
    it has them; ``local``: :func:`local_copy_flops`; ``softmax``: :func:`local_copy_softmax`
    with the copy's FLOPs and the measured bf16 softmax rate)."""
    best = {m: min(r["ttp"] for r in rows if r["method"] == m)
            for m in ("naive loop", "paper code")}
    for r in rows:
        r["vs_naive"] = best["naive loop"] / r["ttp"] if r["ttp"] > 0 else math.inf
        r["vs_paper"] = best["paper code"] / r["ttp"] if r["ttp"] > 0 else math.inf
    by = {r["label"]: r for r in rows}
    base = by["naive loop float32"]
    checks: dict[str, Any] = {"agree": {}}
    for r in rows:
        ok, z = agree(r["estimate"], r["se"], base["estimate"], base["se"])
        checks["agree"][r["label"]] = {"ok": ok, "z": z}
    f32 = by.get("senslab precision=float32")
    for low in ("bf16", "int8"):
        other = by.get(f"senslab precision={low}-checked")
        if f32 is not None and other is not None:
            checks[f"{low}_checked_identical"] = bool(
                torch.equal(f32["per_sample"], other["per_sample"])
                and torch.equal(f32["per_position"].nan_to_num(-1),
                                other["per_position"].nan_to_num(-1)))
    if f32 is not None:  # same noise stream: per-example rates equal up to boundary rounding
        for ref in ("naive loop float32", "paper code float32"):
            diff = (by[ref]["per_sample"] - f32["per_sample"]).abs()
            # a single flip moves an example's rate by at least 1/(K·R)
            checks[f"{ref} vs senslab: examples differing"] = int((diff > 1e-6).sum())
    lengths = case.lengths.double()
    return {"case": case.name, "kind": case.kind, "examples": case.n, "target_se": target,
            "sigma": case.sigma,
            "repeats": case.repeats, "width": case.width, "mean_length": float(lengths.mean()),
            "info": case.info, "gemm_gflops": {k: v / 1e9 for k, v in peaks.items()},
            "gflop_per_forward": {str(k): v / 1e9 for k, v in fl.items()},
            "gflop_per_local_copy": None if local is None else local / 1e9,
            "rows": rows, "checks": checks, "exact_cuts": cuts, "softmax": softmax,
            "targets": targets(case.name, rows, peaks, cuts, softmax)}


def row_unit(row: dict[str, Any]) -> str:
    """The unit a row's perturbed copies ran on: ``"bf16"`` (autocast, checked bf16, a
    reference's bf16 row), ``"int8"`` (checked int8) or ``"float32"``."""
    precision = row["precision"]
    if precision.startswith("int8-checked"):
        return "int8"
    return "bf16" if precision.startswith(("bf16", "bfloat16")) else "float32"


def ceiling_seconds(row: dict[str, Any], peaks: dict[str, float],
                    unit: str | None = None) -> float:
    """Seconds ``row``'s FLOPs (:func:`flop_parts`) would take at 100% of the ``peaks``: its
    copies on its own unit (:func:`row_unit`; ``unit`` instead, where given: that precision's own
    decisions, nothing re-checked), a checked row's clean work and float32 re-checks at the
    float32 peak (an unchecked row's clean work on its own unit)."""
    parts = row.get("flop_parts") or {"clean": 0.0, "copies": row["flops"], "rechecks": 0.0}
    own = peaks[unit or row_unit(row)]
    # a checked row's clean forwards are float32's; an unchecked row's run as its copies do
    clean = peaks["float32"] if unit is not None or "checked" in row["precision"] else own
    return (parts["clean"] + parts["rechecks"]) / clean + parts["copies"] / own


def ceilings(rows: list[dict[str, Any]], peaks: dict[str, float], key: str) -> list[str]:
    """The ratio (``key``: ``"vs_naive"`` or ``"vs_paper"``) each senslab row would reach if its
    every FLOP ran at its unit's peak (the reference as measured), and the fewest-FLOP row's on
    the fastest unit the machine has, in that unit's own decisions. A unit's peak is its square
    GEMM's rate, or the best rate a row reached running on it alone, if higher (convolutions
    and fused products can beat the GEMM)."""
    ours = [r for r in rows if r["method"].startswith("senslab") and r["seconds"] > 0]
    if not ours:
        return []
    # a convolution or a fused product may beat the square GEMM: a unit runs at least as fast
    # as any row that ran on it alone did (a checked row's rate mixes two units)
    peaks = dict(peaks)
    for r in rows:
        if r["seconds"] > 0 and "checked" not in r["precision"]:
            unit = row_unit(r)
            peaks[unit] = max(peaks[unit], r["flops"] / r["seconds"])
    at_peak = ", ".join(f"{r['label']} {r[key] * r['seconds'] / ceiling_seconds(r, peaks):.2f}×"
                        for r in ours)
    units = [u for u in ("float32", "bf16", "int8") if peaks.get(u, 0.0) > 0]
    fastest = max(units, key=lambda u: peaks[u])
    least = min(ours, key=lambda r: r["flops"] * r["ttp"] / r["seconds"])  # to the target
    whole = least[key] * least["seconds"] / ceiling_seconds(least, peaks, fastest)
    rates = ", ".join(f"{u} {peaks[u] / 1e9:.0f}" for u in units)
    return [f"ceiling, every FLOP of a row at its unit's peak (the GEMM's, or the best rate a "
            f"row reached on that unit alone: {rates} G/s; its copies in its own precision, a "
            f"checked row's clean work and float32 re-checks at the fp32 peak): {at_peak}",
            f"ceiling on the fastest unit ({fastest}, {peaks[fastest] / 1e9:.0f} G/s), its own "
            f"decisions, nothing re-checked: {least['label']}'s {least['flops'] / 1e9:.1f} GFLOP "
            f"at its peak, {whole:.2f}×"]


def targets(name: str, rows: list[dict[str, Any]], peaks: dict[str, float],
            cuts: dict[str, Any] | None = None,
            softmax: dict[str, float] | None = None) -> list[dict]:
    """Item 4's targets for this case; where one is missed, what bounds it (``softmax``: a
    local copy's softmax values, FLOPs and the measured bf16 softmax rate, for the ceiling the
    softmax alone sets on the bf16 peak fraction)."""
    out = []
    ours = [r for r in rows if r["method"].startswith("senslab")]
    if not ours:  # a run of the references only (--methods): nothing of ours to hold to a target
        return out
    best = min(ours, key=lambda r: r["ttp"])
    adaptive_plain = next((r for r in ours if r["method"] == "senslab adaptive plain"), None)
    bf16_over_fp32 = peaks["bf16"] / peaks["float32"]
    for ref, goal in (("naive loop", TARGET_VS_NAIVE.get(name)),
                      ("paper code", TARGET_VS_PAPER.get(name))):
        if goal is None:
            continue
        ratio = best["vs_naive" if ref == "naive loop" else "vs_paper"]
        fastest = min((r for r in rows if r["method"] == ref), key=lambda r: r["ttp"])
        bounds = [
            f"the {ref} ({fastest['precision']}) runs at "
            f"{100 * fastest['fraction_fp32_gemm']:.0f}% of the fp32 and "
            f"{100 * fastest['fraction_bf16_gemm']:.0f}% of the bf16 GEMM peak",
            f"bf16/fp32 GEMM peak ratio {bf16_over_fp32:.2f}",
            f"fp16/fp32 GEMM peak ratio {peaks.get('fp16', 0.0) / peaks['float32']:.2f}",
            f"int8/fp32 GEMM peak ratio {peaks.get('int8', 0.0) / peaks['float32']:.2f}",
            f"model FLOPs of the runs: {ref} {fastest['flops'] / 1e9:.1f} GFLOP vs senslab's "
            f"best {best['flops'] / 1e9:.1f} GFLOP",
        ]
        if cuts is not None and cuts.get("fused"):
            bounds.append(
                f"exact cuts taken (local reuse): the last block beyond CLS "
                f"{100 * cuts['last_block_beyond_cls']:.1f}% of the FLOPs, and in every block "
                f"the K and V projections (fused query-key and value-output weights; not "
                f"counted here), and in the first block the rows of the tokens the patch does "
                f"not reach, updated from their clean sums for the reached keys: their Q/K/V "
                f"rows {100 * cuts['first_block_rows']:.1f}% and query–key pairs "
                f"{100 * cuts['first_block_pairs']:.1f}% (and their mixing and projection)")
        elif cuts is not None and cuts.get("kind") == "encoder":
            bounds.append(
                f"exact cuts (none taken): in the first layer the tokens not perturbed keep "
                f"their Q/K/V rows {100 * cuts['first_layer_rows']:.1f}%, their query–key "
                f"pairs and value mixing {100 * cuts['first_layer_pairs']:.1f}% and their "
                f"output projection {100 * cuts['first_layer_projection']:.1f}% of the FLOPs "
                f"(rescaled from clean sums): at most {cuts['bound']:.2f}×; every later "
                f"layer sees every position changed")
        elif cuts is not None:
            bounds.append(
                f"exact cuts taken (local reuse): the last block beyond CLS "
                f"{100 * cuts['last_block_beyond_cls']:.1f}% and the first block's Q/K/V rows "
                f"of the tokens the patch does not reach ({cuts['changed_tokens']:.0f} of "
                f"{cuts['tokens']:.0f} change) {100 * cuts['first_block_rows']:.1f}% of the "
                f"FLOPs, at most {cuts['bound_taken']:.2f}×; not taken: their query–key pairs "
                f"{100 * cuts['first_block_pairs']:.1f}%, at most "
                f"{cuts['bound'] / cuts['bound_taken']:.2f}× more")
        bounds += ceilings(rows, peaks, "vs_naive" if ref == "naive loop" else "vs_paper")
        if adaptive_plain is not None:
            bounds.append(f"variance reduction: {adaptive_plain['forwards']:,} forwards (plain "
                          f"adaptive) vs {best['forwards']:,} ({best['method']})")
        out.append({"target": f"≥ {goal:g}× the {ref}", "value": ratio, "ok": ratio >= goal,
                    "best": best["label"], "bounds": bounds})
    if name in TRANSFORMERS:
        top = max(ours, key=lambda r: r["fraction_bf16_gemm"])
        frac = top["fraction_bf16_gemm"]
        if "autocast" in top["options"]:  # bf16 forwards: the float32 ceiling does not bind
            bounds = [f"{top['label']} runs {top['precision']}: its forwards are bf16's, at "
                      f"{100 * frac:.0f}% of the bf16 peak"]
        else:
            bounds = [f"{top['label']} runs {top['precision']}; a float32 forward can reach at "
                      f"most {100 / bf16_over_fp32:.0f}% of the bf16 peak "
                      f"(bf16/fp32 = {bf16_over_fp32:.2f})",
                      f"it reaches {100 * top['fraction_fp32_gemm']:.0f}% of the fp32 peak"]
        plain = [r for r in rows if not r["method"].startswith("senslab")
                 and r["precision"] == "bf16"]
        if plain:  # what plain bf16 reaches on this model's products, in the same run
            bounds.append("the references' bf16 rows reach " + ", ".join(
                f"{100 * r['fraction_bf16_gemm']:.0f}% ({r['method']})" for r in plain))
        if softmax and softmax.get("rate_bf16"):  # a local copy's products at the bf16 peak
            # beside its softmax at the rate measured: no bf16 forward of it can do better
            gemm, soft = softmax["flops"] / peaks["bf16"], softmax["values"] / softmax["rate_bf16"]
            bounds.append(
                f"softmax: {softmax['values'] / 1e3:,.0f}k values a local copy (rows of "
                f"{softmax['keys']:.0f}) at {softmax['rate_bf16'] / 1e9:.2f}G values/s in bf16, "
                f"beside its {softmax['flops'] / 1e6:,.0f} MFLOP at the bf16 peak: at most "
                f"{100 * gemm / (gemm + soft):.0f}% of the peak")
        out.append({"target": f"≥ {100 * TARGET_BF16_GEMM:.0f}% of the bf16 GEMM peak",
                    "value": frac, "ok": frac >= TARGET_BF16_GEMM, "best": top["label"],
                    "bounds": bounds})
    return out


# -- report -------------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    lines = ["| case | method | precision | s.e. | forwards | seconds to precision | "
             "ratio vs naive | ratio vs paper code | % fp32 GEMM | % bf16 GEMM |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["cases"]:
        for r in c["rows"]:
            method = r["label"] + (" (adaptive)" if r["adaptive"] else "")
            lines.append(
                f"| {c['case']} | {method} | {r['precision']} | {r['se']:.4f} | "
                f"{r['forwards']:,} | {r['ttp']:.1f} | {r['vs_naive']:.2f}× | "
                f"{r['vs_paper']:.2f}× | {100 * r['fraction_fp32_gemm']:.0f}% | "
                f"{100 * r['fraction_bf16_gemm']:.0f}% |")
    lines += ["", f"Seconds to a fixed-subset standard error of {TARGET_SE} on {EXAMPLES} "
              "examples (fewer examples: scaled by √(256/n), stated per case); ratios against the "
              "faster (float32 or bf16) row of each reference."]
    for c in result["cases"]:
        g = c["gemm_gflops"]
        lines += ["", f"**{c['case']}** ({c['examples']} examples, target s.e. "
                  f"{c['target_se']:.4f}, σ = {c['sigma']:g}, mean "
                  f"length {c['mean_length']:.1f} of {c['width']}; GEMM {result['gemm_n']}²: "
                  f"fp32 {g['float32']:.0f}, bf16 {g['bf16']:.0f}"
                  + (f", fp16 {g['fp16']:.0f}" if "fp16" in g else "") + " GFLOP/s"
                  + (f", int8 {g['int8']:.0f} GOP/s; " if "int8" in g else "; ")
                  + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in c["info"].items() if k != "trained") + ")"]
        if c.get("gflop_per_local_copy"):
            whole, local = c["gflop_per_forward"][str(c["width"])], c["gflop_per_local_copy"]
            lines.append(f"- local reuse: {local:.3f} GFLOP a copy against {whole:.3f} for a "
                         f"whole forward ({whole / local:.2f}× fewer)")
        lines += [f"- {label}: failed ({err})" for label, err in c.get("failed", {}).items()]
        lines += [f"- {r['label']}: its repetitions ran in different precisions ("
                  + "; ".join(f"{p}: {t:.1f} s" for p, t in zip(r["precision_by_rep"],
                                                                 r["seconds_by_rep"],
                                                                 strict=True))
                  + "): the median mixes them" for r in c["rows"] if "precision_by_rep" in r]
        down = [r["ttp_factor"] for r in c["rows"]
                if (r.get("ttp_factor") or 1.0) < 1.0 and "direct" not in r]
        timed = [r for r in c["rows"] if "direct" in r]
        if timed:
            lines.append("- timed at whole draws and interpolated (`--direct`), the rule's "
                         "seconds over these: " + "; ".join(
                             f"{r['label']} {r['ttp_rule'] / r['ttp']:.3f} ("
                             f"{r['direct']['draws']} draw{'s' if r['direct']['draws'] > 1 else ''}"
                             f" {r['direct']['seconds']:.1f} s, to "
                             f"{r['direct']['draws_needed']:.2f}: {r['ttp']:.1f} s)"
                             for r in timed))
        if down:
            lines.append(f"- fixed-draw rows extrapolated down to {min(down):.2f}–{max(down):.2f}"
                         " of their perturbed time: senslab's one-time costs in its run "
                         "(calibration, clean caches, trimming check) scaled down with its "
                         "copies, in its favour")
        bad = [k for k, v in c["checks"]["agree"].items() if not v["ok"]]
        zmax = max(v["z"] for v in c["checks"]["agree"].values())
        lines.append(f"- estimates agree with the naive loop's within 95% intervals: "
                     f"{'✓ all' if not bad else '✗ ' + ', '.join(bad)} (max |z| {zmax:.2f})")
        for k, v in c["checks"].items():
            if k == "agree":
                continue
            if k.endswith("_checked_identical"):
                low = k.removesuffix("_checked_identical")
                lines.append(f"- senslab float32 and {low}-checked flips identical (same seed): "
                             f"{'✓' if v else '✗'}")
            else:
                lines.append(f"- {k}: {v} of {c['examples']}")
        for t in c["targets"]:
            value = (f"{100 * t['value']:.0f}%" if "GEMM" in t["target"]
                     else f"{t['value']:.2f}×")
            lines.append(f"- target {t['target']}: {value} ({t['best']}) "
                         f"{'✓' if t['ok'] else '✗'}")
            if not t["ok"]:
                lines += [f"  - bound: {b}" for b in t["bounds"]]
    return "\n".join(lines)


def ceiling_case(case: RealCase, draws: int) -> dict[str, Any]:
    """The naive loop with ``draws`` per token and :func:`allocation_ceiling` at the case's
    target, with the per-example flip rates."""
    target = target_for(case.n)
    row = naive_loop(case, repeats=draws)
    return {"case": case.name, "kind": case.kind, "examples": case.n, "sigma": case.sigma,
            "estimate": row["estimate"], "se": row["se"], "forwards": row["forwards"],
            "allocation_ceiling": allocation_ceiling(row["flips"], target),
            "per_sample": row["per_sample"].tolist(), "info": case.info,
            # flips per token (of ``draws``), per example: for other analyses of the same draws
            "flip_counts": [f.sum(1).tolist() for f in row["flips"]]}


def ceiling_markdown(c: dict[str, Any]) -> str:
    a = c["allocation_ceiling"]
    return (f"**{c['case']}** ({c['examples']} examples, σ = {c['sigma']:g}, {a['draws']:.0f} "
            f"draws per token, flip rate {c['estimate']:.4f} ± {c['se']:.4f}): to s.e. "
            f"{a['target_se']:.4f}, equal draws per token need "
            f"{a['stratified_draws_per_token']:.2f} per token (never fewer than 1), uniform "
            f"token sampling {a['uniform_sampling_draws_per_token']:.2f}, an oracle allocation "
            f"{a['oracle_draws_per_token']:.2f}: at most {a['gain_over_stratified']:.2f}× fewer "
            f"forwards than equal draws (with a Beta(½, ½) prior on each token's rate "
            f"{a['gain_jeffreys']:.2f}×; an oracle by example {a['gain_example_oracle']:.2f}×; "
            f"uniform token sampling {a['gain_uniform_sampling']:.2f}×); "
            f"{100 * a['never_flipped']:.1f}% of the tokens never flipped. Counting the "
            f"inclusion variance below one draw per token: an oracle by token "
            f"{a['oracle_inclusion_draws_per_token']:.2f} per token "
            f"(≤ {a['gain_oracle_inclusion']:.2f}×; with the prior "
            f"{a['gain_jeffreys_inclusion']:.2f}×), by example "
            f"{a['example_oracle_inclusion_draws_per_token']:.2f} "
            f"({a['gain_example_oracle_inclusion']:.2f}×), every token drawn alike "
            f"{a['equal_inclusion_draws_per_token']:.2f} "
            f"({a['gain_equal_inclusion']:.2f}×; to report the target with one draw per "
            f"drawn token {a['equal_reported_draws_per_token']:.2f}); designs that can report "
            f"their standard error: an oracle by token {a['oracle_reported_draws_per_token']:.2f} "
            f"(≤ {a['gain_oracle_reported']:.2f}×), by example "
            f"{a['example_oracle_reported_draws_per_token']:.2f} "
            f"({a['gain_example_oracle_reported']:.2f}×)")


def recompute_ceiling(record: Path) -> dict[str, Any]:
    """:func:`allocation_ceiling` again from the per-token flip counts of a ``--ceiling``
    record (the same draws: a token's flips are exchangeable, so its count is all the function
    reads), written back into the record with the date of the recomputation."""
    result = json.loads(record.read_text())
    cases = [c for c in result.get("cases", []) if "flip_counts" in c]
    if not cases:
        raise SystemExit(f"{record} holds no flip counts: pass a record written with --ceiling")
    for c in cases:
        draws = int(c["allocation_ceiling"]["draws"])
        flips = [torch.arange(draws).expand(len(k), draws) < torch.tensor(k).unsqueeze(1)
                 for k in c["flip_counts"]]
        c["allocation_ceiling"] = allocation_ceiling(flips, c["allocation_ceiling"]["target_se"])
        print(ceiling_markdown(c), flush=True)
    result["recomputed"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds")
    result["markdown"] = "\n".join(ceiling_markdown(c) for c in cases)
    return _write_back(result, record)


def _write_back(result: dict[str, Any], record: Path) -> dict[str, Any]:
    """``result`` written over ``record`` (whole, then renamed into place)."""
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=float))
    tmp.replace(record)
    return result


def recount(record: Path) -> dict[str, Any]:
    """The FLOPs of a timed record's rows counted again (:func:`flop_parts`, with local reuse's
    own count, :func:`local_copy_flops`), and from them the FLOP rates and the targets' bounds
    and ceilings, written back into the record with the date of the recount. Each case's model
    is built again (the counts do not depend on its weights); nothing is timed, so the rows'
    seconds, estimates and ratios stay as they ran."""
    result = json.loads(record.read_text())
    cases = [c for c in result.get("cases", []) if c.get("rows")]
    if not cases:
        raise SystemExit(f"{record} holds no timed rows: pass a record written without --ceiling")
    for c in cases:
        case = dataclasses.replace(make_case(c["case"], c["examples"]), repeats=c["repeats"])
        fl, (local, direct) = flops_by_length(case), local_copy_counts(case)
        peaks = {k: v * 1e9 for k, v in c["gemm_gflops"].items()}
        recorded = bool(c.get("winograd", False))  # records before it ran direct convolutions
        for row in c["rows"]:
            count_row(case, row, fl, local, peaks, direct, recorded)
        c["gflop_per_local_copy"] = None if local is None else (
            local if recorded else direct) / 1e9
        c["gflop_per_local_copy_direct"] = None if direct is None else direct / 1e9
        c["targets"] = targets(c["case"], c["rows"], peaks, c.get("exact_cuts"), c.get("softmax"))
    result["recounted"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds")
    result["markdown"] = markdown(result)
    print(result["markdown"], flush=True)
    return _write_back(result, record)


def make_case(name: str, n: int) -> RealCase:
    if name == "minilm":
        return minilm_case(n, SIGMA[name])
    if name == "gpt2":
        return gpt2_case(n, SIGMA[name])
    return image_case(name, n, SIGMA[name])


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if not isinstance(v, Tensor) and k != "flips"}
    out["per_sample"] = row["per_sample"].tolist()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"examples {QUICK_EXAMPLES}, {GEMM_N['quick']}² GEMMs (smoke run)")
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    parser.add_argument("--examples", type=int, default=None,
                        help=f"examples per case (default {EXAMPLES})")
    parser.add_argument("--reps", type=int, default=1, help="rounds of every method")
    parser.add_argument("--methods", nargs="+", default=None, metavar="LABEL",
                        help="only these rows (labels as printed, e.g. 'senslab defaults') "
                        "beside the float32 naive loop and paper code; default: every row")
    parser.add_argument("--gemm-n", type=int, default=None,
                        help=f"side of the peak-rate GEMMs (default {GEMM_N['full']}, "
                        f"{GEMM_N['quick']} with --quick; a smaller one saves minutes where "
                        "bf16 has no fast kernel)")
    parser.add_argument("--repeats", type=int, default=None, metavar="R",
                        help="draws per token of the fixed-draw rows (default: the case's, text 3, "
                        "images 5); at least 2, for the within-token variance. Time to "
                        "precision is extrapolated the same way, so fewer draws only shorten "
                        "the run")
    parser.add_argument("--direct", action="store_true",
                        help="time every fixed-draw row the rule scales down again at the whole "
                        "draws below what the target needs and interpolate (one-time costs paid "
                        "once, not scaled); the rule's value stays in ttp_rule")
    parser.add_argument("--ceiling", type=int, default=None, metavar="R",
                        help="instead of the timed rows: the naive loop with R draws per token "
                        "and the fewest forwards any allocation of draws could reach the "
                        "target with (allocation_ceiling); untimed")
    parser.add_argument("--ceiling-from", type=Path, default=None, metavar="RECORD",
                        help="recompute allocation_ceiling from the flip counts a --ceiling "
                        "record holds (the same draws) and write it back; no model is run")
    parser.add_argument("--recount", type=Path, default=None, metavar="RECORD",
                        help="count a timed record's FLOPs again (local reuse's copies at their "
                        "own cost), then its FLOP rates, bounds and ceilings, and write them "
                        "back; the models are built, nothing is timed")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu",
                        help="e.g. cuda: the cases are built on the CPU, then measured there "
                        "(float32 without TF32; GEMM peaks of that device)")
    parser.add_argument("--export-offline", type=Path, default=None, metavar="DIR",
                        help="write what the cases read (MiniLM, MNIST, Rotten Tomatoes) into DIR "
                        "for a machine without the packages, print the variables to set, stop")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = parser.parse_args(argv)
    if args.export_offline is not None:
        env = export_offline(args.export_offline)
        print(" ".join(f"{k}={v}" for k, v in env.items()))
        return env
    for flag, value in (("--repeats", args.repeats), ("--ceiling", args.ceiling)):
        if value is not None and value < 2:
            raise SystemExit(f"{flag} needs at least 2 draws per token (a within-token variance "
                             f"for the standard error), got {value}")
    if args.ceiling_from is not None:
        return recompute_ceiling(args.ceiling_from)
    if args.recount is not None:
        return recount(args.recount)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    if gpu:  # float32 means float32: no TF32 in matrix products or convolutions
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    mode = "quick" if args.quick else "full"
    gemm_n = args.gemm_n or (GEMM_N_GPU if gpu else GEMM_N[mode])
    result: dict[str, Any] = {
        "host": socket.gethostname(),
        "device": torch.cuda.get_device_name(device) if gpu else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, **machine(),  # the threads as set, read back
        "argv": sys.argv[1:] if argv is None else list(argv),  # the command that wrote it
        "mode": mode, "examples": args.examples, "gemm_n": gemm_n,
        "reps": args.reps, "methods": args.methods, "loadavg_start": os.getloadavg(), "cases": [],
    }
    print(f"torch {torch.__version__}, {args.threads} threads, mode {mode}, load "
          f"{result['loadavg_start']}", flush=True)
    for name in args.cases:
        start = time.perf_counter()
        kind = "text" if name in ("minilm", "gpt2") else "image"
        case = make_case(name, args.examples or (QUICK_EXAMPLES[kind] if args.quick
                                                 else EXAMPLES))
        if args.repeats is not None:
            case = dataclasses.replace(case, repeats=args.repeats)
        if gpu:
            case = case.to(device)
        print(f"{name}: {case.info}", flush=True)
        if args.ceiling:
            result["cases"].append(ceiling_case(case, args.ceiling))
            print(ceiling_markdown(result["cases"][-1]), flush=True)
            out = _write(result, args.out, mode)
            continue
        res = measure_case(case, gemm_n, args.reps,
                           log=lambda s: print(s, flush=True), methods=args.methods,
                           direct=args.direct)
        res["seconds"] = time.perf_counter() - start
        result["cases"].append(res)
        out = _write(result, args.out, mode)  # after every case: a later case may not finish
    print("\n" + result["markdown"])
    print(f"\nwrote {out}")
    return result


def _write(result: dict[str, Any], out: Path | None, mode: str) -> Path:
    """The results so far as JSON (written whole, then renamed into place)."""
    result["loadavg_end"] = os.getloadavg()
    result["markdown"] = "\n".join(
        ceiling_markdown(c) for c in result["cases"]) if any(
        "allocation_ceiling" in c for c in result["cases"]) else markdown(result)
    out = out or (Path(__file__).resolve().parent / "results"
                  / f"real-{socket.gethostname()}-{result['date'][:10]}-{mode}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    saved = {**result, "cases": [{**c, "rows": [_jsonable(r) for r in c.get("rows", [])]}
                                 for c in result["cases"]]}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(saved, indent=1, default=float))
    tmp.replace(out)
    return out


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    main()
