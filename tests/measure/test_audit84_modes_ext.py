"""Concurrent use of sharpness and Boolean measurements (audit 84). Another thread's
``model.train()`` and then ``model.eval()``, or its ``optimizer.step()``, between two of the
measurement's forwards gave a wrong number without a word: ShOp 1.09 or 1.12 for 0.95, a
sampled Boolean sensitivity 0.030 or 0.50 for 0.020, a LayerNorm blow-up of 1.17 for 2.05.
They now refuse, as the token-wise measurements do (``senslab._exclusive.modes_kept``);
sharpness's own perturbation of the weights does not trip the check."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from senslab.measure.boolean import boolean_sensitivity
from senslab.measure.sharpness import layernorm_blowup, loss_sharpness, output_sharpness

MODE = (r"switched to train mode while it was measured in eval mode.*forwards in train mode.*"
        r"measurement is not counted, also where the mode was switched back.*"
        r"senslab\.measure\.exclusive")
STEP = (r"parameters were changed while it was measured \(1\.weight.*optimizer\.step\(\).*"
        r"measurement is not counted.*senslab\.measure\.exclusive")


def _model(n_in: int = 3 * 8 * 8, n_out: int = 4) -> nn.Module:
    torch.manual_seed(0)  # test-only: nn.Linear initialises from the global RNG
    return nn.Sequential(nn.Flatten(), nn.Linear(n_in, 32), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(32, n_out)).eval()


def _x() -> torch.Tensor:
    return torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def _in_another_thread(fn) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def _beside(model: nn.Module, kind: str, inputs: torch.Tensor):
    """A forward hook on ``model[1]``: at the measurement's 4th forward another thread runs
    ``model.train()`` (at its 6th ``model.eval()``), or one training step of SGD."""
    calls = [0]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)

    def step() -> None:
        with torch.inference_mode(False), torch.enable_grad():
            opt.zero_grad()
            model(inputs).float().logsumexp(-1).mean().backward()
            opt.step()

    def hook(*_: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # the training thread's own forward
        calls[0] += 1
        if kind == "mode" and calls[0] == 4:
            _in_another_thread(model.train)
        elif kind == "mode" and calls[0] == 6:
            _in_another_thread(model.eval)
        elif kind == "step" and calls[0] == 4:
            _in_another_thread(step)

    return model[1].register_forward_hook(hook), calls


def _no_watch_left(model: nn.Module) -> bool:
    return not any(type(h).__name__ == "_ModeHook"
                   for m in model.modules() for h in m._forward_pre_hooks.values())


@pytest.mark.parametrize("kind", ["mode", "step"])
def test_output_sharpness_refuses_another_threads_switch_or_step(kind: str) -> None:
    """Before: ShOp 1.089 (a switch and back) or 1.123 (a step) for 0.948, no warning."""
    model, x = _model(), _x()
    handle, calls = _beside(model, kind, x)
    try:
        with pytest.raises(RuntimeError, match=MODE if kind == "mode" else STEP):
            output_sharpness(model, x, sigma_w=0.05, repeats=8, generator=0)
    finally:
        handle.remove()
    assert calls[0] > 6  # the switch back came before the measurement's last forward
    assert not model.training and _no_watch_left(model)


@pytest.mark.parametrize("kind", ["mode", "step"])
def test_loss_sharpness_refuses_another_threads_switch_or_step(kind: str) -> None:
    """Before: -0.0032 (a switch and back) or 0.0118 (a step) for 0.0053, no warning."""
    model, x = _model(), _x()
    y = torch.randint(0, 4, (16,), generator=torch.Generator().manual_seed(2))
    handle, _ = _beside(model, kind, x)
    try:
        with pytest.raises(RuntimeError, match=MODE if kind == "mode" else STEP):
            loss_sharpness(model, nn.functional.cross_entropy, x, y, sigma=0.05, draws=8,
                           generator=0)
    finally:
        handle.remove()
    assert not model.training and _no_watch_left(model)


@pytest.mark.parametrize("kind", ["mode", "step"])
def test_boolean_sensitivity_refuses_another_threads_switch_or_step(kind: str) -> None:
    """Before: 0.0301 (a switch and back) or 0.503 (a step) for 0.0199, no warning."""
    model = _model(8, 1)
    handle, calls = _beside(model, kind, torch.ones(4, 8))
    try:
        with pytest.raises(RuntimeError, match=MODE if kind == "mode" else STEP):
            boolean_sensitivity(model, 8, method="sample", num_samples=200, chunk_size=90,
                                output="real", generator=0)
    finally:
        handle.remove()
    assert calls[0] > 6
    assert not model.training and _no_watch_left(model)


def test_layernorm_blowup_refuses_a_switch_and_back_within_its_forward() -> None:
    """Before: a train() before the Dropout and an eval() after the LayerNorm, both in another
    thread within the one forward, gave 1.168 for 2.050 (example 0), no warning."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.LayerNorm(16),
                          nn.Linear(16, 4)).eval()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    alone = layernorm_blowup(model, x)
    handles = [model[1].register_forward_pre_hook(lambda *_: _in_another_thread(model.train)),
               model[2].register_forward_hook(lambda *_: _in_another_thread(model.eval))]
    try:
        with pytest.raises(RuntimeError, match=MODE):
            layernorm_blowup(model, x)
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(layernorm_blowup(model, x), alone)  # nothing left behind


def test_sharpness_own_perturbation_and_another_threads_plain_forward_pass() -> None:
    """Valid use is not refused: sharpness's own swapped-in and in-place (aliased) weights move
    no parameter's version counter, and a thread that only runs the model (in eval mode)
    during the measurement changes nothing of it: the numbers are those measured alone."""
    x = _x()
    alone = output_sharpness(_model(), x, sigma_w=0.05, repeats=4, generator=0).shop.estimate
    model = _model()
    seen: list[bool] = []

    def beside(*_: object) -> None:
        if not seen:
            seen.append(True)
            _in_another_thread(lambda: model(x[:2]))

    handle = model[1].register_forward_hook(beside)
    try:
        shop = output_sharpness(model, x, sigma_w=0.05, repeats=4, generator=0).shop.estimate
    finally:
        handle.remove()
    assert seen and shop == alone
    # aliased parameters (a module keeps a view of its weight): the noise is written in place
    aliased = _model()
    aliased[4].w_t = aliased[4].weight.t()
    kept = aliased[4].weight.detach().clone()
    assert output_sharpness(aliased, x, sigma_w=0.05, repeats=4, generator=0).shop.estimate \
        == pytest.approx(alone)
    assert torch.equal(aliased[4].weight, kept)


def test_a_step_refused_by_sharpness_is_said_to_be_undone() -> None:
    """The other thread's step wrote into the perturbed weights, which sharpness put back: the
    refusal says the step is undone, and it is (the weights are those from before it)."""
    model, x = _model(), _x()
    before = [p.detach().clone() for p in model.parameters()]
    handle, _ = _beside(model, "step", x)
    try:
        with pytest.raises(RuntimeError, match=r"the step is undone"):
            output_sharpness(model, x, sigma_w=0.05, repeats=8, generator=0)
    finally:
        handle.remove()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
