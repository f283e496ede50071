"""Audit 85, paired comparisons: a merge whose models' warnings the filters make errors, and
the names on a merge's warnings."""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab.measure import CompareSensitivity
from senslab.tokens import Sequence


class _Sum(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.lin(z).sum(1)


def _halves() -> tuple[CompareSensitivity, CompareSensitivity]:
    """Two comparisons of the same two models on other examples, both with the default seed
    (their noise is shared: each model's merge warns of it)."""
    torch.manual_seed(0)
    models = {"a": _Sum(), "b": _Sum()}
    x = torch.randn(12, 6, 4, generator=torch.Generator().manual_seed(1))
    one = CompareSensitivity(models, Sequence(), sigma=1.0, repeats=2)
    two = CompareSensitivity(models, Sequence(), sigma=1.0, repeats=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one.update(x[:6])
        two.update(x[6:])
    return one, two


def test_a_merge_whose_warning_is_an_error_merges_every_model_and_every_difference() -> None:
    """Under ``-W error`` the first model's shared-noise warning raised after its state was
    merged and before the others': 'a' held 12 examples, 'b' and the paired difference 6, and
    compute() refused the comparison for good ("a model's metric was all-reduced or merged
    alone"), a merge again refused as a repeat."""
    one, two = _halves()
    ref, ref_other = _halves()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref.merge(ref_other)
        expected = ref.compute()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="drew the same noise"):
            one.merge(two)
    assert {name: m.state.n for name, m in one.metrics.items()} == {"a": 12, "b": 12}
    assert one.paired["a", "b"].n == 12
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = one.compute()
    d, e = got.difference("a", "b"), expected.difference("a", "b")
    assert (d.estimate, d.stderr, d.stderr_subset) == (e.estimate, e.stderr, e.stderr_subset)
    assert torch.equal(d.per_sample, e.per_sample)


def test_a_merges_warnings_name_the_model_they_are_about() -> None:
    """Each model's merge warned of the shared noise in the same words, twice, naming neither
    (an update's, a compute's and an all_reduce's warnings name theirs)."""
    one, two = _halves()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        one.merge(two)
    said = [str(w.message) for w in caught if "drew the same noise" in str(w.message)]
    assert len(said) == 2
    assert said[0].startswith("model 'a': ") and said[1].startswith("model 'b': ")
    assert all(w.filename == __file__ for w in caught)
