"""Audit 85 (corruptions): an alpha channel under brightness, and hints that misled.

* RGBA (or grey + alpha) images went through brightness without a word: HSV's value was taken
  over the alpha channel too, an opaque alpha (1) was the brightest, so no severity brightened
  anything and "brightness" accuracy was the clean accuracy.
* Float images holding 0..255 values, images a bicubic resize carried a little past [0, 1] and
  images with an infinite pixel were all told to load with normalize='none' or to denormalize.
* One grey image (H, W) was told to add a channel axis with x.unsqueeze(1); followed twice, as
  the second message repeats it, that made H one-row images (H, 1, 1, W), corrupted row by row.
* A NumPy array was told to add axes with unsqueeze, which it lacks.
* create_dataset("corrupted", severity=np.int64(2)) recorded NumPy's int64 in meta, where
  json.dumps failed; cifar10c records an int.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from senslab.data import create_dataset
from senslab.data.corruptions import corrupt


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rgb(n: int = 2, side: int = 16) -> torch.Tensor:
    return torch.rand(n, 3, side, side, generator=_gen(1)) * 0.7


@pytest.mark.parametrize("channels", [2, 4])
def test_brightness_refuses_an_alpha_channel_it_read_as_the_brightest(channels: int) -> None:
    colour = _rgb()[:, : channels - 1]
    images = torch.cat([colour, torch.ones_like(colour[:, :1])], 1)  # opaque alpha
    keep = "images\\[:, :3\\]" if channels == 4 else "images\\[:, :1\\]"
    with pytest.raises(ValueError, match=rf"brightness .*needs 1 \(grey\) or 3 \(RGB\) channels, "
                                         rf"got {channels}; .*alpha.*{keep}.*torch\.cat"):
        corrupt(images, "brightness", 5, _gen())
    # the fix named: corrupt the colour channels, put the alpha back
    out = torch.cat([corrupt(images[:, : channels - 1], "brightness", 5, _gen()),
                     images[:, channels - 1:]], 1)
    assert (out[:, : channels - 1] - colour).abs().max() > 0.25  # severity 5 adds 0.3 to v
    assert torch.equal(out[:, -1], images[:, -1])


def test_jpeg_names_how_to_set_the_alpha_channel_aside() -> None:
    images = torch.cat([_rgb(), torch.ones(2, 1, 16, 16)], 1)
    with pytest.raises(ValueError, match=r"jpeg_compression .*1 \(grey\) or 3 \(RGB\) channels, "
                                         r"got 4; .*images\[:, :3\].*images\[:, 3:\]"):
        corrupt(images, "jpeg_compression", 1, _gen())
    with pytest.raises(ValueError, match=r"got 5; pass the grey or RGB channels only"):
        corrupt(torch.rand(2, 5, 8, 8), "brightness", 1, _gen())


@pytest.mark.parametrize("name", ["gaussian_noise", "contrast", "motion_blur"])
def test_other_corruptions_still_take_any_channel_count(name: str) -> None:
    x = torch.rand(2, 4, 8, 8, generator=_gen())
    assert corrupt(x, name, 3, _gen()).shape == x.shape


def test_float_pixels_in_0_255_are_told_to_divide_not_to_denormalize() -> None:
    x8 = torch.randint(0, 256, (2, 3, 8, 8), generator=_gen()).float()
    with pytest.raises(ValueError, match=r"got values in \[0, 255\]; .*images / 255") as err:
        corrupt(x8, "contrast", 1, _gen())
    assert "denormalize" not in str(err.value)
    assert corrupt(x8 / 255, "contrast", 1, _gen()).max() <= 1


def test_a_resize_overshoot_is_told_to_clamp() -> None:
    digits = (torch.rand(2, 1, 28, 28, generator=_gen()) > 0.5).float()
    big = F.interpolate(digits, size=32, mode="bicubic", align_corners=False)
    lo, hi = float(big.min()), float(big.max())
    assert lo < 0 and hi > 1
    with pytest.raises(ValueError, match=rf"got values in \[{lo:.4g}, {hi:.4g}\]; .*"
                                         r"denormalize.*resize.*images\.clamp\(0, 1\)"):
        corrupt(big, "gaussian_blur", 1, _gen())
    # normalised images keep their hint
    with pytest.raises(ValueError, match=r"got values in \[-1, 1\]; normalised images: load with "
                                         r"normalize='none'"):
        corrupt(torch.tensor([-1.0, 1.0]).view(1, 1, 1, 2), "contrast", 1, _gen())


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_infinite_pixels_are_named_as_such(bad: float) -> None:
    x = torch.rand(2, 1, 8, 8, generator=_gen())
    x[1, 0, 3, 3] = bad
    with pytest.raises(ValueError, match=r"NaN or infinite pixels.*nan_to_num") as err:
        corrupt(x, "contrast", 1, _gen())
    assert "normalize='none'" not in str(err.value)


def test_one_grey_image_is_told_to_become_a_batch_of_one() -> None:
    img = torch.rand(28, 28, generator=_gen())
    with pytest.raises(ValueError, match=r"got \(28, 28\); one grayscale image \(H, W\) becomes "
                                         r"a batch of one with x\[None, None\]") as err:
        corrupt(img, "gaussian_blur", 5, _gen())
    assert "unsqueeze(1)" not in str(err.value)
    # the old hint, followed twice, ran on 28 one-row images: not the same blur
    rows = corrupt(img.unsqueeze(1).unsqueeze(1), "gaussian_blur", 5, _gen())
    right = corrupt(img[None, None], "gaussian_blur", 5, _gen())
    assert (rows.reshape(28, 28) - right.reshape(28, 28)).abs().max() > 0.1
    with pytest.raises(ValueError, match=r"frames \(N, T, C, H, W\) pass x\.flatten\(0, 1\)"):
        corrupt(torch.rand(2, 3, 1, 8, 8), "contrast", 1, _gen())
    with pytest.raises(ValueError, match=r"x\.unsqueeze\(0\) for one image \(C, H, W\)"):
        corrupt(torch.rand(3, 8, 8), "contrast", 1, _gen())  # the 3-D hint is kept


def test_corrupted_dataset_records_a_numpy_severity_as_an_int() -> None:
    ds = create_dataset("corrupted", split="test", base="digits", corruption="contrast",
                        severity=np.int64(2), normalize="none")
    assert type(ds.meta["severity"]) is int and ds.meta["severity"] == 2
    json.dumps({k: v for k, v in ds.meta.items() if k in ("severity", "corruption", "seed")})


def test_a_numpy_array_is_told_to_become_a_tensor_not_to_unsqueeze() -> None:
    """CIFAR-10-C's .npy arrays (uint8 (N, H, W, C)) were told to add an axis with
    x.unsqueeze, a method NumPy arrays lack, whatever their shape."""
    arr = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    with pytest.raises(TypeError, match=r"torch tensor .*got numpy\.ndarray of shape "
                                        r"\(2, 8, 8, 3\); convert it with torch\.as_tensor") as err:
        corrupt(arr, "contrast", 1, _gen())  # type: ignore[arg-type]
    assert "unsqueeze" not in str(err.value)
    # the conversion named runs
    x = torch.from_numpy(arr).permute(0, 3, 1, 2).float() / 255
    assert corrupt(x, "contrast", 1, _gen()).shape == (2, 3, 8, 8)
