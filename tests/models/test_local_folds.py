"""ResNet's local reuse keeps its folded convolutions (a BatchNorm folded into the convolution
before it) across ``local_cache`` calls, and folds a layer again as soon as its weights or
statistics change: a stale fold would give every later measurement the old model's flips."""

from __future__ import annotations

import torch
from torch import nn

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Patches

from .test_local_reuse import assert_same_gradients, every_patch, perturbed_full, resnet
from .test_winograd import wide_resnet


def folds(cache):
    return {m: f[0] for m, f in cache["folded"].items()}


def local_and_full(model, x, patch=4, seed=1):
    """Every patch of every image of ``x`` replaced by noise: forward_local's and full forwards'
    logits."""
    rows, top, left = every_patch(len(x), x.shape[-1], patch)
    noisy = torch.randn(len(rows), 3, patch, patch, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        cache = model.local_cache(x, patch)
        fast = model.forward_local(cache, rows, top, left, noisy)
        full = perturbed_full(model, x, rows, top, left, noisy)
    return cache, fast, full


def assert_close(fast, full):
    torch.testing.assert_close(fast, full, rtol=1e-4, atol=1e-6 * float(full.abs().max()))


def test_the_fold_is_kept_until_a_running_mean_changes_in_place():
    model = resnet(16, stats=True, sens_patch=4)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    first, fast, full = local_and_full(model, x)
    assert_close(fast, full)
    again, _, _ = local_and_full(model, x)
    kept = folds(first)
    assert len(kept) > 4
    assert all(again["folded"][m][0] is w for m, w in kept.items())  # nothing folded again
    layer = model.features[0]  # the stem's convolution and BatchNorm: every copy reads it
    with torch.no_grad():
        layer[1].running_mean.add_(0.5)  # in place, as load_state_dict or a training step
    after, fast, full = local_and_full(model, x)
    assert_close(fast, full)  # no stale fold: the window agrees with the full forward again
    assert after["folded"][layer][0] is not kept[layer]
    assert all(after["folded"][m][0] is w for m, w in kept.items() if m is not layer)
    assert not torch.allclose(fast, local_and_full(resnet(16, stats=True, sens_patch=4), x)[1],
                              atol=1e-3)  # the change did move the logits


def test_changes_no_version_counts_still_fold_again():
    """An edit through ``.data`` and BatchNorm's own update of its running statistics in a
    train-mode forward leave the statistics' version counters as they were; the values are
    compared too."""
    model = resnet(16, stats=True, sens_patch=4)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    layer = model.features[0]
    norm = layer[1]
    kept = local_and_full(model, x)[0]["folded"][layer][0]
    assert local_and_full(model, x)[0]["folded"][layer][0] is kept  # unchanged: kept
    norm.running_var.data.mul_(4.0)
    after, fast, full = local_and_full(model, x)
    assert_close(fast, full)
    assert after["folded"][layer][0] is not kept
    norm.momentum = None  # a cumulative average: the statistics move by a whole batch's worth
    norm.train()
    with torch.no_grad():
        norm(torch.randn(8, norm.num_features, 4, 4) * 3 + 2)
    norm.eval()
    _, fast, full = local_and_full(model, x)
    assert_close(fast, full)


def test_a_measurement_follows_a_running_mean_changed_between_updates():
    """One metric over a training loop (updates between steps): the second update, of the same
    input shape (verified once), runs after the BatchNorms' running means changed in place, and
    gets the flips of full forwards, not those of the folds of the first update."""
    model = resnet(16, sens_patch=4)
    x = torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    opts = {"sigma": 1.0, "repeats": 2, "generator": 2, "precision": "float32"}
    fast = TokenSensitivity(model, Patches(4), **opts)
    full = TokenSensitivity(model, Patches(4, reuse_local=False), **opts)
    for m in (fast, full):
        m.update(x)
    kept = dict(model.__dict__["_folds"])
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.add_(torch.linspace(-0.5, 0.5, m.num_features))
    for m in (fast, full):
        m.reset()  # the noise stream goes on, the same for both
        m.update(x)
    after = full.compute()
    assert 0.02 < after.estimate < 0.98
    assert torch.equal(fast.compute().per_sample, after.per_sample)
    now = model.__dict__["_folds"]
    assert all(now[m][2] is not kept[m][2] for m in kept if kept[m][2] is not None)


def test_a_gradient_through_forward_local_after_a_measurement():
    """A measurement runs in inference mode, so the folds and Winograd filters it made are
    inference tensors, which autograd cannot save: a gradient through ``forward_local``
    afterwards makes its own (it failed with "Inference tensors cannot be saved for
    backward")."""
    model = wide_resnet()
    x = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    token_sensitivity(model, x, Patches(4), sigma=1.0, precision="float32")
    assert model.__dict__.get("_winograd_filters")
    assert_same_gradients(model, 32, [0, 16], [4, 28])
