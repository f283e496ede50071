"""A measurement in eval mode whose model another thread switches to train mode (a training
loop's model.train() beside the measuring thread) is refused, the batch not counted: its copies
ran with dropout, and the number came out 0.55 for 0.20 without a word."""

import threading

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.tokens import Patches


def _model() -> nn.Module:
    torch.manual_seed(0)  # test-only: nn.Linear initialises from the global RNG
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(32, 4))


def test_a_switch_to_train_mode_during_the_measurement_is_refused() -> None:
    model = _model()
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    metric = TokenSensitivity(model, Patches(4), sigma=0.5, repeats=2, generator=0,
                              precision="float32")
    metric.update(x)
    before = metric.compute()

    switched = threading.Event()

    def train_beside(*_: object) -> None:  # what a training thread's model.train() does
        if not switched.is_set():
            switched.set()
            t = threading.Thread(target=model.train)
            t.start()
            t.join()

    hook = model[1].register_forward_hook(train_beside)
    with pytest.raises(RuntimeError, match=r"switched to train mode while it was measured.*"
                                           r"senslab\.measure\.exclusive"):
        metric.update(x)
    hook.remove()
    assert switched.is_set()
    after = metric.compute()  # the refused batch added nothing
    assert (after.estimate, after.num_examples) == (before.estimate, before.num_examples)
    assert model.training  # the caller's mode is the caller's: the measurement restores its own


def test_a_model_left_in_eval_mode_measures_as_before() -> None:
    model = _model().train()
    x = torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    metric = TokenSensitivity(model, Patches(4), sigma=0.5, repeats=2, generator=0,
                              precision="float32")
    metric.update(x)
    assert metric.compute().num_examples == 8 and model.training
