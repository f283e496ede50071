"""Audit 86 (runner): the copies' checks (senslab.measure._runner) on NaN and infinite outputs,
and the static int8 copy (senslab.measure._int8): a failure after it was built, and which layers
stay float."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.measure import token_sensitivity
from senslab.measure._int8 import StaticInt8
from senslab.tokens import Embedding

IDS = {"input_ids": torch.randint(0, 20, (4, 5), generator=torch.Generator().manual_seed(0))}


class Text(nn.Module):
    """Mean-pooled embeddings and a linear head; ``alone``: added to a forward of one example
    (NaN or inf: a batch statistic one example leaves undefined); ``off_table``: NaN once an
    embedding leaves the table (per example, whatever its batch)."""

    def __init__(self, alone: float = 0.0, off_table: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb, self.head = nn.Embedding(20, 4), nn.Linear(4, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        self.alone, self.off_table = alone, off_table

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(input_ids)
        out = self.head(h.mean(1))
        if self.off_table:
            table = self.emb.weight[None].expand(len(h), -1, -1)
            off = torch.cdist(h, table).amin(-1).amax(-1)
            out = out + torch.log(1e-4 - off)[:, None]
        if len(out) == 1:
            out = out + self.alone
        return out


@pytest.mark.parametrize("alone", [float("nan"), float("inf")])
def test_a_zero_noise_copy_undefined_at_both_evaluations_is_refused_as_nan(alone: float):
    # before: NaN read as a random forward ("changed between two evaluations ... by up to
    # inf"), +inf as an output that depends on its batch
    with pytest.raises(FloatingPointError, match="NaN or infinite on a copy of example 0 with "
                       "zero noise, at both of two evaluations") as info:
        token_sensitivity(Text(alone).eval(), IDS, Embedding("emb"), sigma=0.5, repeats=2,
                          generator=0)
    assert "standard deviation or variance over the batch" in str(info.value)
    assert "random" not in str(info.value)


def test_noisy_copies_nan_together_and_in_halves_are_not_called_batch_dependent():
    # before: "the model's output for one example depends on the other examples in its
    # forward pass ... by up to 3.4e+38"; the copies are NaN in any batch
    with pytest.raises(FloatingPointError, match="NaN or infinite on 8 perturbed copies"):
        token_sensitivity(Text(off_table=True).eval(), IDS, Embedding("emb"), sigma=0.5,
                          repeats=2, generator=0, precision="float32")


def test_a_finite_model_is_measured_as_before():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few flips
        r = token_sensitivity(Text().eval(), IDS, Embedding("emb"), sigma=3.0, repeats=2,
                              generator=0, precision="float32")
    assert r.num_forward == 4 + 4 * 5 * 2 and 0 < r.estimate < 1


class Convs(nn.Module):
    """Three convolutions and a linear head, called in that order; ``head_at``: where
    ``__init__`` declares the head (``"end"``, or ``"middle"``: before the last two
    convolutions). The weights do not depend on it."""

    def __init__(self, head_at: str = "end") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        if head_at == "middle":
            self.head = nn.Linear(16, 2)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.conv3 = nn.Conv2d(16, 16, 3, padding=1)
        if head_at == "end":
            self.head = nn.Linear(16, 2)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for _, p in sorted(self.named_parameters()):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return self.head(x.mean((-2, -1)))


def _built(model: nn.Module) -> StaticInt8:
    if not StaticInt8.applies(model):
        pytest.skip("this torch has no x86 static int8 kernels")
    static = StaticInt8(model)
    static.build(torch.randn(32, 3, 8, 8, generator=torch.Generator().manual_seed(1)))
    assert not static.failed
    return static


def test_the_layer_called_last_stays_float_whatever_init_declares_first():
    # before: module order kept conv3 float and quantised the head, whose outputs were
    # clamped to the calibrated range (a largest output of 7.33 read as 4.43)
    middle, end = _built(Convs("middle")), _built(Convs("end"))
    assert type(middle.model.get_submodule("head")) is nn.Linear  # float
    assert "quantized" not in type(middle.model.get_submodule("conv1")).__module__
    assert "quantized" in type(middle.model.get_submodule("conv3")).__module__
    x = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(2)) * 3
    torch.testing.assert_close(middle(x), end(x), rtol=0, atol=0)
    assert float(middle(x).max()) > 0.9 * float(Convs()(x).detach().max())


def test_a_static_int8_copy_failing_after_it_was_built_runs_float_said_once():
    # before: the quantised graph's raw "Input shape must be `(N, C, H, W)`!" ended the call,
    # although the docstring promised the float model's outputs
    model = Convs()
    static = _built(model)
    x = torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(3))  # unbatched
    with pytest.warns(RuntimeWarning, match="static int8 copy of the model failed") as said:
        out = static(x)
    assert len([w for w in said if "static int8" in str(w.message)]) == 1
    assert static.failed and static.model is None
    torch.testing.assert_close(out, model(x).detach(), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(static(x), out, rtol=0, atol=0)  # float, no second word
