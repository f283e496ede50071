"""The allocations' limits and guards, and what the few-flips and padding warnings say:
``max_forward`` is a hard ceiling for ``allocation="linear"``'s later rounds; a batch whose every
copy flipped under an allocation reports the rule of three's standard error, as with equal
draws; antithetic pairs are counted as pairs, not copies; a bf16 model that returns float32
outputs keeps padding-aware batching."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, _alloc, token_sensitivity
from senslab.tokens import Embedding, Sequence

from .test_allocation import _world, linear_case
from .test_padding import right_padded

# -- max_forward: the copies of allocation="linear" never pass it ----------------------------


@pytest.mark.parametrize("per_unit", [1, 2])
def test_linear_rounds_never_pass_max_copies(per_unit: int) -> None:
    """The units drawn, ⌊e⌋ + Bernoulli(e − ⌊e⌋), exceed their expectation about half the time:
    a last round cut to the expected copies left made up to 5% more copies than
    ``max_copies``. Every later round is now sized by the most copies it can draw."""
    x, valid, q = _world()
    k = valid.sum(1).double()
    scale = 1.0 / (k * (valid.cumsum(1).argmax(1) + 1).double().sqrt())
    # the most copies the first round (which always runs) can draw: ⌈e⌉ units per token
    first = per_unit * int(
        _alloc.expected_units(torch.special.ndtr(-x), valid, 0.25, scale).ceil().sum())
    for seed in range(12):
        g = torch.Generator().manual_seed(seed)
        room = first + 137 * (seed + 1)

        def evaluate(src, tok, g=g):
            return torch.bernoulli(q[src, tok], generator=g)

        *_, copies, _ = _alloc.linear_rounds(x, valid, 0.25, g, evaluate, per_unit=per_unit,
                                             target=1e-4, max_copies=room)
        assert copies <= room, (seed, copies, room)


@pytest.mark.parametrize("budget, antithetic, cap", [(1.0, False, 400), (0.25, True, 555)])
def test_linear_allocation_keeps_to_max_forward(budget: float, antithetic: bool,
                                                cap: int) -> None:
    """Through the API: ``max_forward=400`` spent 408 forward passes, 555 spent 572."""
    model, x, _ = linear_case(0, b=16, t=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a target this tight stops only on the cap
        r = token_sensitivity(model, x, Sequence(), sigma=1.0, generator=0, estimand="subset",
                              allocation="linear", budget=budget, antithetic=antithetic,
                              target_stderr=1e-4, max_forward=cap, precision="float32")
    assert r.num_forward <= cap


# -- every copy flipped: the mirror of no flip, under an allocation ---------------------------


def _all_flip(inp: torch.Tensor) -> torch.Tensor:
    """Class 0 only near the clean inputs: noise of σ = 10 on any token flips it (a copy keeps
    its class with probability about 4e-6)."""
    z = 0.001 - (inp**2).sum((1, 2))
    return torch.stack([z, -z], 1)


@pytest.mark.parametrize("options", [{"allocation": "linear", "budget": 2.0},
                                     {"allocation": "uniform", "budget": 0.5}])
def test_an_allocation_where_every_copy_flips_reports_the_rule_of_three(options) -> None:
    """Equal draws floor such a batch's standard error at the rule of three's; the allocations
    reported 1 ± 0 while their warning said the standard error came from the rule of three."""
    x = torch.full((12, 6, 2), 0.005)
    with pytest.warns(RuntimeWarning, match="no copies that kept the prediction.*rule of three"):
        r = token_sensitivity(_all_flip, x, Sequence(), sigma=10.0, generator=0,
                              estimand="subset", target_stderr=0.01, precision="float32",
                              **options)
    assert r.estimate == pytest.approx(1.0)
    assert r.stderr > 0.0


def test_linear_rounds_stop_on_kept_classes_as_on_flips() -> None:
    """With every copy flipped, ``mirrored`` rounds go on until the rule of three meets the
    target, as where no copy flipped: they had stopped after two rounds on a standard error of
    0, which the kept classes — none — cannot show."""
    valid = torch.ones(8, 12, dtype=torch.bool)
    x = torch.full(valid.shape, math.inf, dtype=torch.float64)  # a flat tangent: 2 units each
    target = 0.002
    counts = torch.zeros(valid.shape, dtype=torch.float64)
    rounds = 0

    def evaluate(src, tok):
        nonlocal rounds
        rounds += 1
        counts.index_put_((src, tok), torch.ones(len(src), dtype=torch.float64),
                          accumulate=True)
        return torch.ones(len(src))

    g = torch.Generator().manual_seed(0)
    _alloc.linear_rounds(x, valid, 2.0, g, evaluate, target=target, mirrored=True)
    assert rounds > 2
    assert _alloc.zero_bound(counts, valid) <= target


# -- antithetic pairs are counted as pairs -------------------------------------------------------


def _linear_two_class(seed: int = 0):
    torch.manual_seed(seed)  # test-only: the weights
    w = torch.randn(6, 3)

    def model(inp: torch.Tensor) -> torch.Tensor:
        z = (inp * w).sum((1, 2))
        return torch.stack([z, -z], 1)

    return model


def test_whole_input_antithetic_warning_counts_pairs() -> None:
    """``mode="whole"``, ``antithetic=True``: the events are pairs that varied, which the
    warning set against the copies ("only 2 of the 32 perturbed copies flipped", where 4
    had)."""
    model = _linear_two_class()
    x = torch.randn(8, 6, 3, generator=torch.Generator().manual_seed(1)) * 3
    with pytest.warns(RuntimeWarning, match="rests on few varying pairs") as said:
        r = token_sensitivity(model, x, Sequence(), sigma=1.0, repeats=4, antithetic=True,
                              mode="whole", generator=0, precision="float32", estimand="subset")
    message = next(str(w.message) for w in said if "varying pairs" in str(w.message))
    assert r.estimate * 32 == 4  # four copies flipped, in two pairs
    assert "only 2 of the 16 antithetic pairs (32 perturbed copies)" in message


def test_pairs_that_flip_alike_are_not_said_to_flip_never() -> None:
    """On the decision boundary each pair (ε, −ε) flips once: no pair varies, and the warning
    had said that none of the 16 copies flipped, the rate below 3/16 — beside an estimate of
    0.5."""
    model = _linear_two_class()
    x = torch.zeros(4, 6, 3)
    with pytest.warns(RuntimeWarning, match="rests on no varying pair") as said:
        r = token_sensitivity(model, x, Sequence(), sigma=1.0, repeats=4, antithetic=True,
                              mode="whole", generator=0, precision="float32", estimand="subset")
    message = next(str(w.message) for w in said if "varying pair" in str(w.message))
    assert r.estimate == 0.5
    assert "none of the 8 antithetic pairs (16 perturbed copies)" in message
    assert "by the rule of three" not in message and "flipped as the others" in message


# -- a bf16 model with float32 outputs keeps padding-aware batching -----------------------------


class MaskedMean(nn.Module):
    """Averages its real positions as the mean over every position (padding zeroed) times the
    width over the real count: exact in real arithmetic, so it never reads its padding, but in
    bf16 the mean rounds otherwise at each width."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(50, 4)
        self.embed_ln = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3)

    def forward(self, input_ids, attention_mask):
        w = attention_mask.unsqueeze(-1).to(self.head.weight.dtype)
        h = self.embed_ln(self.embedding(input_ids)) * w
        return self.head(h.mean(1) * (input_ids.shape[1] / w.sum(1)))


def test_a_bf16_model_with_float32_outputs_keeps_trimming() -> None:
    """Cast to float32, a bf16 model's outputs were checked with float32's tolerance: its
    rounding at another width switched padding-aware batching off with "the model seems to read
    positions that the mask marks as padding". It is now judged as with its bf16 outputs, each
    copy compared with its example's clean output at its own width: the same flips."""
    torch.manual_seed(0)  # test-only: model init
    model = MaskedMean().to(torch.bfloat16)
    batch = right_padded()
    results = []
    for output in (None, lambda o: o.float()):
        metric = TokenSensitivity(model, Embedding("embed_ln"), sigma=1.0, repeats=4,
                                  generator=0, output=output)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback to full width
            metric.update(batch)
        assert metric.last_trimmed and metric.untrimmed_batches == 0
        results.append(metric.compute())
    assert torch.equal(results[0].per_sample, results[1].per_sample)
    assert not math.isnan(results[1].estimate)
