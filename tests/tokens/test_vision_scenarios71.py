"""A researcher measuring their own image model in three lines (session 71): the scenarios that
returned a misleading number or failed unhelpfully, and the hand checks of the patch borders and
of batches split over ``update`` calls."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab import Patches, TokenSensitivity, token_sensitivity
from senslab.models import create_model


def _resnet() -> nn.Module:
    """A small zoo ResNet whose BatchNorms hold trained-like statistics and affine weights (a
    fresh one's are 0/1, which folding leaves exact in any precision)."""
    model = create_model("resnet18", width=0.125, image_size=16, num_classes=2)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) * 2 + 0.05)
                m.weight.copy_(torch.randn(m.num_features, generator=g) * 0.7 + 1)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.3)
    return model.eval()


def test_resnet_local_reuse_under_autocast_runs_the_forwards_own_operations():
    """Under bf16 autocast ResNet-18's local reuse ran its convolutions with the BatchNorms
    folded in, rounded to bf16 after the scale where the forward rounds before: a zero-noise
    copy came out up to 23% of its largest logit away from the clean forward (a trained
    network), so near-ties flipped without noise — per-example flip rates of 0.88 against the
    full forwards' 0.62, without a word — or whole batches were refused as batch-dependent.
    Now a copy with zero noise is the clean forward exactly, and the flips are the full
    forwards'."""
    model = _resnet()
    x = torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad(), Patches(4).bind(model, x) as bound:
        assert bound.reuse
        t = bound.num_tokens
        src = torch.arange(6).repeat_interleave(t)
        tok = torch.arange(t).repeat(6)
        zero = torch.zeros(len(src), bound.dim)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            clean = model(x).float()[src]
            copies = bound.forward_perturbed(src, tok, zero).float()
    assert torch.equal(copies, clean)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reuse, full = (token_sensitivity(model, x, Patches(4, reuse_local=r), sigma=0.5,
                                         autocast=torch.bfloat16) for r in (True, False))
    assert torch.equal(reuse.per_sample, full.per_sample)


def test_resnet_local_reuse_still_folds_in_float32(monkeypatch):
    """The fold stays where it is exact up to float32 rounding (no autocast)."""
    model = _resnet()
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1
    calls = []
    conv2d = torch.nn.functional.conv2d

    def counted(inp, weight, *args, **kwargs):
        calls.append(weight)
        return conv2d(inp, weight, *args, **kwargs)

    with torch.no_grad(), Patches(4).bind(model, x) as bound:
        cache, rows = bound._local(torch.arange(3))
        folded = {id(w) for w, _ in cache["folded"].values()}
        monkeypatch.setattr(torch.nn.functional, "conv2d", counted)
        bound.forward_perturbed(torch.arange(3), torch.zeros(3, dtype=torch.long),
                                torch.zeros(3, bound.dim))
    assert folded and any(id(w) in folded for w in calls)


def test_a_model_on_the_meta_device_is_refused_with_the_fix():
    """A model built on 'meta' (no weights loaded) was told to move the images to 'meta'; with
    meta images too, or one layer left on meta, PyTorch failed inside the forward ('unknown
    device type for autocast', 'Tensor on device meta is not on the expected device cpu')."""
    x = torch.rand(2, 1, 28, 28)
    model = create_model("cnn", channels=(4, 8), hidden=16).to("meta")
    for images in (x, x.to("meta")):
        with pytest.raises(ValueError, match="'meta' device: they have shapes but no values") \
                as err:
            token_sensitivity(model, images, Patches(4), sigma=1.0)
        assert "load_state_dict" in str(err.value) and "inputs.to('meta')" not in str(err.value)
    part = create_model("cnn", channels=(4, 8), hidden=16)
    part.net[-1].to("meta")
    with pytest.raises(ValueError, match=r"'net\.8\.weight', 'net\.8\.bias' are on the 'meta'"):
        token_sensitivity(part, x, Patches(4), sigma=1.0)
    with pytest.raises(ValueError, match="the inputs are on the 'meta' device"):
        token_sensitivity(create_model("cnn", channels=(4, 8), hidden=16), x.to("meta"),
                          Patches(4), sigma=1.0)


def test_noise_on_patch_k_changes_only_the_pixels_of_patch_k():
    """By hand, for a non-square image, a channels-last memory format and channels-last
    images: the copy the model gets differs from its clean image on patch k alone (row
    k // (W/p), column k % (W/p)), by exactly the noise drawn, laid out (C, p, p)."""
    seen: list[torch.Tensor] = []

    class Capture(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(x.detach().clone())
            return x.flatten(1)[:, :3] * self.scale

    g = torch.Generator().manual_seed(2)
    for shape, p, last, fmt in (((2, 3, 8, 12), 4, False, torch.contiguous_format),
                                ((2, 3, 8, 12), 4, False, torch.channels_last),
                                ((2, 1, 12, 8), 2, False, torch.contiguous_format),
                                ((2, 8, 12, 3), 4, True, torch.contiguous_format)):
        x = torch.rand(*shape, generator=g).contiguous(memory_format=fmt)
        chw = x.permute(0, 3, 1, 2) if last else x
        c, h, w = chw.shape[1:]
        with torch.no_grad(), Patches(p, channels_last=last).bind(Capture(), x) as bound:
            for k in range(bound.num_tokens):
                noise = torch.randn(1, bound.dim, generator=g)
                bound.forward_perturbed(torch.tensor([1]), torch.tensor([k]), noise)
                got = seen[-1].permute(0, 3, 1, 2) if last else seen[-1]
                diff = got[0] - chw[1]
                r, col = divmod(k, w // p)
                inside = diff[:, r * p:(r + 1) * p, col * p:(col + 1) * p]
                assert torch.allclose(inside, noise.view(c, p, p), atol=1e-6)
                diff[:, r * p:(r + 1) * p, col * p:(col + 1) * p] = 0
                assert not diff.any(), (shape, k)


@pytest.mark.parametrize("name,kw", [
    ("cnn", dict(channels=(4, 8), hidden=16, image_size=16, in_channels=3)),
    ("resnet18", dict(width=0.125, image_size=16)),
])
def test_one_batch_or_two_updates_with_local_reuse_give_the_same_numbers(name, kw):
    """Same seed, same numbers: one batch, two halves or uneven parts through ``update``, with
    local reuse on or off."""
    model = create_model(name, **kw).eval()
    x = torch.rand(10, 3, 16, 16, generator=torch.Generator().manual_seed(4)) * 2 - 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = token_sensitivity(model, x, Patches(4), sigma=5.0)
        full = token_sensitivity(model, x, Patches(4, reuse_local=False), sigma=5.0)
        for cut in (5, 3):
            metric = TokenSensitivity(model, Patches(4), sigma=5.0)
            metric.update(x[:cut])
            metric.update(x[cut:])
            parts = metric.compute()
            assert torch.equal(parts.per_sample, one.per_sample)
            assert parts.estimate == one.estimate
    assert one.estimate > 0 and torch.equal(one.per_sample, full.per_sample)
