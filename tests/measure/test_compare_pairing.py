"""The pairing of a comparison: what it must refuse, and what it must name.

* One model object under two names measures a model against itself: a difference of exactly 0
  with a standard error of 0, "no difference, known exactly", whatever the names meant.
* A merge of two comparisons whose names point at swapped models would add a − b to b − a.
* An error raised while one model is measured names that model (models often share a class).
* Two different objects computing one identity function, read by output distance, get equal
  values copy by copy: the noise is the same for every model (a direct check of the pairing).
"""

from __future__ import annotations

import copy

import pytest
import torch

from senslab.measure import CompareSensitivity, compare_sensitivity
from senslab.tokens import Sequence

T, D = 4, 3


class Logit:
    """One logit per example, z = Σ w·x + b (class 1 iff z > 0)."""

    output_kind = "logits"

    def __init__(self, seed: int, bias: float) -> None:
        self.w = torch.randn(T, D, generator=torch.Generator().manual_seed(seed))
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.w).sum((1, 2)) + self.bias


def _x(n: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, T, D, generator=torch.Generator().manual_seed(seed))


# -- one model under two names -----------------------------------------------------------------


def test_one_model_object_under_two_names_is_refused():
    """Before: {"base": m, "finetuned": m} reported "base − finetuned: +0.0000 ± 0.0000 (95% CI
    +0.0000–+0.0000)" — a certain "no difference" that only says the object was passed twice."""
    m = Logit(1, 0.1)
    with pytest.raises(ValueError, match="'base' and 'finetuned' are the same object"):
        compare_sensitivity({"base": m, "finetuned": m}, _x(), Sequence(), sigma=1.0, repeats=2,
                            generator=0)
    with pytest.raises(ValueError, match="same object.*copy.deepcopy"):
        CompareSensitivity({"a": m, "b": Logit(2, 0.0), "c": m}, Sequence(), sigma=1.0)


def test_a_deliberate_check_against_a_copy_still_runs():
    """The fix the refusal names: a copy is another object, and its difference is exactly 0
    (same function, same copies)."""
    m = Logit(1, 0.1)
    r = compare_sensitivity({"a": m, "copy": copy.deepcopy(m)}, _x(), Sequence(), sigma=1.0,
                            repeats=2, generator=0)
    d = r.difference("a", "copy")
    assert r.results["a"].estimate > 0
    assert d.estimate == 0.0 and d.stderr == 0.0


# -- merge -------------------------------------------------------------------------------------


def test_merge_refuses_comparisons_whose_names_point_at_swapped_models():
    """Before: merging {"a": A, "b": B} with {"a": B, "b": A} (one batch each) reported
    a − b = +0.0625 ± 0.0612 where A − B on those 20 examples is −0.025 (A − B on the first
    half added to B − A on the second), with per-model results that mixed both models."""
    a, b = Logit(1, 0.1), Logit(2, -0.4)
    kw = dict(sigma=1.0, repeats=2)
    one = CompareSensitivity({"a": a, "b": b}, Sequence(), generator=0, **kw)
    one.update(_x(seed=1))
    other = CompareSensitivity({"a": b, "b": a}, Sequence(), generator=1, **kw)
    other.update(_x(seed=2))
    with pytest.raises(ValueError, match="named 'a' in the other comparison is the one named 'b'"):
        one.merge(other)
    # refused before anything was added
    assert one.metrics["a"].state.n == 10 and one.paired["a", "b"].n == 10
    # the same models under the same names merge as before
    same = CompareSensitivity({"a": a, "b": b}, Sequence(), generator=1, **kw)
    same.update(_x(seed=2))
    assert one.merge(same).compute().results["a"].num_examples == 20


def test_merge_in_another_order_says_so():
    a, b = Logit(1, 0.1), Logit(2, -0.4)
    one = CompareSensitivity({"a": a, "b": b}, Sequence(), sigma=1.0, generator=0)
    other = CompareSensitivity({"b": b, "a": a}, Sequence(), sigma=1.0, generator=1)
    with pytest.raises(ValueError, match="same models in another order"):
        one.merge(other)


# -- errors name the model ---------------------------------------------------------------------


def test_a_runtime_error_names_the_model_and_adds_nothing():
    """A model wrapped in a function is not put in eval mode, so its dropout stays on: the
    refusal "the model's output changed between two evaluations" said nothing of which model
    (both are the same class here) before."""
    torch.manual_seed(0)  # test-only: init
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(T * D, 8),
                              torch.nn.Dropout(0.3), torch.nn.Linear(8, 3))
    noisy = copy.deepcopy(net).train()
    metric = CompareSensitivity({"plain": net, "wrapped": lambda z: noisy(z)}, Sequence(),
                                sigma=1.0, repeats=2, precision="float32")
    with pytest.raises(RuntimeError, match="^model 'wrapped': the model's output changed"):
        metric.update(_x())
    assert metric.metrics["plain"].state.n == 0 and metric.paired["plain", "wrapped"].n == 0


def test_an_error_of_its_own_class_keeps_it_and_gets_a_note():
    def broken(x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("no forward yet")

    metric = CompareSensitivity({"a": Logit(1, 0.0), "todo": broken}, Sequence(), sigma=1.0)
    with pytest.raises(NotImplementedError, match="no forward yet") as info:
        metric.update(_x())
    assert type(info.value) is NotImplementedError
    if hasattr(info.value, "add_note"):  # Python 3.11+
        assert any("'todo'" in note for note in info.value.__notes__)


# -- the noise is the same for every model -----------------------------------------------------


class Identity:
    """Returns its input: a copy's distance from the clean output is its noise's size."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


@pytest.mark.parametrize("options", [
    dict(repeats=3), dict(repeats=4, antithetic=True, estimand="subset"),
    dict(repeats=2, num_tokens=2), dict(repeats=2, mode="whole"),
    dict(repeats=2, replace_with=torch.randn(5, D, generator=torch.Generator().manual_seed(3))),
], ids=["plain", "antithetic", "num_tokens", "whole", "replace_with"])
def test_two_identity_models_get_identical_values_copy_by_copy(options):
    """Two objects, one function: every paired difference is exactly 0 (over several updates,
    with models chunked differently) exactly when each copy got the same noise for both."""
    kw = dict(options)
    sigma = None if "replace_with" in kw else 0.5
    mask = torch.arange(T)[None] < (torch.arange(7) % T + 1)[:, None]
    for gen in (5, torch.Generator().manual_seed(5)):
        metric = CompareSensitivity({"a": Identity(), "b": Identity()}, Sequence(),
                                    compare="l2", sigma=sigma, generator=gen, chunk_size=6,
                                    **kw)
        metric.metrics["b"].chunk_size = 4  # other chunks: the noise must not depend on them
        for seed in range(3):
            metric.update(_x(7, seed), mask)
        r = metric.compute()
        assert r.results["a"].estimate > 0.1
        d = r.difference("a", "b")
        assert torch.equal(d.per_sample, torch.zeros(21))
        assert d.estimate == 0.0 and d.stderr == 0.0
        assert not d.stderr_subset > 0  # 0, or NaN for an example of one unit (num_tokens)
