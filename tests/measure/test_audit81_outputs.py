"""Audit 81, the decision rule (senslab.measure.outputs): a float16 sigmoid column rounded to
exact 0s read as logits, class labels returned as bf16/fp16 floats read as logits, and an
output with no value per example failing inside torch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab.measure import token_sensitivity
from senslab.measure.outputs import inferred_from_zero_one, resolve_kind, tied
from senslab.measure.sharpness import output_sharpness
from senslab.tokens import Sequence

pytestmark = pytest.mark.filterwarnings("ignore:the standard error rests on")


# ------------------------------------------- a float16 sigmoid rounded to exact 0s
class _Confident(nn.Module):
    """A sigmoid head whose clean logits are all about −24: float16 rounds their sigmoids to
    exactly 0 (its smallest number is 6e-8, a sigmoid's value at −16.6)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)
        with torch.no_grad():
            self.lin.weight.fill_(0.5)
            self.lin.bias.fill_(-4.0)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.lin(z).sum(1).squeeze(-1))


def _small_tokens(dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return (0.1 * torch.randn(8, 6, 4, generator=torch.Generator().manual_seed(1))).to(dtype)


def test_a_float16_column_of_exact_zeros_is_checked_on_the_perturbed_copies():
    """Read as logits, a copy whose sigmoid rose from 0 to 1e-6 (class 1 iff > 0) counted as a
    flip: 0.049 measured where no copy's probability passes 1/2 (0.0 with
    output_kind='probabilities', and in float32)."""
    model, x = _Confident().half().eval(), _small_tokens()
    with torch.no_grad():
        assert bool(model(x).eq(0).all())  # the premise: every clean output is exactly 0.0
    kw = dict(sigma=4.0, repeats=4, generator=0)
    with pytest.raises(ValueError, match=r"exact 0s.*on perturbed inputs.*output_kind"):
        token_sensitivity(model, x, Sequence(), **kw)
    assert token_sensitivity(model, x, Sequence(), output_kind="probabilities",
                             **kw).estimate == 0.0
    # output sharpness reads the same rule: its ShPred was 0.1445 for 0.0625
    with pytest.raises(ValueError, match=r"exact 0s.*weights perturbed.*output_kind"):
        output_sharpness(model, x, sigma_w=4.0, repeats=16, generator=0)


def test_exact_zeros_are_provisional_in_float16_alone():
    zeros = torch.zeros(4)
    assert not inferred_from_zero_one(zeros, None)  # float32: a sigmoid is 0 past −103
    assert not inferred_from_zero_one(zeros.bfloat16(), None)  # bf16: past −92
    assert inferred_from_zero_one(zeros.half(), None)
    assert not inferred_from_zero_one(zeros.half(), "logits")  # declared: nothing to confirm
    assert not inferred_from_zero_one(torch.tensor([0.0, -1e-3]).half(), None)  # a logit
    # a column on its boundary is still a tie (only a column with some exact 1 is a step)
    ref = torch.zeros(4, dtype=torch.bool)
    assert bool(tied(zeros.half(), ref, "logits", None).all())


def test_a_float16_logit_head_of_exact_zeros_is_still_measured():
    """A zero head returns exact 0s on every copy too: nothing in (0, 1), so no refusal."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(24, 1)).half().eval()
    nn.init.zeros_(model[1].weight)
    nn.init.zeros_(model[1].bias)
    r = token_sensitivity(model, _small_tokens(), Sequence(), sigma=1.0, repeats=2, generator=0)
    assert r.estimate == 0.0


# ------------------------------------------------- class labels as bf16/fp16 floats
def _labels_as(dtype: torch.dtype):
    return lambda z: z.sum(1).argmax(1).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_class_labels_as_low_precision_floats_are_refused(dtype):
    """Labels 0..3 as bf16/fp16 were read as logits, labels 1, 2 and 3 one class: 0.031 for the
    labels' own 0.094 (as integers); float32 labels were refused already."""
    x = torch.randn(8, 6, 4, generator=torch.Generator().manual_seed(1))
    kw = dict(sigma=1.0, repeats=2, generator=0)
    with pytest.raises(ValueError, match=r"whole numbers from 0 to 3: class labels as floats"):
        token_sensitivity(_labels_as(dtype), x, Sequence(), **kw)
    own = token_sensitivity(_labels_as(torch.long), x, Sequence(), **kw).estimate
    assert own == pytest.approx(0.09375)


@pytest.mark.parametrize("values", [[0.0, 2.0], [0.0, 3.0, 0.0, 5.0], [130.0, 200.0, 256.0]])
def test_low_precision_logits_whole_by_chance_are_read_as_logits(values):
    """A few small whole bf16 numbers, or large ones (every bf16 number from 128 on is whole),
    are logits as likely as labels: read as logits, not refused."""
    assert resolve_kind(torch.tensor(values, dtype=torch.bfloat16), None) == "logits"
    assert resolve_kind(torch.tensor(values[:2], dtype=torch.float16), None) == "logits"


# --------------------------------------------------- no value per example
@pytest.mark.parametrize("compare", ["class", "l1", "l2"])
def test_an_output_with_no_value_per_example_is_named(compare):
    """o[:, 4:] of four columns: argmax() and max() raised from inside torch."""
    x = torch.randn(8, 6, 4, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"no value per example \(output shape \(8, 0\)\).*"
                                         r"output="):
        token_sensitivity(lambda z: z.sum(1)[:, 4:], x, Sequence(), sigma=1.0, repeats=2,
                          generator=0, compare=compare)
