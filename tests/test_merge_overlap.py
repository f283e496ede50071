"""merge() of metrics that share some examples measured with the same draws (audit 83)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure import CompareSensitivity, TokenSensitivity
from senslab.tokens import Patches

SAID = "same per-example rates"


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.ReLU(),
                         nn.Linear(32, 5)).eval()


def _x(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def _measured(model: nn.Module, data: torch.Tensor, seed: int = 0, batch: int = 10,
              sigma: float = 0.5) -> TokenSensitivity:
    m = TokenSensitivity(model, Patches(4), sigma=sigma, repeats=2, generator=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(0, len(data), batch):
            m.update(data[i : i + batch])
    return m


def _said(a: TokenSensitivity, b: TokenSensitivity) -> list[str]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        a.merge(b)
    return [str(w.message) for w in seen if SAID in str(w.message)]


@pytest.mark.parametrize("short_first", [True, False])
def test_a_run_over_the_first_examples_merged_with_a_longer_run_under_its_seed_is_said(
        short_first):
    """A run over examples 0–59 merged with one over 0–99 under the same seed counted 160
    examples of 100 without a word (the first 60 twice, the standard error too small); now the
    merge warns, naming the 60, in either order."""
    model, x = _model(), _x(100)
    short, long = _measured(model, x[:60]), _measured(model, x)
    a, b = (short, long) if short_first else (long, short)
    said = _said(a, b)
    assert len(said) == 1 and "60 of them" in said[0] and "twice" in said[0]
    assert "shard=(rank, world_size)" in said[0]
    assert a.state.n == 160  # merged as asked, with the word


def test_a_rerun_of_one_merged_shard_is_said_where_its_examples_start():
    """A metric that merged shards A and B, merged with a second run over B under B's seed: B's
    rates recur from the start of B's updates in the merged metric."""
    model, x = _model(), _x(80)
    a, b = _measured(model, x[:40], seed=1), _measured(model, x[40:], seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a.merge(b)
    said = _said(a, _measured(model, x[40:], seed=2))
    assert len(said) == 1 and "40 of them" in said[0]


def test_the_same_examples_under_the_same_seed_still_say_all_of_them():
    model, x = _model(), _x(30)
    said = _said(_measured(model, x), _measured(model, x))
    assert len(said) == 1 and "all 30 of them" in said[0]


@pytest.mark.parametrize("sigma,batch,short", [(0.3, 2, 2), (0.5, 4, 8), (0.8, 1, 3),
                                               (1.0, 10, 20)])
def test_other_examples_under_the_same_seed_merge_quietly(sigma, batch, short):
    """Other examples measured with the same draws (the same seed, the same place in its
    stream) agree only by chance: no word, over 20 datasets, at small and large noise."""
    model = _model()
    for data in range(20):
        x = _x(60, seed=data)
        a = _measured(model, x[:short], batch=batch, sigma=sigma)
        b = _measured(model, x[short:], batch=batch, sigma=sigma)
        assert not _said(a, b), (data, torch.cat(a.state.samples).tolist())


def test_the_same_examples_under_another_seed_merge_quietly():
    """Their rates are other draws' (the overlap is not detected: the docs say so)."""
    model, x = _model(), _x(60)
    assert not _said(_measured(model, x[:30], seed=0), _measured(model, x, seed=5))
    assert "not detected" in " ".join((TokenSensitivity.merge.__doc__ or "").split())
    assert "drop_last=True" in (TokenSensitivity.all_reduce.__doc__ or "")


def test_compare_merge_says_the_repeated_examples_of_each_model():
    m1, m2, x = _model(0), _model(1), _x(50)

    def compared(data: torch.Tensor) -> CompareSensitivity:
        c = CompareSensitivity({"a": m1, "b": m2}, Patches(4), sigma=0.5, repeats=2,
                               generator=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(0, len(data), 10):
                c.update(data[i : i + 10])
        return c

    short, long = compared(x[:30]), compared(x)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        short.merge(long)
    said = [str(w.message) for w in seen if SAID in str(w.message)]
    assert said and all("30 of them" in s for s in said)
