"""Audit 84, paired comparisons: a model against itself with the control variate, and the
refusal of one function under two names."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from senslab.measure import compare_sensitivity
from senslab.tokens import Sequence


class _Mean(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.inner(z).mean(1)


def _mlp() -> _Mean:
    torch.manual_seed(0)
    return _Mean(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(),
                                     torch.nn.Linear(16, 3)))


@pytest.mark.parametrize("estimand", ["data", "subset"])
def test_a_model_against_its_copy_with_the_control_variate_is_said(estimand: str) -> None:
    """With control_variate='linear' the "no copy on which the two models differ" warning was
    skipped: a model against its deepcopy read ``+0.0000 ± 0.0000 paired (95% CI
    +0.0000–+0.0000)`` and only each model's own few-flips warning came."""
    a = _mlp()
    x = torch.randn(6, 5, 4, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = compare_sensitivity({"a": a, "b": copy.deepcopy(a)}, x, Sequence(), sigma=1.0,
                                repeats=4, generator=0, control_variate="linear",
                                estimand=estimand).difference("a", "b")
    assert d.estimate == 0 and d.stderr == 0 and d.ci95 == (0.0, 0.0)
    said = [str(w.message) for w in caught if "rests on no copy" in str(w.message)]
    assert len(said) == 1 and "measured the same value on all 120 perturbed copies" in said[0]


def test_two_different_models_with_the_control_variate_are_not_said_to_agree() -> None:
    a = _mlp()
    b = copy.deepcopy(a)
    with torch.no_grad():
        b.inner[2].bias.add_(0.3)
    x = torch.randn(6, 5, 4, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = compare_sensitivity({"a": a, "b": b}, x, Sequence(), sigma=1.0, repeats=4,
                                generator=0, control_variate="linear").difference("a", "b")
    assert d.stderr > 0
    assert not [w for w in caught if "rests on no" in str(w.message)]


def test_one_function_under_two_names_is_refused_with_a_fix_that_works() -> None:
    """The refusal told to pass copy.deepcopy(model), which returns a lambda itself: the
    comparison it advised was refused again."""
    lin = torch.nn.Linear(4, 3)

    def f(z: torch.Tensor) -> torch.Tensor:
        return lin(z).mean(1)

    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match=r"pass a second function that calls it \(lambda x: "
                                         r"model\(x\); copy.deepcopy returns a function "
                                         r"itself\) as the second") as err:
        compare_sensitivity({"a": f, "b": f}, x, Sequence(), sigma=1.0, repeats=2)
    assert copy.deepcopy(f) is f  # the old advice: the same object again
    # the advice followed: measured (0 ± 0, said as such)
    with pytest.warns(RuntimeWarning, match="rests on no copy"):
        d = compare_sensitivity({"a": f, "b": lambda z: f(z)}, x, Sequence(), sigma=1.0,
                                repeats=2, generator=0).difference("a", "b")
    assert d.estimate == 0
    # a module keeps the deepcopy advice (it gives another object)
    with pytest.raises(ValueError, match=r"pass copy.deepcopy\(model\) as the second"):
        compare_sensitivity({"a": lin, "b": lin}, x, Sequence(), sigma=1.0, repeats=2)
    assert "deepcopy(model) as the second" not in str(err.value)
