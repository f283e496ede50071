"""Audit 81 (patches): what image and vector tokens measured without a word.

* Float32 images into a bf16 model that converts its inputs to its weights' dtype itself (as
  Hugging Face's ViT and CLIP do): the noise was rounded to the bf16 grid before the first layer,
  unchecked — a one-pixel flip rate of 0.0148 for the exact 0.0530. Checked now as bf16 images
  and autocast's rounding are, naming the layer and the fix.
* ``sigma_space="pixel"`` on raw 0–255 images (a model that normalises them itself): the noise
  ε/std landed in 0–255 units, 255·std times too small in pixels (an l2 change of 0.0006 for
  0.0371). Refused now; images whose span cannot be [0, 1] pixels under the std given are
  measured with a warning (a std of 0–255 pixels, say).
* Images (or token vectors) that require a gradient, under ``control_variate="linear"``: a raw
  "Inference tensors cannot be saved for backward". Measured now as their detached values.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.tokens import Patches, Sequence

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class CastsToWeights(nn.Module):
    """A one-pixel decision behind a 1×1 convolution of weight 1, in ``dtype``; the forward
    converts the images to the weights' dtype, as Hugging Face's image models do."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16, d: float = 0.004) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 1, bias=False)
        with torch.no_grad():
            self.conv.weight.fill_(1.0)
        self.to(dtype)
        self.d = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x.to(self.conv.weight.dtype)).float()
        z = (y[:, 0, 0, 0] - 3.0) + self.d
        return torch.stack([torch.zeros_like(z), z], 1)


@pytest.mark.parametrize("mode", ["token", "whole"])
def test_float32_images_a_bf16_model_rounds_itself_are_checked(mode: str) -> None:
    x = torch.full((64, 1, 4, 4), 3.0)  # bf16 spacing at 3: 2^-6 = 0.0156 > σ = 0.005
    with pytest.raises(ValueError) as err:
        token_sensitivity(CastsToWeights(), x, Patches(2), sigma=0.005, repeats=8, mode=mode,
                          generator=0)
    text = str(err.value)
    assert "too small for the float32 images" in text
    assert "rounded to the bfloat16 grid by the model itself" in text and "'conv'" in text
    assert "model.float()" in text and "larger sigma, well above 0.016" in text
    # the model in float32: measured, at the exact rate (0.0148 was measured on the bf16 grid)
    if mode == "token":
        r = token_sensitivity(CastsToWeights(torch.float32), x, Patches(2), sigma=0.005,
                              repeats=32, generator=0, precision="float32")
        exact = 0.25 * 0.5 * math.erfc(0.8 / math.sqrt(2))  # Φ(−0.004/0.005), one patch of four
        assert abs(r.estimate - exact) < 4 * r.stderr_subset


def test_ordinary_sigma_on_a_model_that_rounds_its_inputs_is_measured_without_a_word() -> None:
    x = torch.full((64, 1, 4, 4), 3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        r = token_sensitivity(CastsToWeights(d=0.2), x, Patches(2), sigma=0.5, repeats=8,
                              generator=0)
    assert 0 < r.estimate < 0.25


def test_float32_vectors_a_fp16_model_rounds_itself_are_checked() -> None:
    class Vectors(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2).half()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.to(self.fc.weight.dtype)[:, 0]).float()

    x = torch.full((32, 3, 4), 1000.0)  # fp16 spacing at 1000: 0.5 > σ = 0.05
    with pytest.raises(ValueError, match=r"too small for the float32 token vectors(?s:.*)float16 "
                                         r"grid by the model itself(?s:.*)'fc'"):
        token_sensitivity(Vectors(), x, Sequence(), sigma=0.05, repeats=4, generator=0)


def test_a_bf16_hugging_face_vit_rounding_float32_images_is_named() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    config = transformers.ViTConfig(image_size=8, patch_size=4, hidden_size=16,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=16, num_labels=3, initializer_range=0.5)
    vit = transformers.ViTForImageClassification(config).eval().to(torch.bfloat16)
    x = torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(1)) + 3
    with pytest.raises(ValueError, match="'vit.embeddings.patch_embeddings.projection'"):
        token_sensitivity(vit, x, Patches(4), sigma=0.003, repeats=4, generator=0,
                          compare="l2")


class Pixel(nn.Module):
    """Pixel (0, 0) of channel 0 as the logit, normalised here (``raw``: from 0–255 pixels)."""

    def __init__(self, raw: bool) -> None:
        super().__init__()
        self.raw = raw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x[:, 0, 0, 0]
        z = (v / 255 - MEAN[0]) / STD[0] if self.raw else v
        return torch.stack([torch.zeros_like(z), z], 1)


def _pixels() -> torch.Tensor:
    return torch.randint(0, 256, (16, 3, 8, 8), generator=torch.Generator().manual_seed(0)).float()


def test_raw_pixels_under_pixel_sigma_are_refused() -> None:
    tokens = Patches(4, sigma_space="pixel", std=STD, mean=MEAN)
    with pytest.raises(ValueError) as err:  # measured 0.0006 for 0.0371
        token_sensitivity(Pixel(raw=True), _pixels(), tokens, sigma=0.01, generator=0,
                          repeats=8, compare="l2")
    text = str(err.value)
    assert "channel 0 of the images holds values from 0 to 255" in text
    assert "raw (0–255) pixels" in text and "(images / 255 − mean) / std" in text
    assert "drop sigma_space" in text
    # the same images normalised: measured without a word, σ/std on the normalised pixel
    norm = (_pixels() / 255 - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        r = token_sensitivity(Pixel(raw=False), norm, tokens, sigma=0.01, generator=0,
                              repeats=8, compare="l2")
    assert 0.02 < float(r.per_position[0]) < 0.06  # E|ε|/std for ε ~ N(0, 0.01²): 0.0348


def test_a_std_of_0_255_pixels_is_said() -> None:
    norm = (_pixels() / 255 - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    caffe = tuple(255 * s for s in STD)  # mmcv's ImageNet std, of 0–255 pixels
    with pytest.warns(UserWarning, match=r"cannot be \[0, 1\] pixels normalised by std "
                                         r"\(58\.3(?s:.*)divided by 255") as seen:
        token_sensitivity(Pixel(raw=False), norm, Patches(4, sigma_space="pixel", std=caffe),
                          sigma=0.01, generator=0, repeats=2, compare="l2")
    assert any(w.filename == __file__ for w in seen)  # pointed at the caller


@pytest.mark.filterwarnings("ignore:the standard error rests")
def test_images_and_vectors_that_require_a_gradient_are_measured_as_their_values() -> None:
    torch.manual_seed(0)  # test-only: nn.Linear initialises from the global RNG
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 3)).eval()
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    opts = dict(sigma=0.5, generator=0, repeats=2, precision="float32", control_variate="linear")
    want = token_sensitivity(model, x, Patches(4), **opts)
    got = token_sensitivity(model, x.clone().requires_grad_(), Patches(4), **opts)
    assert torch.equal(got.per_sample, want.per_sample)
    keyed = token_sensitivity(lambda pixel_values: model(pixel_values),
                              {"pixel_values": x.clone().requires_grad_()}, Patches(4), **opts)
    assert torch.equal(keyed.per_sample, want.per_sample)

    head = nn.Linear(8, 3).eval()
    vectors = nn.Linear(8, 8)(torch.randn(4, 5, 8))  # an upstream module's output

    def mean_pooled(v: torch.Tensor) -> torch.Tensor:
        return head(v.mean(1))

    want = token_sensitivity(mean_pooled, vectors.detach(), Sequence(), **opts)
    got = token_sensitivity(mean_pooled, vectors, Sequence(), **opts)
    assert torch.equal(got.per_sample, want.per_sample)
