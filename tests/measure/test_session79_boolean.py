"""Boolean sensitivity of reduced-precision models whose outputs are cast to float32, float
class labels in bf16, and one sampled string."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure.boolean import boolean_sensitivity, degree, truth_table


class SplitK(nn.Module):
    """A bf16 MLP whose matrix products sum in another order for batches of at most 32 rows,
    as a GPU library picks a split-K kernel by batch size: an output moves by bf16 rounding
    only when the batch changes. ``cast``: the forward ends in ``.float()``."""

    def __init__(self, n: int, cast: bool, batch_mean: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = nn.Parameter(torch.randn(64, n, generator=g).bfloat16())
        self.w2 = nn.Parameter(torch.randn(1, 64, generator=g).bfloat16() / 8)
        self.cast, self.batch_mean = cast, batch_mean

    @staticmethod
    def mm(x: torch.Tensor, w: torch.Tensor, split: bool) -> torch.Tensor:
        if not split:
            return x @ w.T
        h = w.shape[1] // 2
        return x[:, :h] @ w[:, :h].T + x[:, h:] @ w[:, h:].T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        split = len(x) <= 32
        y = self.mm(torch.relu(self.mm(x, self.w1, split)), self.w2, split)[:, 0]
        if self.batch_mean:
            y = y - y.mean()
        return y.float() if self.cast else y


@pytest.mark.parametrize("method", ["exact", "sample"])
def test_a_bf16_model_cast_to_float32_is_judged_by_bf16_rounding(method):
    """The batch check judged the .float()-ed outputs by float32's tolerance (1e-3 of the
    largest output) and refused the model (a difference of 0.0156 on outputs up to 4.69, one
    bf16 step), while the same outputs left in bf16 passed."""
    kw = dict(output="sign", method=method, num_samples=300, generator=0)
    kept = boolean_sensitivity(SplitK(10, cast=False).eval(), 10, **kw)
    cast = boolean_sensitivity(SplitK(10, cast=True).eval(), 10, **kw)
    assert cast.average == kept.average
    # a dependence on the batch beyond rounding is still refused
    with pytest.raises(ValueError, match="depends on the other strings in its forward"):
        boolean_sensitivity(SplitK(10, cast=True, batch_mean=True).eval(), 10, **kw)


class _Cast(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).float()


@pytest.mark.parametrize("wrap", ["module", "lambda"])
def test_a_bf16_linear_table_cast_to_float32_warns_that_degree_needs_rtol(wrap):
    """The table of a bf16 linear model whose outputs are cast to float32 reads degree 10 (for
    1), as the bf16 outputs' table does, but went without the warning that one gets."""
    torch.manual_seed(0)
    lin = nn.Linear(10, 1).bfloat16().eval()
    f = _Cast(lin).eval() if wrap == "module" else (lambda x: lin(x.bfloat16()).float())
    with pytest.warns(UserWarning, match=r"bfloat16 outputs(?s:.*)degree\(table, rtol=1e-2\)"):
        table = truth_table(f, 10, output="real")
    assert degree(table, output="real") == 10 and degree(table, rtol=1e-2, output="real") == 1


class _Labels(nn.Module):
    """A bf16 classifier returning its argmax 0/1/2 as floats (bf16, or cast to float32)."""

    def __init__(self, cast: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 3).bfloat16()
        self.cast = cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        label = self.lin(x).argmax(1)
        return label.float() if self.cast else label.bfloat16()


@pytest.mark.parametrize("cast", [False, True])
def test_float_labels_of_a_bf16_model_are_refused(cast):
    """Labels 0/1/2 in bf16 passed the float-labels check (every large bf16 value is whole) and
    read as(f) = 0.39, labels 1 and 2 one class, for 1.95 class changes; judging a .float()-ed
    bf16 model by bf16's rules must not let them through either."""
    model = _Labels(cast).eval()
    with pytest.raises(ValueError, match="class labels as floats"):
        boolean_sensitivity(model, 8, output="sign")
    labels = boolean_sensitivity(lambda x: model(x).long(), 8, dtype=torch.bfloat16)
    assert labels.average == pytest.approx(1.9453125)


class _Large(nn.Module):
    """Scores of a bf16 model all from 128 on, where every bf16 value is a whole number."""

    def __init__(self, cast: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 1).bfloat16()
        with torch.no_grad():
            self.lin.weight.fill_(20.0)
            self.lin.bias.fill_(300.0)
        self.cast = cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y.float() if self.cast else y


@pytest.mark.parametrize("cast", [False, True])
def test_large_bf16_scores_are_not_taken_for_labels(cast):
    """From 128 on every bf16 value is whole: such scores are not float labels, whether left
    in bf16 or cast to float32 (refused before as "class labels as floats")."""
    r = boolean_sensitivity(_Large(cast).eval(), 6, output="sign", threshold=0.0)
    assert r.average == 0.0  # all above the boundary 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = boolean_sensitivity(_Large(cast).eval(), 6, output="sign")
    assert r.average == 0.0


def test_one_sampled_string_says_why_and_what_gives_a_finite_stderr():
    with pytest.raises(ValueError, match=r"at least two(?s:.*)num_samples ≥ 2(?s:.*)exact"):
        boolean_sensitivity(lambda x: x[:, 0], 5, method="sample", num_samples=1)
    with pytest.raises(ValueError, match="num_samples must be an integer ≥ 2"):
        boolean_sensitivity(lambda x: x[:, 0], 5, method="sample", num_samples=0)
