"""Audit 86 (patches): a dict input's ``pixel_mask`` (DETR-style padding) and the layout of
``replace_with`` rows for channels-last images."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure import token_sensitivity
from senslab.tokens import Patches

OPTS = dict(repeats=8, generator=0)


class Masked(nn.Module):
    """A linear classifier on the real pixels: called as model(pixel_values, pixel_mask)."""

    def __init__(self, c: int = 3, h: int = 8, w: int = 8, seed: int = 1) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc = nn.Linear(c * h * w, 5)

    def forward(self, pixel_values, pixel_mask=None):
        return self.fc((pixel_values * pixel_mask[:, None].to(pixel_values.dtype)).flatten(1))


def padded(rows: int = 4, cols: int = 4, b: int = 4):
    """(B, 3, 8, 8) images whose real pixels are the top-left rows×cols, zero elsewhere."""
    x = torch.randn(b, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    pm = torch.zeros(b, 8, 8, dtype=torch.long)
    pm[:, :rows, :cols] = 1
    return x * pm[:, None], pm


def patch_mask(pm: torch.Tensor, p: int) -> torch.Tensor:
    b, h, w = pm.shape
    return pm.bool().view(b, h // p, p, w // p, p).any(4).any(2).flatten(1)


def quiet(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return token_sensitivity(*args, **kwargs)


@pytest.mark.parametrize("mode", ["token", "whole"])
def test_patches_of_padding_alone_are_no_tokens(mode):
    """Three quarters of each image padding: the padding patches were measured as tokens that
    never flip (0.078 for 0.266 in token mode)."""
    model, (x, pm) = Masked().eval(), padded()
    got = quiet(model, {"pixel_values": x, "pixel_mask": pm}, Patches(2), sigma=1.0, mode=mode,
                **OPTS)
    want = quiet(model, {"pixel_values": x, "pixel_mask": pm}, Patches(2), sigma=1.0, mode=mode,
                 mask=patch_mask(pm, 2), **OPTS)
    assert got.estimate == pytest.approx(want.estimate)
    assert torch.equal(got.per_sample, want.per_sample)
    if mode == "token":
        assert got.estimate > 0.15
        assert torch.isnan(got.per_position[[2, 3, 8, 15]]).all()  # padding positions: none


class PaddingReader(nn.Module):
    """Reads the padding pixels alone (a backbone's convolution does, near the border)."""

    def forward(self, pixel_values, pixel_mask=None):
        pad = 1 - pixel_mask[:, None].to(pixel_values.dtype)
        return (pixel_values * pad).sum(dim=(1, 2, 3))[:, None] * torch.linspace(-1, 1, 5)


@pytest.mark.parametrize("mode", ["token", "whole"])
def test_a_patch_of_real_pixels_and_padding_gets_noise_on_its_real_pixels_alone(mode):
    """Real pixels 5×5 in an 8×8 image, patches of 2: the patches of row/column 2 hold both.
    Noise on their padding moved a model that reads the padding; it stays off it now."""
    x, pm = padded(rows=5, cols=5)
    r = quiet(PaddingReader(), {"pixel_values": x, "pixel_mask": pm}, Patches(2), sigma=1.0,
              mode=mode, compare="l2", **OPTS)
    assert r.estimate == 0.0
    # the real pixels of those patches do get noise
    r = quiet(Masked(), {"pixel_values": x, "pixel_mask": pm}, Patches(2), sigma=1.0,
              mode=mode, compare="l2", **OPTS)
    assert r.estimate > 0
    if mode == "token":
        assert (r.per_position[[2, 6, 8, 9, 10]] > 0).all()  # the mixed patches
        assert r.per_position.isnan().sum() == 16 - 9  # 3×3 patches hold real pixels


def test_channels_last_images_read_the_pixel_mask_alike():
    model, (x, pm) = Masked().eval(), padded()
    nhwc = x.permute(0, 2, 3, 1).contiguous()
    got = quiet(lambda pixel_values, pixel_mask: model(pixel_values.permute(0, 3, 1, 2),
                                                       pixel_mask),
                {"pixel_values": nhwc, "pixel_mask": pm}, Patches(2, channels_last=True),
                sigma=1.0, **OPTS)
    want = quiet(model, {"pixel_values": x, "pixel_mask": pm}, Patches(2), sigma=1.0, **OPTS)
    assert torch.equal(got.per_sample, want.per_sample)


def test_a_mask_that_marks_padding_patches_real_is_refused():
    model, (x, pm) = Masked().eval(), padded()
    with pytest.raises(ValueError, match=r"mask= marks 48 patches real.*no real pixel.*"
                                         r"pixel_mask"):
        quiet(model, {"pixel_values": x, "pixel_mask": pm}, Patches(2), sigma=1.0,
              mask=torch.ones(4, 16, dtype=torch.bool), **OPTS)
    # a mask that narrows the real patches is taken as it is
    narrow = patch_mask(pm, 2).clone()
    narrow[:, 0] = False
    r = quiet(model, {"pixel_values": x, "pixel_mask": pm}, Patches(2), sigma=1.0,
              mask=narrow, **OPTS)
    assert r.per_position[0].isnan() and not r.per_position[1].isnan()


def test_a_pixel_mask_of_another_shape_or_values_is_refused():
    model, (x, pm) = Masked().eval(), padded()
    with pytest.raises(ValueError, match=r"'pixel_mask' entry is \(4, 1, 8, 8\).*mask= of shape "
                                         r"\(4, 16\)"):
        quiet(model, {"pixel_values": x, "pixel_mask": pm[:, None]}, Patches(2), sigma=1.0,
              **OPTS)
    with pytest.raises(ValueError, match=r"'pixel_mask' entry.*values other than 0 and 1"):
        quiet(model, {"pixel_values": x, "pixel_mask": pm * 2}, Patches(2), sigma=1.0, **OPTS)


def test_an_all_real_pixel_mask_measures_as_without_it():
    model = Masked().eval()
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    pm = torch.ones(4, 8, 8, dtype=torch.long)
    got = quiet(model, {"pixel_values": x, "pixel_mask": pm}, Patches(2), sigma=1.0, **OPTS)
    want = quiet(lambda pixel_values: model(pixel_values, torch.ones(len(pixel_values), 8, 8)),
                 x, Patches(2), sigma=1.0, **OPTS)
    assert torch.equal(got.per_sample, want.per_sample)


def test_replace_with_rows_of_channels_last_patches_are_in_c_p_p_order():
    """Documented: a (p, p, C) patch ``q`` of channels-last images is the row
    ``q.permute(2, 0, 1).reshape(-1)``; replacing each patch by itself then flips nothing, where
    the (p, p, C) flattening would put its values on other pixels and channels."""
    g = torch.Generator().manual_seed(0)
    block = torch.randn(1, 2, 2, 3, generator=g) * 3
    x = block.repeat(4, 4, 4, 1)
    x[:, :2, :2] = torch.randn(4, 2, 2, 3, generator=g)  # one other patch per image

    torch.manual_seed(1)
    fc = nn.Linear(192, 10)

    def model(x):  # takes (B, H, W, C)
        return fc(x.permute(0, 3, 1, 2).flatten(1))

    row = block[0].permute(2, 0, 1).reshape(1, -1)
    r = quiet(model, x, Patches(2, channels_last=True), replace_with=row, repeats=2, generator=0)
    assert torch.equal(r.per_position[1:], torch.zeros(15, dtype=r.per_position.dtype))
    wrong = quiet(model, x, Patches(2, channels_last=True), replace_with=block.reshape(1, -1),
                  repeats=2, generator=0)
    assert wrong.per_position[1:].max() > 0
    assert "permute(2, 0, 1)" in Patches.__doc__
