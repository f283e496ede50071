"""What :class:`~senslab.tokens.Patches` takes besides a (B, C, H, W) tensor, and what it refuses.

* A dict holding the images under ``pixel_values`` (or the model's ``main_input_name``) — a
  Hugging Face image processor's ``BatchFeature``, a Trainer batch — is measured copy for copy
  as the tensor is; its other entries go to the model as keyword arguments (batch-shaped ones
  picked per copy), ``labels`` dropped. The HF Trainer callback measures an image model on it.
* bf16/fp16 images whose grid rounds the noise away are refused, with the fix; ordinary σ on
  them, and float32 images, are measured.
* A grid refusal under ``tokens=None`` says that ``auto_tokens`` chose the patch size and how
  to choose another.

Every model is random-init (offline); the HF ViT gets a larger ``initializer_range`` so that its
predictions depend on the input.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.tokens import Embedding, Patches, auto_tokens
from senslab.tokens import _grid as grid

EXACT = dict(precision="float32", generator=0, repeats=2)


class Linear(nn.Module):
    """A linear classifier on flattened images, called with the images as ``pixel_values``."""

    def __init__(self, c: int = 3, hw: int = 8, classes: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)  # test-only: nn.Linear initialises from the global RNG
        self.fc = nn.Linear(c * hw * hw, classes)

    def forward(self, pixel_values: torch.Tensor, offset: torch.Tensor | None = None,
                scale: float = 1.0) -> torch.Tensor:
        out = self.fc(pixel_values.flatten(1)) * scale
        return out if offset is None else out + offset


def images(n: int = 4, c: int = 3, hw: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, c, hw, hw, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- dict inputs
@pytest.fixture(scope="module")
def vit():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    config = transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=32,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=37, num_labels=3, initializer_range=0.5)
    return transformers.ViTForImageClassification(config).eval()


def test_hf_image_model_dict_and_batchfeature_equal_the_tensor(vit) -> None:
    from transformers import BatchFeature

    x = images(hw=16)
    ref = token_sensitivity(vit, x, sigma=1.0, **EXACT)  # tokens=None: Patches(4)
    assert ref.estimate > 0  # flips to compare
    labels = torch.zeros(4, dtype=torch.long)
    for inputs in ({"pixel_values": x}, BatchFeature({"pixel_values": x}),
                   {"pixel_values": x, "labels": labels}, {"labels": labels, "pixel_values": x,
                                                           "interpolate_pos_encoding": False}):
        r = token_sensitivity(vit, inputs, sigma=1.0, **EXACT)
        assert torch.equal(torch.as_tensor(r.per_sample), torch.as_tensor(ref.per_sample))
        assert r.num_forward == ref.num_forward


def test_hf_callback_measures_an_image_model_on_its_trainer_batch(vit) -> None:
    pytest.importorskip("accelerate")  # transformers' Trainer classes need it
    from senslab.integrations.hf import SensitivityCallback

    x = images(hw=16)
    batch = {"pixel_values": x, "labels": torch.zeros(4, dtype=torch.long)}
    cb = SensitivityCallback(batch, sigma=1.0, precision="float32", repeats=2)
    got = cb.measure(vit)
    ref = token_sensitivity(vit, x, sigma=1.0, **EXACT)
    assert got.estimate == ref.estimate > 0
    assert torch.equal(torch.as_tensor(got.per_sample), torch.as_tensor(ref.per_sample))


def test_other_entries_go_along_per_copy_and_labels_are_dropped() -> None:
    model = Linear().eval()
    x = images()
    plain = token_sensitivity(model, x, Patches(4), sigma=3.0, **EXACT)
    assert plain.estimate > 0.2
    # a non-tensor keyword and labels (which Linear.forward does not take: dropped)
    kw = token_sensitivity(model, {"pixel_values": x, "scale": 2.0, "labels": torch.ones(4)},
                           Patches(4), sigma=3.0, **EXACT)
    assert torch.equal(torch.as_tensor(kw.per_sample), torch.as_tensor(plain.per_sample))
    # a per-example offset that decides each example's class: each copy must get its own row
    offset = 1e4 * nn.functional.one_hot(torch.tensor([0, 1, 2, 3]), 4).float()
    fixed = token_sensitivity(model, {"pixel_values": x, "offset": offset}, Patches(4),
                              sigma=3.0, **EXACT)
    assert fixed.estimate == 0.0
    for mode in ("token", "whole"):  # both ways the copies are built
        fixed = token_sensitivity(model, {"pixel_values": x, "offset": offset}, Patches(4),
                                  sigma=3.0, mode=mode, **EXACT)
        assert fixed.estimate == 0.0


def test_main_input_name_is_the_images_key() -> None:
    class Named(Linear):
        main_input_name = "images"

        def forward(self, images: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return self.fc(images.flatten(1))

    model = Named().eval()
    x = images()
    ref = token_sensitivity(model, x, Patches(4), sigma=3.0, **EXACT)
    r = token_sensitivity(model, {"images": x}, Patches(4), sigma=3.0, **EXACT)
    assert torch.equal(torch.as_tensor(r.per_sample), torch.as_tensor(ref.per_sample))
    # images under both keys: which one to perturb is not clear
    with pytest.raises(ValueError, match=r"both 'pixel_values' and the model's main input "
                                         r"'images'.*drop the other entry"):
        token_sensitivity(model, {"images": x, "pixel_values": x}, Patches(4), sigma=1.0)


def test_a_dict_without_images_is_refused_naming_its_keys_and_the_fix() -> None:
    model = Linear().eval()
    x = images()
    with pytest.raises(ValueError) as err:
        token_sensitivity(model, {"image": x, "labels": torch.zeros(4)}, Patches(4), sigma=1.0)
    text = str(err.value)
    assert "'image': (4, 3, 8, 8)" in text and "'labels'" in text
    assert "no 'pixel_values' entry" in text and "(4-D: 'image')" in text
    assert "under 'pixel_values'" in text and "image tensor itself" in text
    assert "grayscale" not in text
    with pytest.raises(ValueError, match=r"under 'pixel_values', got \(4, 192\)$"):
        token_sensitivity(model, {"pixel_values": x.flatten(1)}, Patches(4), sigma=1.0)


def test_grayscale_hint_only_for_three_dimensional_images() -> None:
    model = Linear(c=1).eval()
    x = images(c=1)
    with pytest.raises(ValueError, match=r"got \(4, 8, 8\); add a channel axis"):
        token_sensitivity(model, x[:, 0], Patches(4), sigma=1.0)
    for bad in (x.flatten(1), x[None]):
        with pytest.raises(ValueError) as err:
            token_sensitivity(model, bad, Patches(4), sigma=1.0)
        assert "expects images of shape" in str(err.value)
        assert "grayscale" not in str(err.value)
    with pytest.raises(ValueError, match=r"got a tuple; pass the image tensor itself"):
        token_sensitivity(model, (x,), Patches(4), sigma=1.0)


# --------------------------------------------------------------------------- low precision
class OnePixel(nn.Module):
    """Class 1 iff pixel (0, 0) of channel 0 exceeds 3 − d (0.004): the flip probability under
    N(0, σ²) noise on that pixel is known."""

    def __init__(self, d: float = 0.004) -> None:
        super().__init__()
        self.d = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x[:, 0, 0, 0] - 3.0) + self.d
        return torch.stack([torch.zeros_like(z), z], 1)


def test_criteria_are_those_of_low_precision_weights() -> None:
    from senslab.measure import sharpness

    assert grid.ROUNDING_RTOL == sharpness.ROUNDING_RTOL
    assert grid.ROUNDING_MAX_UNCHANGED == sharpness.ROUNDING_MAX_UNCHANGED


@pytest.mark.parametrize("mode", ["token", "whole"])
def test_bf16_images_whose_grid_rounds_the_noise_away_are_refused(mode: str) -> None:
    x = torch.full((64, 1, 4, 4), 3.0)  # bf16 spacing at 3: 2^-6 = 0.0156 > σ = 0.005
    with pytest.raises(ValueError) as err:
        token_sensitivity(OnePixel(), x.bfloat16(), Patches(2), sigma=0.005, repeats=8,
                          mode=mode)
    text = str(err.value)
    assert "too small for the bfloat16 images" in text
    assert "images.float()" in text and "without autocast=" in text  # it would round again
    assert "larger sigma, well above 0.016" in text
    # float32 images: measured (the exact rate is 0.0530; 0.0148 on the bf16 grid)
    r = token_sensitivity(OnePixel(), x, Patches(2), sigma=0.005, repeats=32, mode=mode)
    if mode == "token":
        assert abs(r.estimate - 0.0530) < 4 * r.stderr_subset


def test_low_precision_images_at_ordinary_sigma_are_measured() -> None:
    """bf16 normalised images at σ = 0.2, fp16 at σ = 0.02 near 3 (spacing 0.002, a tenth of
    σ): measured without a word, and the one-pixel threshold's rate is the exact one."""
    model = Linear().bfloat16().eval()
    x = images().bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "the standard error rests on")  # a toy's few flips
        r = token_sensitivity(model, x, Patches(4), sigma=0.2, generator=0, repeats=2)
        assert 0 <= r.estimate <= 1
        x3 = torch.full((64, 1, 4, 4), 3.0)
        half = token_sensitivity(OnePixel(d=0.016), x3.half(), Patches(2), sigma=0.02, repeats=32,
                                 generator=0)
    exact = 0.25 * 0.5 * math.erfc(0.8 / math.sqrt(2))  # Φ(−0.016/0.02) on one patch of four
    assert abs(half.estimate - exact) < 4 * half.stderr_subset


@pytest.mark.parametrize("mode", ["token", "whole"])
def test_fp16_noise_that_the_grid_moves_the_threshold_of_is_refused(mode: str) -> None:
    """fp16 images near 3 (spacing 0.002) at σ = 0.005: the noise keeps its root mean square
    within 1% on the grid, but its rounding moves a one-pixel threshold by up to a fifth of σ
    (its rate came out 0.0437 against the exact 0.0530 before this was refused). At σ = 0.01
    (rounding 5.7% of the noise) it is measured with a warning naming the fix."""
    x3 = torch.full((64, 1, 4, 4), 3.0).half()
    with pytest.raises(ValueError) as err:
        token_sensitivity(OnePixel(), x3, Patches(2), sigma=0.005, repeats=8, mode=mode)
    text = str(err.value)
    assert "too small for the float16 images" in text and "is moved by 11." in text
    assert "half the spacing" in text and "images.float()" in text
    model = OnePixel(d=0.008)
    with pytest.warns(UserWarning, match=r"coarse on the float16 grid.*moved by 5\.\d%.*"
                                         r"without autocast=") as seen:
        r = token_sensitivity(model, x3, Patches(2), sigma=0.01, repeats=8, mode=mode)
    assert all(w.filename == __file__ for w in seen)  # pointed at the caller
    assert 0 < r.estimate < 1


def test_the_check_draws_nothing() -> None:
    """The noise stream is the plain one: a measurement on bf16 images leaves the generator
    where the same measurement on float32 images does."""
    model = Linear().eval()
    x = images()
    after = []
    for imgs, m in ((x, model), (x.bfloat16(), Linear().bfloat16().eval())):
        g = torch.Generator().manual_seed(0)
        token_sensitivity(m, imgs, Patches(4), sigma=0.1, generator=g, repeats=2)
        after.append(g.get_state())
    assert torch.equal(after[0], after[1])


# --------------------------------------------------------------------------- automatic size
def test_grid_refusal_says_auto_tokens_chose_the_size_and_how_to_choose() -> None:
    cnn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(4, 2)).eval()
    x = images(n=2, hw=56)
    with pytest.raises(ValueError) as err:
        token_sensitivity(cnn, x, auto_tokens(cnn), sigma=1.0)
    text = str(err.value)
    assert "patch size 16 (auto_tokens chose it" in text and "16 for a CNN" in text
    assert "auto_tokens(model, patch_size=q)" in text and "Patches(q)" in text
    assert "1, 2, 4, 7, 8, 14, 28, 56" in text
    # a size the user chose keeps the short message
    with pytest.raises(ValueError, match=r"^patch size 16 does not divide image size 56x56; "
                                         r"use one of 1, 2, 4, 7, 8, 14, 28, 56$"):
        token_sensitivity(cnn, x, Patches(16), sigma=1.0)
    with pytest.raises(ValueError, match=r"^patch size 16 does not divide"):
        token_sensitivity(cnn, x, auto_tokens(cnn, patch_size=16), sigma=1.0)


def test_grid_refusal_under_tokens_none(vit) -> None:
    with pytest.raises(ValueError, match=r"patch size 4 \(auto_tokens chose it.*"
                                         r"auto_tokens\(model, patch_size=q\)"):
        token_sensitivity(vit, images(hw=18), sigma=1.0)

def test_a_list_of_feature_maps_gets_no_features_logits_hint() -> None:
    """timm ``features_only``: a list of (B, C, H, W) maps holds no logits; the refusal names
    compare='l2' with output=, not 'output=1 for (features, logits)'."""
    class Feats(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 4, 3, 2, 1), nn.Conv2d(4, 8, 3, 2, 1)

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            f = self.a(x)
            return [f, self.b(f)]

    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError) as err:
        token_sensitivity(Feats().eval(), x, Patches(4), sigma=1.0)
    text = str(err.value)
    assert "feature maps, no (batch, classes) logits" in text
    assert "compare='l2'" in text and "output=-1" in text
    assert "(features, logits)" not in text
    r = token_sensitivity(Feats().eval(), x, Patches(4), sigma=1.0, compare="l2", output=-1)
    assert r.estimate > 0


def test_dict_images_under_checked_int8_with_a_static_copy() -> None:
    """An FX-traceable conv model fed {"pixel_values": x} under precision='int8-checked': the
    static int8 copy's calibration stand-in took one positional tensor only (TypeError)."""
    class Conv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.c, self.l = nn.Conv2d(3, 64, 4, 4), nn.Linear(64, 3)

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.l(self.c(pixel_values).mean((2, 3)))

    model = Conv().eval()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    ref = token_sensitivity(model, x, Patches(4), sigma=1.0, precision="float32", repeats=2)
    got = token_sensitivity(model, {"pixel_values": x}, Patches(4), sigma=1.0,
                            precision="int8-checked", repeats=2)
    assert torch.equal(torch.as_tensor(got.per_sample), torch.as_tensor(ref.per_sample))


class _Permute(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 3, 1)


class _StemNet(nn.Module):
    """A 4×4 convolutional stem, then a mean over positions and a linear head; with
    ``grid=True`` the stem's output is (batch, height, width, dim), as Swin's patch embedding."""

    def __init__(self, grid: bool) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), *([_Permute()] if grid else []))
        self.grid = grid
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stem(x).mean((1, 2) if self.grid else (2, 3)))


@pytest.mark.parametrize("grid", [False, True], ids=["cnn-stem", "swin-grid"])
def test_embedding_on_a_4d_image_embedding_names_patches(grid):
    """A CNN stem or a Swin patch grid is 4-D: the refusal said to hook 'the embedding, not a
    recurrent layer', though the user had hooked the embedding."""
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"4-D image embedding(?s:.*)Patches\(p\)") as err:
        token_sensitivity(_StemNet(grid).eval(), x, Embedding("stem"), sigma=0.5)
    assert "recurrent" not in str(err.value)
