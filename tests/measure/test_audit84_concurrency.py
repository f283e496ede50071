"""Concurrent use (audit 84). Another thread's ``model.train()`` and then ``model.eval()`` between
two of a measurement's forwards ran the copies in between with dropout, and the measurement
counted them without a word (0.082 for 0.074): the mode was checked at the batch's end only,
where it was back. Each forward's mode is now read at each module's call. Another thread's
``optimizer.step()`` inside a batch (0.195 for 0.074) is refused too: the parameters' versions."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from senslab._exclusive import forward_hooks
from senslab.measure import TokenSensitivity
from senslab.tokens import Patches


def _model() -> nn.Module:
    torch.manual_seed(0)  # test-only: nn.Linear initialises from the global RNG
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(32, 4))


def _x() -> torch.Tensor:
    return torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def _metric(model: nn.Module, **kw: object) -> TokenSensitivity:
    return TokenSensitivity(model, Patches(4), sigma=0.5, repeats=2, generator=0,
                            precision="float32", chunk_size=8, **kw)


def _in_another_thread(fn) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join()


@pytest.mark.parametrize("eval_mode", [True, False])
def test_a_switch_and_a_switch_back_inside_one_batch_is_refused(eval_mode: bool) -> None:
    model, x = _model(), _x()
    if not eval_mode:
        model.eval()  # measured in its own (eval) mode
    mode = model.training
    metric = _metric(model, eval_mode=eval_mode)
    metric.update(x)  # the first batch (checked forwards) measures as before
    before = metric.compute()
    calls = [0]

    def beside(*_: object) -> None:  # a training thread's model.train(), later its model.eval()
        calls[0] += 1
        if calls[0] == 2:
            _in_another_thread(model.train)
        elif calls[0] == 4:
            _in_another_thread(model.eval)

    hook = model[1].register_forward_hook(beside)
    try:
        with pytest.raises(RuntimeError, match=r"switched to train mode while it was measured "
                                               r"in eval mode.*switched back.*"
                                               r"senslab\.measure\.exclusive"):
            metric.update(x)
    finally:
        hook.remove()
    assert calls[0] > 4  # the switch back came before the batch's last forward
    after = metric.compute()  # the refused batch added nothing
    assert (after.estimate, after.num_examples) == (before.estimate, before.num_examples)
    assert model.training is mode  # the caller's mode, put back
    assert not any(type(h).__name__ == "_ModeHook"  # no watch left behind
                   for m in model.modules() for h in m._forward_pre_hooks.values())


def test_another_threads_forward_in_train_mode_is_not_the_measurements() -> None:
    """A thread that runs the model itself, in its own mode, is not refused: only the
    measurement's forwards are read. Here the model's mode never changes: a forward of another
    thread during the measurement finds it in eval mode and passes, the measurement counts."""
    model, x = _model(), _x()
    metric = _metric(model)
    metric.update(x)
    seen: list[bool] = []

    def beside(module: nn.Module, *_: object) -> None:
        if not seen:
            seen.append(True)
            _in_another_thread(lambda: model(x[:2]))

    hook = model[1].register_forward_hook(beside)
    try:
        metric.update(x)
    finally:
        hook.remove()
    assert metric.compute().num_examples == 32


def test_the_mode_watch_is_no_hook_a_traced_copy_misses() -> None:
    """The watch's hooks change no output: :func:`forward_hooks` (a static int8 copy's test
    and fingerprint, a reuse path's) does not count them, so a model measured with them is
    treated as one without hooks."""
    model, x = _model().eval(), _x()
    during: list[tuple[set[tuple[str, int]], set[tuple[str, int]]]] = []

    def look(*_: object) -> None:
        watch = {(name, i) for name, m in model.named_modules()
                 for i, h in m._forward_pre_hooks.items() if type(h).__name__ == "_ModeHook"}
        during.append((watch, set(forward_hooks(model))))

    hook = model[4].register_forward_hook(look)
    try:
        _metric(model).update(x)
    finally:
        hook.remove()
    assert during and all(watch and not watch & found for watch, found in during)


def test_another_threads_optimizer_step_inside_one_batch_is_refused() -> None:
    """Before: a training thread's optimizer.step() between two of a later batch's forwards
    (the first batch checked) gave its copies other weights than its clean forward's, and the
    batch was counted: 0.195 for 0.074."""
    model, x = _model().eval(), _x()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    metric = _metric(model)
    metric.update(x)
    before = metric.compute()
    calls = [0]

    def step() -> None:
        with torch.enable_grad():
            opt.zero_grad()
            model(x).logsumexp(1).mean().backward()
            opt.step()

    def beside(*_: object) -> None:
        calls[0] += 1
        if calls[0] == 2:
            _in_another_thread(step)

    hook = model[1].register_forward_hook(beside)
    try:
        with pytest.raises(RuntimeError, match=r"parameters were changed while it was measured "
                                               r"\(1\.weight.*optimizer\.step\(\).*"
                                               r"senslab\.measure\.exclusive"):
            metric.update(x)
    finally:
        hook.remove()
    after = metric.compute()
    assert (after.estimate, after.num_examples) == (before.estimate, before.num_examples)
