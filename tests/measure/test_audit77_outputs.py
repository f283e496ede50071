"""Audit 77, the decision rule (senslab.measure.outputs) and the inputs' handling
(senslab.tokens.base): probabilities a rounding above 1 read as logits, integer labels
compared with a threshold their dtype cannot hold, and a 0-dim entry first in a dict."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab.measure import token_sensitivity
from senslab.measure.outputs import inferred_from_zero_one, predictions, resolve_kind
from senslab.tokens import Embedding, Sequence
from senslab.tokens.base import batch_size

pytestmark = pytest.mark.filterwarnings("ignore:the standard error rests on")

KW = dict(sigma=1.0, repeats=4, precision="float32", generator=0)


# ------------------------------------------------- probabilities a rounding above 1
def _ensemble() -> nn.Module:
    """Ten sigmoids averaged with weights 0.1: float32 0.1 × 10 = 1.0000001, so a confident
    example's probability is 1.0000001."""

    class Ensemble(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)  # test-only: layer init
            self.head = nn.Linear(4, 1)
            self.register_buffer("shift", torch.linspace(-0.5, 0.5, 10))
            self.register_buffer("weight", torch.full((10,), 0.1))

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            p = torch.sigmoid(20 * (self.head(z).sum(1) + self.shift))
            return (p * self.weight).sum(1)

    return Ensemble().eval()


def _tokens() -> torch.Tensor:
    return torch.randn(32, 6, 4, generator=torch.Generator().manual_seed(1))


def test_probabilities_a_rounding_above_one_are_not_read_as_logits():
    """max 1.0000001: with no kind the column was read as logits (every example class 1) and
    measured 0.0 without a word; output_kind='probabilities' was refused as "outside [0, 1]"
    (shown as "[2.13e-31, 1]") with advice to read them as logits — the same 0.0. The
    probabilities' own sensitivity (clamped to [0, 1]) is 0.130."""
    model, x = _ensemble(), _tokens()
    with torch.no_grad():
        out = model(x)
    assert out.max().item() > 1.0  # the premise: rounding put it above 1
    with pytest.raises(ValueError, match="probabilities or logits"):
        token_sensitivity(model, x, Sequence(), **KW)
    assert resolve_kind(out, "probabilities") == "probabilities"
    got = token_sensitivity(model, x, Sequence(), output_kind="probabilities", **KW).estimate
    clamped = token_sensitivity(lambda z: model(z).clamp(0, 1), x, Sequence(),
                                output_kind="probabilities", **KW).estimate
    assert got == clamped > 0.05


def test_saturated_sum_of_sigmoids_is_checked_on_the_perturbed_outputs():
    """A clean column of 0s and 1.0000001s is a saturated ensemble of sigmoids as much as one
    of 0s and 1s: its perturbed outputs must be checked (they were not)."""
    clean = torch.tensor([0.0, 1.0000001, 1.0000001])
    assert clean.max().item() > 1.0
    assert inferred_from_zero_one(clean, None)
    assert not inferred_from_zero_one(torch.tensor([0.0, 1.5, 3.0]), None)


def test_probabilities_well_outside_unit_interval_are_still_refused():
    with pytest.raises(ValueError, match=r"1\.01.*not probabilities"):
        resolve_kind(torch.tensor([0.2, 1.01]), "probabilities")
    assert resolve_kind(torch.tensor([-0.5, 0.2, 0.7]), None) == "logits"


# ------------------------------------ integer labels against a threshold out of their range
@pytest.mark.parametrize(("labels", "threshold", "expected"), [
    (torch.tensor([0, 1, 2], dtype=torch.uint8), -0.5, [True, True, True]),
    (torch.tensor([0, 1, 2], dtype=torch.uint8), 300.0, [False, False, False]),
    (torch.tensor([-3, 0, 5], dtype=torch.int8), 200.0, [False, False, False]),
    (torch.tensor([-3, 0, 5], dtype=torch.int8), -200.0, [True, True, True]),
    (torch.tensor([-3, 0, 5], dtype=torch.int8), 0.5, [False, False, True]),
    (torch.tensor([False, True]), -0.5, [True, True]),
    (torch.tensor([False, True]), 1.5, [False, False]),
    (torch.tensor([130, 127, 128], dtype=torch.uint8), 127.5, [True, False, True]),
])
def test_integer_labels_against_any_threshold(labels, threshold, expected):
    """The floor of the threshold was cast into the labels' dtype: uint8 labels against −0.5
    were compared with 255 (none above: [False, False, False]), int8 against 200 with −56
    (all above)."""
    assert predictions(labels, "scores", threshold).tolist() == expected


# ------------------------------------------------------ a 0-dim entry first in a dict
class _Tempered(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: layer init
        self.emb = nn.Embedding(20, 4)
        self.lin = nn.Linear(4, 3)

    def forward(self, temperature: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lin(self.emb(input_ids)).sum(1) / temperature


def test_a_0dim_entry_first_in_a_dict_is_no_batch():
    """{"temperature": tensor(2.0), "input_ids": ...}: batch_size read the 0-dim tensor's
    first dimension, a bare IndexError "tuple index out of range"; the same dict in the other
    order was measured."""
    ids = torch.randint(0, 20, (8, 6), generator=torch.Generator().manual_seed(1))
    first = {"temperature": torch.tensor(2.0), "input_ids": ids}
    assert batch_size(first) == 8
    got = token_sensitivity(_Tempered(), first, Embedding("emb"), **KW).estimate
    other = token_sensitivity(_Tempered(), {"input_ids": ids, "temperature": torch.tensor(2.0)},
                              Embedding("emb"), **KW).estimate
    assert got == other
    with pytest.raises(ValueError, match="no tensor with a batch axis"):
        batch_size({"temperature": torch.tensor(2.0)})
