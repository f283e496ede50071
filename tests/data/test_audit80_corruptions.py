"""Audit 80 (corruptions): layouts that ran silently wrong, and half-precision noise rates.

* Channels-last images (N, H, W, C), as CIFAR-10-C's .npy files, PIL and NumPy hold them, were
  corrupted without a word by 10 of the 11 corruptions: rows were read as channels, so the blurs
  mixed colours, brightness took the brightest row and pixelate resampled across colours (up to
  0.99 from the (N, C, H, W) result); JPEG alone stopped, on "32 channels".
* One RGB image (3, H, W) was told to add a channel axis with ``x.unsqueeze(1)``: followed, that
  made three grey images, each brightened on its own (0.30 from the RGB result at severity 5).
  A bool image was told to divide by 255, which leaves it nearly black and still in [0, 1].
* float16 / bfloat16 images drew their noise in their own dtype: bfloat16's ``rand()`` comes in
  steps of 2⁻⁸, so impulse noise hit 1.23% of the values at severity 1 (1% asked) and 2.25% at 2.
"""

from __future__ import annotations

import pytest
import torch

from senslab.data import images as image_data
from senslab.data.corruptions import corrupt, list_corruptions

NAMES = list_corruptions()


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _images(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(*shape, generator=_gen(seed))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(2, 32, 32, 3), (2, 28, 28, 1)], ids=["rgb", "grey"])
def test_channels_last_images_are_refused_not_corrupted_across_rows(
        name: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"channels-last.*permute\(0, 3, 1, 2\)"):
        corrupt(_images(*shape), name, 3, _gen())


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_channels_first_images_still_run(channels: int) -> None:
    x = _images(2, channels, 3, 3)  # a 3-wide image with 3 channels is read channels-first
    out = corrupt(x, "contrast", 2, _gen())
    assert out.shape == x.shape
    assert torch.allclose(out, (x - x.mean((2, 3), keepdim=True)) * 0.5
                          + x.mean((2, 3), keepdim=True), atol=1e-6)


def test_one_rgb_image_is_told_to_add_a_batch_axis() -> None:
    x = _images(1, 3, 8, 8)
    with pytest.raises(ValueError, match=r"unsqueeze\(0\) for one image \(C, H, W\)"):
        corrupt(x[0], "brightness", 5, _gen())
    # the hint's fix gives the batch's result; a channel axis instead brightened each channel
    # as a grey image of its own
    assert torch.equal(corrupt(x[0].unsqueeze(0), "brightness", 5, _gen()),
                       corrupt(x, "brightness", 5, _gen()))
    grey = corrupt(x[0].unsqueeze(1), "brightness", 5, _gen()).transpose(0, 1)
    assert (grey - corrupt(x, "brightness", 5, _gen())).abs().max() > 0.1


def test_bool_images_are_not_told_to_divide_by_255() -> None:
    with pytest.raises(ValueError, match=r"bool images: images\.float\(\) alone"):
        corrupt(torch.ones(2, 1, 8, 8, dtype=torch.bool), "contrast", 1, _gen())


def test_the_range_error_names_where_denormalize_lives() -> None:
    with pytest.raises(ValueError, match=r"senslab\.data\.images\.denormalize\(x, dataset\.meta"):
        corrupt(_images(2, 1, 8, 8) * 2 - 1, "contrast", 1, _gen())
    assert callable(image_data.denormalize)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_images_are_corrupted_in_float32(name: str, dtype: torch.dtype) -> None:
    x = _images(3, 3, 16, 16).to(dtype)
    out = corrupt(x, name, 4, _gen(5))
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, corrupt(x.float(), name, 4, _gen(5)).to(dtype))


@pytest.mark.parametrize("severity, amount", [(1, 0.01), (2, 0.02)])
def test_bfloat16_impulse_noise_hits_the_asked_fraction(severity: int, amount: float) -> None:
    x = torch.full((64, 3, 32, 32), 0.5, dtype=torch.bfloat16)
    hit = (corrupt(x, "impulse_noise", severity, _gen(0)) != 0.5).double().mean().item()
    # 196,608 values: a standard error of ~2% of the fraction; the old bfloat16 draw was +23%
    assert hit == pytest.approx(amount, rel=0.08)
