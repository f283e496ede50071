"""Audit 86, measurement options (senslab.measure._options) and the measurements' turns
(senslab._exclusive): a submodule shared by two parents came back from a measurement in its
second parent's mode (a frozen BatchNorm left training); an empty or non-finite ``replace_with``
failed inside torch or as "check the model's weights"; a flag given as an array failed with
numpy's "truth value is ambiguous", naming no option."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Embedding, Patches

OPTS = {"generator": 0, "precision": "float32"}


def images() -> torch.Tensor:
    return torch.randn(8, 1, 4, 4, generator=torch.Generator().manual_seed(1))


class SharedBackbone(nn.Module):
    """Two heads over one backbone, registered under both (and as ``backbone``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.backbone = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8))
        self.head = nn.Sequential(self.backbone, nn.Linear(8, 3))
        self.aux = nn.Sequential(self.backbone, nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def modes(model: nn.Module) -> dict[str, bool]:
    return {n: m.training for n, m in model.named_modules(remove_duplicate=False)}


def test_a_shared_frozen_submodule_comes_back_in_its_own_mode() -> None:
    """Before: ``train(flag)`` per module, parents first, put the shared backbone back in eval
    mode and then its second parent's ``train(True)`` switched it to training: 12 module paths
    (the backbone's BatchNorm included) were left training after one ``update``, so the next
    training step updated the frozen statistics."""
    model = SharedBackbone()
    model.train()
    model.backbone.eval()  # frozen BatchNorm statistics
    before = modes(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = TokenSensitivity(model, Patches(2), sigma=0.5, **OPTS)
        metric.update(images())
    assert modes(model) == before
    assert not model.backbone[2].training and model.head[1].training


def test_an_empty_replace_with_is_refused_naming_it() -> None:
    """Before: accepted, then the first update failed inside torch with "random_ expects
    'from' to be less than 'to'"."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    with pytest.raises(ValueError, match=r"replace_with is an empty vocabulary \(\(0, 4\)\)"):
        TokenSensitivity(model, Patches(2), replace_with=torch.zeros(0, 4), **OPTS)


def test_a_non_finite_replace_with_is_refused_naming_its_rows() -> None:
    """Before: accepted; copies given the NaN row were refused at update as "model output is
    NaN or infinite ... check the model's weights and the inputs", neither the cause."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    vocab = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))
    bad = vocab.clone()
    bad[3, 1], bad[5, 0] = float("nan"), float("inf")
    with pytest.raises(ValueError, match=r"2 of its 6 rows \(rows 3, 5\)"):
        TokenSensitivity(model, Patches(2), replace_with=bad, **OPTS)
    # the finite rows, as the message says, measure
    kept = bad[torch.isfinite(bad).all(dim=1)]
    assert torch.equal(kept, vocab[[0, 1, 2, 4]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = TokenSensitivity(model, Patches(2), replace_with=kept, **OPTS)
        metric.update(images())
    assert 0.0 <= metric.compute().estimate <= 1.0


@pytest.mark.parametrize("value", [np.array([True, False]), torch.tensor([True, True])])
def test_a_flag_given_as_an_array_names_the_option(value) -> None:
    """Before: numpy's ValueError / torch's RuntimeError "truth value ... is ambiguous"."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    with pytest.raises(TypeError, match="eval_mode must be True or False"):
        TokenSensitivity(model, Patches(2), sigma=0.5, eval_mode=value, **OPTS)


def test_two_threads_measure_two_models_as_one_would() -> None:
    """Measurements of two different models in two threads take turns and both give the
    numbers each gives alone (Embedding tokens: hooks on each model)."""

    class Words(nn.Module):
        def __init__(self, seed: int) -> None:
            super().__init__()
            torch.manual_seed(seed)  # test-only: init
            self.emb, self.head = nn.Embedding(30, 8), nn.Linear(8, 3)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(torch.tanh(self.emb(ids)).mean(1))

    ids = torch.randint(0, 30, (12, 6), generator=torch.Generator().manual_seed(4))
    models = [Words(0).eval(), Words(1).eval()]

    def measure(model: nn.Module) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return token_sensitivity(model, ids, Embedding("emb"), sigma=1.0, repeats=2,
                                     **OPTS).per_sample

    alone = [measure(m) for m in models]
    out: dict[int, torch.Tensor] = {}
    errors: list[str] = []

    def job(k: int) -> None:
        try:
            for _ in range(3):
                out[k] = measure(models[k])
                assert torch.equal(out[k], alone[k])
        except Exception as err:  # reported, not lost with the thread
            errors.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=job, args=(k,), daemon=True) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert not torch.equal(alone[0], alone[1])  # two models, two answers
