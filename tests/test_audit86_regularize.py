"""Audit 86: sensitivity regularization — the noisy forward and BatchNorm's running statistics."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from senslab.tokens import Sequence
from senslab.train.regularize import (
    random_patch_noise,
    sensitivity_penalty,
    sensitivity_regularized_loss,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _image(norm: str = "batch", momentum: float | None = 0.1) -> nn.Module:
    layer = (nn.BatchNorm2d(4, momentum=momentum) if norm == "batch" else
             nn.InstanceNorm2d(4, affine=True, track_running_stats=True, momentum=momentum))
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), layer, nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 8 * 8, 3))


class _Vectors(nn.Module):
    """(B, T, D) vectors, a BatchNorm1d over the flattened sequence, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(5 * 6)
        self.head = nn.Linear(5 * 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(x.flatten(1))))


_CASES = {
    "patches-batchnorm": (lambda: _image("batch"), (8, 3, 8, 8), {"patch": 4}),
    "patches-cumulative": (lambda: _image("batch", None), (8, 3, 8, 8), {"patch": 4}),
    "patches-instancenorm": (lambda: _image("instance"), (8, 3, 8, 8), {"patch": 4}),
    "vectors": (_Vectors, (8, 5, 6), {"tokens": Sequence()}),
}


@pytest.mark.parametrize("case", sorted(_CASES))
@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_the_noisy_forward_leaves_running_statistics_to_the_clean_batch(case: str,
                                                                        alpha: float) -> None:
    """Before: at alpha > 0 the noisy forward ran as a training forward of its own, so every
    train-mode BatchNorm took the noisy batch into its running statistics (num_batches_tracked
    2 per step, half the updates noisy): a CNN regularized on Fashion-MNIST (σ = 3, 7×7
    patches) kept a first-layer running variance 1.42× its clean data's, its eval loss 6% above
    the same weights' with clean statistics. Now the running statistics are exactly those a
    clean training forward leaves."""
    build, shape, kw = _CASES[case]
    torch.manual_seed(0)  # test-only: init
    model = build().train()
    reference = copy.deepcopy(model)
    x = 0.5 * torch.randn(*shape, generator=_gen(1)) + 0.3
    sensitivity_regularized_loss(model, x, torch.arange(shape[0]) % 3, alpha=alpha, sigma=3.0,
                                 generator=_gen(2), **kw)
    with torch.no_grad():
        reference(x)  # one clean training forward
    got, want = dict(model.named_buffers()), dict(reference.named_buffers())
    assert got.keys() == want.keys() and got
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_training_is_unchanged_but_for_the_running_statistics() -> None:
    """The loss, its gradients and three SGD steps (by hand) are those of a reference whose noisy
    forward runs the same parameters on copies of the buffers (torch.func.functional_call): the
    noisy branch still normalises with its own batch statistics and its gradient still flows; only
    the running statistics differ from before (they take in the clean batches alone)."""
    torch.manual_seed(0)  # test-only: init
    model = _image().train()
    ref = copy.deepcopy(model)
    g, g_ref = _gen(2), _gen(2)
    x, y = torch.randn(8, 3, 8, 8, generator=_gen(1)), torch.arange(8) % 3
    for _ in range(3):
        loss, parts = sensitivity_regularized_loss(model, x, y, alpha=0.5, patch=4, sigma=1.0,
                                                   generator=g)
        clean = ref(x)
        x_noisy = random_patch_noise(x, 4, 1.0, g_ref)
        params = dict(ref.named_parameters())
        buffers = {k: b.clone() for k, b in ref.named_buffers()}
        noisy = functional_call(ref, (params, buffers), (x_noisy,))
        mse = F.mse_loss(noisy, clean)
        want = 0.5 * F.cross_entropy(clean, y) + 0.5 * mse
        torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(parts["mse"], mse.detach(), rtol=1e-6, atol=1e-7)
        for net, lo in ((model, loss), (ref, want)):
            net.zero_grad()
            lo.backward()
        for (k, a), b in zip(model.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=k)
        with torch.no_grad():  # an SGD step (torch.optim's first use imports torch._dynamo)
            for p in [*model.parameters(), *ref.parameters()]:
                p -= 0.1 * p.grad
    for (k, a), b in zip(model.state_dict().items(), ref.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=k)
    assert int(model[1].num_batches_tracked) == 3


def test_the_penalty_alone_leaves_running_statistics_to_the_clean_batch() -> None:
    """sensitivity_penalty (a loop's own loss) runs the same two forwards: before, its noisy
    forward moved a train-mode BatchNorm's running mean towards the noisy batch too."""
    torch.manual_seed(0)  # test-only: init
    model = _image().train()
    reference = copy.deepcopy(model)
    x = torch.randn(8, 3, 8, 8, generator=_gen(1))
    penalty, clean = sensitivity_penalty(model, x, patch=4, sigma=3.0, generator=_gen(2))
    (penalty + clean.sum()).backward()  # the restored buffers do not break the backward
    assert model[0].weight.grad.abs().sum() > 0
    with torch.no_grad():
        reference(x)
    assert torch.equal(model[1].running_mean, reference[1].running_mean)
    assert torch.equal(model[1].running_var, reference[1].running_var)
    assert int(model[1].num_batches_tracked) == 1


def test_an_eval_mode_model_and_the_value_and_gradient_of_the_penalty() -> None:
    """In eval mode nothing is updated either way; the penalty is MSE(f(x̃), f(x)) with x̃ the
    noise the generator draws, and its gradient matches central differences (float64)."""
    torch.manual_seed(0)  # test-only: init
    model = _image().double().eval()
    x = torch.randn(5, 3, 8, 8, generator=_gen(1), dtype=torch.float64)
    before = {k: b.clone() for k, b in model.named_buffers()}
    penalty, _ = sensitivity_penalty(model, x, patch=4, sigma=0.7, generator=_gen(3))
    x_noisy = random_patch_noise(x, 4, 0.7, _gen(3))
    torch.testing.assert_close(penalty, F.mse_loss(model(x_noisy), model(x)), rtol=0, atol=0)
    penalty.backward()
    for k, b in model.named_buffers():
        assert torch.equal(b, before[k]), k
    w = model[0].weight
    for idx in [(0, 0, 0, 0), (1, 2, 1, 2), (3, 1, 2, 0)]:
        values = []
        for step in (1e-6, -1e-6):
            with torch.no_grad():
                w[idx] += step
                values.append(sensitivity_penalty(model, x, patch=4, sigma=0.7,
                                                  generator=_gen(3))[0].item())
                w[idx] -= step
        fd = (values[0] - values[1]) / 2e-6
        assert abs(fd - w.grad[idx].item()) <= 1e-6 * max(1.0, abs(fd)), idx
