"""Audit 81, leftovers: a model assigned to a metric after it measured, the int8 fingerprint's
probe under a float64 default, a linear allocation that drew no copy, and tokens of no entries."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, _int8, token_sensitivity
from senslab.tokens import Patches, Sequence


def _mlp(seed: int, middle: nn.Module | None = None) -> nn.Module:
    torch.manual_seed(seed)  # test-only: the layers' initialisation
    return nn.Sequential(nn.Flatten(), nn.Linear(8 * 4, 16), middle or nn.Tanh(),
                         nn.Linear(16, 3))


def _x(n: int) -> torch.Tensor:
    return torch.randn(n, 8, 4, generator=torch.Generator().manual_seed(1))


# -- A: metric.model = other ---------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:the standard error rests on")
def test_a_compiled_metric_measures_the_model_assigned_to_it(eager_compile) -> None:
    """The compiled copies were built once from the first model: after ``metric.model = b`` the
    clean forward was b's and the copies ran a's graph (0.39 for b's 0.078)."""
    a, b = _mlp(0).eval(), _mlp(1).eval()
    x = _x(8)
    metric = TokenSensitivity(a, Sequence(), sigma=0.3, generator=0, precision="float32",
                              compile=True)
    metric.update(x)
    metric.model = b
    metric.reset()
    metric.update(x)
    fresh = TokenSensitivity(b, Sequence(), sigma=0.3, generator=0, precision="float32")
    fresh.update(x)  # the same point of the random stream as the swapped metric's second batch
    fresh.reset()
    fresh.update(x)
    assert 0 < fresh.compute().estimate < 0.3
    assert torch.equal(metric.compute().per_sample, fresh.compute().per_sample)
    assert metric._compiled._model is b


def test_a_model_assigned_after_measuring_is_checked_for_randomness_again() -> None:
    """The check that the model's forward is deterministic ran once per input shape: a model
    with dropout in train mode swapped in for a checked one (``eval_mode=False``) had its
    dropout counted as flips (0.375 for 0.008), where a metric of its own refuses it."""
    a = _mlp(0, nn.Tanh()).train()  # no dropout: train mode changes nothing
    b = _mlp(0, nn.Dropout(0.5)).train()
    x = _x(16)
    metric = TokenSensitivity(a, Sequence(), sigma=0.3, generator=0, precision="float32",
                              eval_mode=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric.update(x)
    metric.model = b
    metric.reset()
    with pytest.raises(RuntimeError, match="eval_mode=False the model's output changed"):
        metric.update(x)
    assert metric.state.n == 0  # nothing added


# -- B: the int8 fingerprint under a float64 default ---------------------------------------------


def test_int8_fingerprints_hold_under_a_float64_default() -> None:
    """``_int8._probe`` drew its weights in the default dtype and cached them: under
    ``torch.set_default_dtype(torch.float64)`` a plain measurement of a float32 model failed
    with "dot : expected both vectors to have same dtype" (and so did any later one in the
    process, the float64 probe being cached)."""
    torch.manual_seed(0)  # test-only: the layers' initialisation
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 4)).eval()
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))

    def measure() -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return token_sensitivity(model, x, Patches(4), sigma=2.0, generator=0,
                                     repeats=2).per_sample

    _int8._probe.cache_clear()  # drawn afresh under the float64 default, as in a new process
    torch.set_default_dtype(torch.float64)
    try:
        print_ = _int8.position_print(model[0].weight)
        wide = measure()
    finally:
        torch.set_default_dtype(torch.float32)
    assert print_.dtype == torch.float64 and torch.isfinite(print_)
    assert _int8._probe(_int8.PRINT_BLOCK, torch.device("cpu"), _int8._PRINT_SEED).dtype \
        == torch.float32
    assert torch.equal(wide, measure())  # the same numbers as under the float32 default
    assert _int8.position_print(model[0].weight) == print_


# -- C: allocation="linear" that drew no copy ----------------------------------------------------


def test_a_linear_allocation_that_drew_no_copy_says_so() -> None:
    """A budget of a fraction of a copy per batch drew none (16 tokens at 0.01), and the result
    read 0 ± 0 for a rate of about 0.13 without a word: no flip warning counts no copies."""
    torch.manual_seed(0)  # test-only: the layers' initialisation
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 3)).eval()
    x = torch.randn(4, 4, 4, generator=torch.Generator().manual_seed(1))
    with pytest.warns(RuntimeWarning, match=r"no perturbed copy was drawn.*larger budget="):
        result = token_sensitivity(model, x, Sequence(), sigma=1.0, generator=0,
                                   allocation="linear", budget=0.01)
    assert result.estimate == 0.0 and result.stderr == 0.0  # the number it warns of


def test_a_state_from_an_older_pickle_without_copy_counts_is_not_said_to_have_none() -> None:
    """An older pickle's state counted no copies (``State.copies`` reads 0): it measured, and
    is not said to have drawn none."""
    metric = TokenSensitivity(_mlp(0).eval(), Sequence(), sigma=0.3, generator=0,
                              precision="float32", repeats=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric.update(_x(8))
    for name in ("copies", "events"):  # as an older version pickled it
        del metric.state.__dict__[name]
    metric.__dict__.pop("_copies_uncounted", None)
    old = pickle.loads(pickle.dumps(metric))
    assert old.state.copies == 0 and old.state.n == 8
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        old.compute()
    assert not [w for w in said if "no perturbed copy" in str(w.message)]


# -- D: no token, or tokens of no entries ---------------------------------------------------------


@pytest.mark.parametrize("shape, match", [
    ((4, 3, 0), "have no entries.*at least one feature"),
    ((4, 0, 4), "finds no token in these inputs.*at least one token"),
])
def test_tokens_of_no_entries_and_no_tokens_are_refused_by_name(shape, match) -> None:
    """Tokens of dimension 0 failed with a bare ZeroDivisionError in the noise's drawing; no
    token at all was refused with "the mask is all padding", of a mask nobody passed."""
    def f(t: torch.Tensor) -> torch.Tensor:
        return t.sum(dim=(1, 2))[:, None] * torch.tensor([1.0, -1.0, 0.5])

    with pytest.raises(ValueError, match=match):
        token_sensitivity(f, torch.randn(*shape), Sequence(), sigma=0.5, generator=0)
