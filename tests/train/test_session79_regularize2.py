"""Session 79 audit of the sensitivity regularizer, part 2: a model held in bf16 (parameters
cast with ``.bfloat16()``, no autocast) whose last LayerNorm or log_softmax follows logits near
100 gave a penalty 11.7× (LayerNorm) to 15× (log_softmax) the float32 model's at σ = 0.1
without a word: the LayerNorm spreads the bf16 rounding of the logits over many steps of the
outputs' own grid, so the output-grid check cannot see it, and there is no float32 model to
compare with. The noise is now replayed at −½ and ½ of its size on the first such call and
every 100th, and a change that is not the smooth function of the noise a float model gives is
warned about."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.tokens import Sequence
from senslab.train import regularize
from senslab.train.regularize import sensitivity_penalty


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with nothing said and at the checks' first call."""
    monkeypatch.setattr(regularize, "_OUTPUT_GRID_SAID", set())
    monkeypatch.setattr(regularize, "_AUTOCAST_CALLS", [0])


def head(last: nn.Module, bias: float) -> nn.Sequential:
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    with torch.no_grad():
        lin.bias.fill_(bias)  # bf16 steps of 0.5 at 100
    return nn.Sequential(nn.Flatten(), lin, last)


def images(n: int = 64) -> torch.Tensor:
    return torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(1)) * 2 - 1


def cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Dropout(0.2), nn.Flatten(), nn.Linear(16 * 8 * 8, 10),
                         nn.LayerNorm(10))


def said(model: nn.Module, x: torch.Tensor, sigma: float, **kw: object) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sensitivity_penalty(model, x, sigma=sigma, generator=torch.Generator().manual_seed(0),
                            **{"patch": 2, **kw})  # type: ignore[arg-type]
    return [str(w.message) for w in caught]


def forwards(model: nn.Module) -> list[int]:
    count = [0]
    model.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


@pytest.mark.parametrize("last", [nn.LayerNorm(8), nn.LogSoftmax(-1)])
def test_bf16_model_behind_layernorm_or_log_softmax_is_warned(last: nn.Module) -> None:
    model = head(last, 100.0).bfloat16()
    out = said(model, images().bfloat16(), 0.1)
    assert len(out) == 1 and "rounding of the bfloat16 model's forwards" in out[0]
    assert said(model, images().bfloat16(), 0.1) == []  # said once


@pytest.mark.parametrize("sigma", [0.3, 1.0])
@pytest.mark.parametrize("last", [nn.LayerNorm(8), nn.LogSoftmax(-1), nn.Softmax(-1)])
def test_no_warning_where_rounding_is_small(last: nn.Module, sigma: float) -> None:
    assert said(head(last, 0.0).bfloat16(), images().bfloat16(), sigma) == []


@pytest.mark.parametrize("sigma", [0.1, 0.3, 1.0])
def test_train_mode_cnn_is_not_warned_and_keeps_modes_buffers_and_rng(sigma: float) -> None:
    x = (torch.rand(32, 3, 8, 8, generator=torch.Generator().manual_seed(2)) * 2 - 1)
    runs = []
    for skip in (False, True):
        model = cnn().bfloat16().train()
        regularize._AUTOCAST_CALLS[0] = 1 if skip else 0
        torch.manual_seed(5)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            penalty, clean = sensitivity_penalty(model, x.bfloat16(), patch=2, sigma=sigma,
                                                 generator=torch.Generator().manual_seed(0))
        assert caught == [] and all(m.training for m in model.modules())
        runs.append((penalty, clean, [b.clone() for b in model.buffers()], torch.rand(1)))
    (p0, c0, b0, r0), (p1, c1, b1, r1) = runs
    assert torch.equal(p0, p1) and torch.equal(c0, c1) and torch.equal(r0, r1)
    assert all(torch.equal(a, b) for a, b in zip(b0, b1, strict=True))


def test_schedule_and_no_extra_forwards_on_float_models() -> None:
    x = images(8)
    model = head(nn.LayerNorm(8), 0.0).eval()
    count = forwards(model)
    for _ in range(3):
        sensitivity_penalty(model, x, patch=2, sigma=0.3,
                            generator=torch.Generator().manual_seed(0))
    assert count[0] == 6 and regularize._AUTOCAST_CALLS == [0]  # float32: two per call
    low = head(nn.LayerNorm(8), 0.0).bfloat16().eval()
    count = forwards(low)
    calls = []
    for _ in range(101):
        before = count[0]
        sensitivity_penalty(low, x.bfloat16(), patch=2, sigma=0.3,
                            generator=torch.Generator().manual_seed(0))
        calls.append(count[0] - before)
    # eval mode: the call's own clean/noisy outputs reused, ±½ replayed (first and 101st call)
    assert calls[0] == 4 and calls[100] == 4 and set(calls[1:100]) == {2}
    low.train()
    before = count[0]
    regularize._AUTOCAST_CALLS[0] = 0
    sensitivity_penalty(low, x.bfloat16(), patch=2, sigma=0.3,
                        generator=torch.Generator().manual_seed(0))
    assert count[0] - before == 6 and low.training  # train mode: all four again, in eval mode


def test_sequence_noise_is_replayed_scaled() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(4, 8)
    with torch.no_grad():
        lin.bias.fill_(100.0)
    model = nn.Sequential(lin, nn.LayerNorm(8)).bfloat16()
    x = torch.rand(32, 6, 4, generator=torch.Generator().manual_seed(3)).bfloat16()
    out = said(model, x, 0.1, tokens=Sequence(), patch=None)
    assert len(out) == 1 and "rounding" in out[0]
    replay: list = []
    clean, noisy = regularize._branches(model, x, Sequence(), 0.5,
                                        torch.Generator().manual_seed(0), None, None, replay)
    assert torch.equal(replay[0](0), clean) and torch.equal(replay[0](1), noisy)
    step = (x + 1.0).float() - x.float()  # the noise as the bf16 noisy tokens hold it
    half = regularize._scaled(x, x + 1.0, 0.5)
    assert half.dtype == torch.bfloat16
    assert torch.equal(half, (x.float() + 0.5 * step).bfloat16())
