"""Audit 77, area *noise* (``_noise.py``, ``_options.py``): options of the token-wise estimator
that were silently ignored or refused with a misleading message.

Each is refused (or, for an allocation with antithetic pairs, run) in ``tokenwise.py``
(``TokenSensitivity.__init__`` and ``_check_allocation``)."""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab.measure import token_sensitivity
from senslab.tokens import Patches


def _setup() -> tuple[torch.nn.Module, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return model, torch.randn(6, 1, 8, 8, generator=gen)


def _measure(**options: object) -> tuple[int, float, list[float]]:
    model, x = _setup()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = token_sensitivity(model, x, Patches(4), sigma=1.0, generator=0,
                              precision="float32", **options)
    return r.num_forward, r.estimate, r.per_sample.tolist()


def test_measure_without_the_ignored_options_runs() -> None:
    """The baseline: plain options measure."""
    n, est, _ = _measure(repeats=4)
    assert n == 6 + 6 * 4 * 4 and 0.0 <= est <= 1.0


def test_budget_without_allocation_is_refused_naming_allocation() -> None:
    # budget=0.1 without allocation= gave exactly the numbers of no budget (30 forwards both)
    with pytest.raises(ValueError, match="allocation="):
        _measure(budget=0.1)


def test_allocation_with_antithetic_does_not_ask_for_even_repeats() -> None:
    # allocation='linear', antithetic=True failed with "antithetic=True needs an even number of
    # repeats (pairs ε, −ε), got 1", though budget=, not repeats=, sets the draws there (and
    # _check_allocation requires repeats == 2 with antithetic, a value nobody is told to give)
    try:
        _measure(allocation="linear", antithetic=True)
    except ValueError as err:
        assert "even number of repeats" not in str(err), str(err)


def test_max_forward_without_target_stderr_or_allocation_is_refused() -> None:
    # max_forward=10 spent 102 forward passes without a word: it caps target_stderr's rounds
    # (and an allocation's) only
    with pytest.raises(ValueError, match="max_forward"):
        _measure(repeats=4, max_forward=10)


def test_num_tokens_with_mode_whole_is_refused() -> None:
    # mode='whole' puts noise on every token at once: num_tokens=2 gave exactly the numbers
    # of mode='whole' without it, though the user asked for noise on 2 tokens per example
    with pytest.raises(ValueError, match="num_tokens"):
        _measure(mode="whole", num_tokens=2)

