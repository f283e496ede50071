"""A measurement inside another's forward, in one thread (audit 84). A token-wise sensitivity or
parameter_norm started inside sharpness's perturbed forward (from the model's forward, a hook,
``output=`` or ``loss_fn``) measured the perturbed weights (0.34 for 0.16, a norm of 4.31 for
3.47) without a word: it is refused now. A nested Embedding measurement of the same model was
refused as a module that "ran 11 times in one forward pass": the message now says a measurement
was started inside the measurement."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab import _exclusive
from senslab.measure import token_sensitivity
from senslab.measure.boolean import boolean_sensitivity
from senslab.measure.sharpness import loss_sharpness, output_sharpness, parameter_norm
from senslab.tokens import Embedding, Patches

REFUSED = r"measurement was started while sharpness measured Sequential.*before or after"


def _model() -> nn.Module:
    torch.manual_seed(0)  # test-only: nn.Linear initialises from the global RNG
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.ReLU(), nn.Linear(32, 4))


def _x() -> torch.Tensor:
    return torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def _tokenwise(model: nn.Module, x: torch.Tensor) -> float:
    return token_sensitivity(model, x[:4], Patches(4), sigma=0.5, repeats=2, generator=0,
                             precision="float32").estimate


def _inner(kind: str, model: nn.Module, x: torch.Tensor) -> float:
    if kind == "tokenwise":
        return _tokenwise(model, x)
    if kind == "norm":
        return parameter_norm(model)
    if kind == "boolean":
        return boolean_sensitivity(lambda z: model[1:](z.repeat(1, 64)).argmax(1) == 0,
                                   3, method="exact").average
    return output_sharpness(model, x[:4], sigma_w=0.05, repeats=2, generator=0).shop.estimate


def _state(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("inner", ["tokenwise", "norm", "boolean", "sharpness"])
def test_a_measurement_inside_sharpness_forward_is_refused(inner: str) -> None:
    model, x = _model(), _x()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = _inner(inner, model, x)
    before, seen, calls = _state(model), [], [0]

    def hook(*_: object) -> None:  # a user's hook that measures at sharpness's 3rd forward
        calls[0] += 1
        if calls[0] == 3:  # a perturbed one (two clean forwards come first)
            seen.append(_inner(inner, model, x))

    model.train()
    handle = model.register_forward_hook(hook)
    try:
        with pytest.raises(RuntimeError, match=REFUSED):
            output_sharpness(model, x, sigma_w=0.05, generator=0)
    finally:
        handle.remove()
    assert seen == []  # before: 0.34375 for 0.15625 (tokenwise), 4.31 for 3.47 (norm)
    assert all(torch.equal(a, b) for a, b in zip(before, _state(model), strict=True))
    assert model.training  # the caller's mode back
    assert _exclusive._LOCK._perturbed is None and _exclusive._LOCK._depth == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _inner(inner, model, x) == alone  # the next measurement is not refused


def test_a_measurement_in_output_or_loss_fn_is_refused() -> None:
    model, x = _model(), _x()
    seen: list[float] = []

    def output(out: torch.Tensor) -> torch.Tensor:  # an output= that measures
        seen.append(parameter_norm(model))
        return out

    with pytest.raises(RuntimeError, match=REFUSED):
        output_sharpness(model, x, sigma_w=0.05, generator=0, output=output)

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        seen.append(_tokenwise(model, x))
        return nn.functional.cross_entropy(out, y)

    y = torch.arange(16) % 4
    with pytest.raises(RuntimeError, match=REFUSED):
        loss_sharpness(model, loss_fn, x, y, sigma=0.05, draws=2, generator=0)
    assert seen == []


def test_sharpness_inside_a_token_wise_forward_still_runs() -> None:
    """The refusal is sharpness's perturbed forwards', not every nesting: a sharpness inside a
    token-wise measurement's forward measures as alone, and the outer number is unchanged."""
    model, x = _model(), _x()
    alone_tw = _tokenwise(model, x)
    alone_sh = output_sharpness(model, x[:4], sigma_w=0.05, repeats=2, generator=0)
    seen, calls = [], [0]

    def hook(*_: object) -> None:
        calls[0] += 1
        if calls[0] == 2:
            seen.append(output_sharpness(model, x[:4], sigma_w=0.05, repeats=2, generator=0))

    handle = model.register_forward_hook(hook)
    try:
        outer = _tokenwise(model, x)
    finally:
        handle.remove()
    assert outer == alone_tw
    assert seen[0].shop.estimate == alone_sh.shop.estimate


class _Words(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.emb, self.head = nn.Embedding(50, 16), nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.emb(ids)).mean(1))


def test_a_nested_embedding_measurement_is_named_as_such() -> None:
    model = _Words()
    ids = torch.randint(0, 50, (6, 5), generator=torch.Generator().manual_seed(3))
    opts = {"sigma": 1.0, "repeats": 2, "generator": 1, "precision": "float32"}
    alone = token_sensitivity(model, ids, Embedding("emb"), **opts).estimate
    calls = [0]

    def hook(*_: object) -> None:
        calls[0] += 1
        if calls[0] == 3:
            token_sensitivity(model, ids, Embedding("emb"), **opts)

    handle = model.head.register_forward_hook(hook)
    try:  # before: "submodule 'emb' ran 11 times in one forward pass (a module shared ...)"
        with pytest.raises(RuntimeError, match=r"a measurement was started inside this "
                                               r"measurement's forward pass.*'emb'.*before or "
                                               r"after this one"):
            token_sensitivity(model, ids, Embedding("emb"), **opts)
    finally:
        handle.remove()
    assert token_sensitivity(model, ids, Embedding("emb"), **opts).estimate == alone
