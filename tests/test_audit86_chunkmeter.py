"""Audit 86, chunk sizing on the host (measure/_chunks.py, measure/_runner.py): a memory_budget
the user gives holds on CPU — for a module whose forward builds large temporaries and for a
plain callable — and a budget too small for the probe or for one copy is said."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.measure._chunks import ActivationMeter
from senslab.tokens import Sequence

L, D = 128, 4
#: bytes one copy holds at the peak of the forwards below: its input (L×D) and the L×L scores
#: and their softmax, alive together (float32)
PER_COPY = (L * D + 2 * L * L) * 4


def scores(x: torch.Tensor) -> torch.Tensor:
    """Attention-like: an L×L temporary inside, outputs of 3 logits."""
    s = x @ x.transpose(1, 2)
    p = s.softmax(-1)
    del s
    return (p @ x).mean(1)[:, :3]


class Scores(nn.Module):
    """``scores`` as one module: its hooks see only its input and its small output."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(len(x))
        return scores(x)


class Plain:
    """``scores`` as a callable that is no nn.Module: nothing to hook."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(len(x))
        return scores(x)


def metric(model: object, budget: int) -> TokenSensitivity:
    return TokenSensitivity(model, Sequence(), sigma=0.5, repeats=2, generator=0,
                            estimand="subset", memory_budget=budget)


def inputs() -> torch.Tensor:
    return torch.randn(1, L, D, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("kind", [Scores, Plain])
def test_an_explicit_budget_holds_on_the_host(kind):
    """On CPU the meter counted module outputs (×2) only: the L×L scores inside a module went
    unseen, and a plain callable read 0, so with memory_budget=4 MiB every chunk held all 256
    copies, 8× the budget (31× at 1 MiB). Now the chunks' forwards stay within the budget
    (measured by the largest call the model saw × the bytes a copy holds), and use most of it;
    the numbers are those of a budget that holds everything."""
    budget = 4 << 20
    model = kind()
    m = metric(model, budget)
    m.update(inputs())
    largest = max(model.calls) * PER_COPY
    assert largest <= 1.5 * budget, (model.calls, m.last_chunk_size)
    assert m.last_chunk_size * PER_COPY >= 0.5 * budget  # not needlessly small
    whole = metric(kind(), 1 << 30)
    whole.update(inputs())
    assert whole.last_chunk_size == L * 2  # one chunk
    assert torch.equal(m.compute().per_sample, whole.compute().per_sample)


def test_the_exact_meter_counts_temporaries_the_default_one_leaves_alone():
    """With exact=True (a budget the user gave) the meter's peak counts the storages the
    forward's operations create, here the L×L scores and softmax; without it (the default
    budget, whose chunk sizes are tuned for speed) the peak stays the hooks' estimate."""
    model = Scores()
    x = torch.randn(8, L, D, generator=torch.Generator().manual_seed(1))
    peaks = {}
    for exact in (False, True):
        with torch.inference_mode(), ActivationMeter(model, torch.device("cpu"),
                                                     exact=exact) as meter:
            model(x + 0)
        peaks[exact] = meter.peak
        assert meter.created_peak >= 8 * 2 * L * L * 4
    assert peaks[False] == int(meter.seen_peak * 2.0) < 8 * 2 * L * L * 4
    assert 8 * 2 * L * L * 4 <= peaks[True] <= 8 * PER_COPY * 1.5


def test_a_budget_too_small_for_one_copy_is_said():
    """A budget below one copy's bytes ran every chunk over it without a word; now a warning
    names the bytes a copy takes and the budget that would hold it."""
    model = Scores()
    with pytest.warns(RuntimeWarning, match=r"memory_budget=65536 bytes is too small"):
        m = metric(model, 64 << 10)
        m.update(inputs())
    assert m.last_chunk_size == 1


def test_a_budget_the_probe_exceeds_is_said():
    """The probe chunk runs 8 copies before a copy's bytes are known: with a budget of 4
    copies it ran at twice the budget without a word. Now a warning says so and names the
    chunk_size that never exceeds it; the later chunks hold 4 copies. A budget that holds the
    probe warns of nothing."""
    budget = 4 * PER_COPY + PER_COPY // 2
    model = Scores()
    with pytest.warns(RuntimeWarning, match=r"the first chunk.*chunk_size=4"):
        m = metric(model, budget)
        m.update(inputs())
    assert m.last_chunk_size == 4 and max(model.calls[-20:]) == 4
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*memory_budget.*")
        roomy = metric(Scores(), 16 * PER_COPY)
        roomy.update(inputs())
    assert roomy.last_chunk_size in (15, 16)
