"""Audit 81, token-wise estimator: same seed, same numbers, and what a researcher relies on
across updates and merges."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.tokens import Sequence


def _mlp(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(8 * 4, 64)]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Tanh(), nn.Linear(64, 3))


def _x(n: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 8, 4, generator=torch.Generator().manual_seed(seed))


def _metric(model: nn.Module, **options) -> TokenSensitivity:
    return TokenSensitivity(model, Sequence(), sigma=0.3, generator=0, precision="float32",
                            **options)


def test_eval_mode_false_checks_a_model_switched_to_train_mode_between_updates():
    """The determinism check ran once per input shape: a model measured with eval_mode=False
    in eval() and then, after model.train() (a training step between two updates), with its
    dropout on had the dropout counted as flips, without a word (0.248 over both batches for
    0.016 in eval mode: the second batch read 0.48)."""
    model = _mlp(dropout=0.5).eval()
    x = _x(32)
    metric = _metric(model, eval_mode=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric.update(x)
        before = metric.compute()
        model.train()
        with pytest.raises(RuntimeError, match="eval_mode=False.*random in the model's own mode"):
            metric.update(x)
        after = metric.compute()
    assert after.num_examples == before.num_examples == 32  # the refused batch added nothing
    assert after.estimate == before.estimate
    model.eval()  # back in the mode it was checked in: measured as before
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric.update(x)
    assert metric.compute().num_examples == 64


def test_a_function_of_a_module_switched_to_train_mode_between_updates_is_checked_again():
    """eval_mode cannot switch the module a plain function calls (``lambda t: net(t)``): the
    random-forward check caught its dropout on the first batch only, so after net.train()
    between two updates the dropout was counted as flips, at the default eval_mode=True."""
    net = _mlp(dropout=0.5).eval()
    x = _x(32)
    metric = _metric(lambda t: net(t))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric.update(x)
        net.train()
        with pytest.raises(RuntimeError, match="changed between two evaluations"):
            metric.update(x)
        assert metric.compute().num_examples == 32


def test_merge_warns_where_both_metrics_hold_the_same_examples_under_the_same_seed():
    """merge() counted twins without a word (24 examples from 12 and a standard error of 0.026
    for 0.038) where all_reduce warned; metrics of other examples, or of the other shard, merge
    quietly."""
    model, x = _mlp(), _x(12)
    options = {"sigma": 1.0}

    def measured(data: torch.Tensor, seed: int = 3, **kw) -> TokenSensitivity:
        m = TokenSensitivity(model, Sequence(), generator=seed, precision="float32",
                             **options, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m.update(data)
        return m

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        twin = measured(x).merge(measured(x))
    said = [str(w.message) for w in seen if "same per-example rates" in str(w.message)]
    assert len(said) == 1 and "all 12 of them" in said[0]
    assert twin.state.n == 24  # merged as asked, with the word

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        measured(x, shard=(0, 2)).merge(measured(x, shard=(0, 2)))
    assert any("same per-example rates" in str(w.message) for w in seen)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        one = measured(x, shard=(0, 2)).merge(measured(x, shard=(1, 2)))
        other = measured(x[:6]).merge(measured(x[6:], seed=4))
    assert not any("same per-example rates" in str(w.message) for w in seen)
    whole = measured(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r, w = one.compute(), whole.compute()
        other.compute()
    assert (r.estimate, r.num_examples) == (w.estimate, w.num_examples)
    assert r.stderr == pytest.approx(w.stderr, rel=1e-12)


@pytest.mark.parametrize("options", [{}, {"repeats": 4, "antithetic": True},
                                     {"control_variate": "linear"}])
def test_the_split_into_updates_and_the_chunk_size_leave_the_numbers_as_they_are(options):
    """What the module docstring promises a researcher: one seed, the same numbers, whether
    12 examples come in one update, in two, or one at a time, at any chunk size."""
    model, x = _mlp(), _x(12)

    def measured(splits: list[int], **kw) -> tuple[float, float, float, list[float]]:
        m = TokenSensitivity(model, Sequence(), sigma=1.0, generator=3, precision="float32",
                             **options, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = 0
            for n in splits:
                m.update(x[start:start + n])
                start += n
            r = m.compute()
        return r.estimate, r.stderr, r.stderr_subset, r.per_sample.tolist()

    one = measured([12])
    assert 0 < one[0] < 1
    for other in (measured([5, 7]), measured([1] * 12), measured([12], chunk_size=3)):
        # the control variate's tangents are float32 gradients of batches of other sizes: equal
        # to float32's rounding (a flip would move a rate by 1/8)
        assert other[0] == pytest.approx(one[0], rel=1e-6)
        assert other[3] == pytest.approx(one[3], abs=1e-6)
        assert other[1:3] == pytest.approx(one[1:3], rel=1e-6)
