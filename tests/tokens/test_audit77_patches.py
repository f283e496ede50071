"""Audit 77 (patches): image corruptions for robustness experiments, and Patches' layout hint.

* ``brightness`` divided by the pixel's HSV value clamped at 1e-12 and multiplied the pixel by
  ``v_new / v``: in float16 that ratio overflows for a value below ~5e-6 (0.3 / 1e-6 → inf), so
  a dark pixel came out white (1.0 where 0.3 is right) and its zero channels NaN; in float32 a
  value below 1e-12 was divided by 1e-12 instead (1e-40 → 3e-29 instead of 0.3).
* NaN pixels passed the [0, 1] range check (comparisons with NaN are false) and came back
  spread over the whole channel (contrast) or the blur's reach, without a word.
* Integer (uint8) images were refused with a hint to add a channel axis for grayscale images,
  though the shape was right and the fix is ``images.float() / 255``.
* ``list_corruptions("digtal")`` (a misspelt family) returned an empty list: a robustness loop
  over it measured nothing, silently.
* ``create_dataset("corrupted", severity=6, ...)`` loaded (or downloaded) the base dataset
  before refusing the severity, which the corruption name is checked ahead of.
* ``Patches(p, channels_last=True)`` on 3-D grayscale images named the (B, C, H, W) layout and
  ``x.unsqueeze(1)``, which read channels-last measures the image's rows as tokens.
"""

from __future__ import annotations

import pytest
import torch

from senslab.data import create_dataset
from senslab.data.corruptions import corrupt, list_corruptions
from senslab.tokens import Patches


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_brightness_of_a_nearly_black_pixel_is_the_shifted_value(dtype: torch.dtype) -> None:
    tiny = 1e-6 if dtype == torch.float16 else 1e-40 if dtype == torch.float32 else 1e-300
    x = torch.zeros(1, 3, 1, 2, dtype=dtype)
    x[0, 0, 0, 1] = tiny  # HSV value v = tiny, pure red: brightened to red at v = 0.3
    out = corrupt(x, "brightness", 5, _gen())  # severity 5: b = 0.3
    assert torch.isfinite(out).all(), out
    expected = torch.tensor([[[[0.3, 0.3]], [[0.3, 0.0]], [[0.3, 0.0]]]], dtype=dtype)
    assert torch.allclose(out.double(), expected.double(), atol=1e-3), out


def test_brightness_of_a_dark_grey_float16_image_is_not_white() -> None:
    x = torch.tensor([0.0, 1e-6, 1e-5, 0.5], dtype=torch.float16).view(1, 1, 2, 2)
    out = corrupt(x, "brightness", 5, _gen())
    ref = corrupt(x.float(), "brightness", 5, _gen())
    assert torch.allclose(out.float(), ref, atol=1e-3), (out, ref)


@pytest.mark.parametrize("name", ["contrast", "gaussian_blur", "gaussian_noise"])
def test_nan_pixels_are_refused_not_spread(name: str) -> None:
    x = torch.rand(1, 1, 4, 4, generator=_gen())
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        corrupt(x, name, 1, _gen())


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bool])
def test_integer_images_are_refused_with_the_conversion_not_a_channel_hint(
        dtype: torch.dtype) -> None:
    x = torch.zeros(2, 3, 8, 8, dtype=dtype)
    with pytest.raises(ValueError, match=r"float\(\) / 255") as err:
        corrupt(x, "contrast", 1, _gen())
    assert "unsqueeze" not in str(err.value)


def test_an_unknown_corruption_family_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown corruption family 'digtal'.*digital"):
        list_corruptions("digtal")
    assert list_corruptions("digital")  # the real ones still list
    assert list_corruptions() == list_corruptions("noise") + list_corruptions(
        "blur") + list_corruptions("digital")


def test_corrupted_dataset_refuses_a_bad_severity_before_loading_the_base(tmp_path) -> None:
    """An empty root with download=False: loading the base fails, so the severity's error
    comes first only where it is checked before the load (a download, for mnist)."""
    with pytest.raises(ValueError, match="severity must be one of 1, 2, 3, 4, 5"):
        create_dataset("corrupted", split="test", base="mnist", corruption="contrast",
                       severity=6, root=str(tmp_path), download=False)
    ds = create_dataset("corrupted", split="test", base="digits", corruption="contrast",
                        severity=1)
    assert ds.meta["severity"] == 1


def test_channels_last_grayscale_hint_adds_the_channel_axis_at_the_end() -> None:
    """Patches(p, channels_last=True) on (B, H, W) images said "(batch, channels, height,
    width) … x.unsqueeze(1)"; followed, (2, 1, 8, 8) read channels-last is 1×8 images of 8
    channels: Patches(1) then measured 8 row tokens, not the 64 pixels."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 2))
    x = torch.rand(2, 8, 8, generator=_gen())
    with pytest.raises(ValueError, match=r"\(batch, height, width, channels\).*unsqueeze\(-1\)"):
        with Patches(1, channels_last=True).bind(model, x):
            pass
    with Patches(1, channels_last=True).bind(model, x.unsqueeze(-1)) as bound:
        assert (bound.num_tokens, bound.dim) == (64, 1)  # the fix named gives the pixels
    with pytest.raises(ValueError, match=r"\(batch, channels, height, width\).*unsqueeze\(1\)"):
        with Patches(1).bind(model, x):
            pass
