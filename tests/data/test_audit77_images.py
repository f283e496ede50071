"""Audit 77 (images): the image classifiers' input checks (models/vision.py) and the image data
sets' helpers (data/images.py)."""

from __future__ import annotations

import pytest
import torch

from senslab.data import create_dataset
from senslab.data.images import denormalize, normalize_images
from senslab.models import create_model

SMALL = {
    "mlp": {"widths": (8,)},
    "cnn": {"channels": (4, 4), "hidden": 8, "image_size": 12},
    "convmixer": {"dim": 8, "depth": 1},
    "vit_small": {"dim": 8, "depth": 1, "heads": 2, "dim_head": 4, "mlp_dim": 8},
    "vit_simple": {"dim": 8, "depth": 1, "heads": 2, "dim_head": 4, "mlp_dim": 8},
    "resnet18": {"width": 0.125},
}


def small(name: str):
    return create_model(name, **{"image_size": 8, "in_channels": 1, **SMALL[name]}).eval()


def images(model, dtype: torch.dtype) -> torch.Tensor:
    s = model.config.image_size
    return torch.rand(2, 1, s, s, generator=torch.Generator().manual_seed(0)).to(dtype)


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bool])
def test_integer_images_are_refused_naming_images_float(name, dtype):
    # before: torch's "mixed dtype (CPU)" (ViTs), "expected scalar type Byte but found Float"
    # (resnet18), "mat1 and mat2 must have the same dtype" (mlp), naming no fix
    model = small(name)
    with pytest.raises(TypeError, match=r"floating-point images.*images\.float\(\)"):
        model(images(model, dtype))


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_float_images_of_another_dtype_are_refused_naming_both_fixes(name, dtype):
    model = small(name)
    with pytest.raises(TypeError, match=r"float32 weights.*images\.to\(.*model\.to\("):
        model(images(model, dtype))


@pytest.mark.parametrize("name", list(SMALL))
def test_models_built_in_their_dtype_and_autocast_keep_working(name):
    model = small(name)
    x = images(model, torch.float32)
    with torch.no_grad():
        ref = model(x)
        for dtype in (torch.float64, torch.bfloat16):
            out = small(name).to(dtype)(x.to(dtype))
            assert out.dtype == dtype
            torch.testing.assert_close(out.float(), ref, atol=0.1, rtol=0.1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for dt in (torch.float32, torch.bfloat16):  # autocast casts both
                torch.testing.assert_close(model(x.to(dt)).float(), ref, atol=0.1, rtol=0.1)


@pytest.mark.parametrize("name", list(SMALL))
def test_float64_images_under_autocast_are_refused(name):
    model = small(name)  # autocast leaves float64 as it is: torch failed as without it
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TypeError, match="float64"):
        model(images(model, torch.float64))


@pytest.mark.parametrize("field", ["dropout", "emb_dropout"])
@pytest.mark.parametrize("rate", [1.0, float("nan"), -0.1])
def test_vit_small_refuses_a_dropout_rate_outside_0_1(field, rate):
    # before: dropout=1.0 was accepted, and in train mode every image got the same logits
    with pytest.raises(ValueError, match=rf"ViTSmallConfig\.{field} must be a probability"):
        create_model("vit_small", **{field: rate})


def test_vit_small_still_takes_dropout_rates_below_one():
    model = create_model("vit_small", image_size=8, in_channels=1, dropout=0.0, emb_dropout=0.5,
                         **SMALL["vit_small"])
    assert model.config.emb_dropout == 0.5


def test_denormalize_refuses_integer_images_it_returned_as_zeros():
    # before: mean and std were cast to int64 (0.5 -> 0), so every pixel came back 0
    meta = {"mean": (0.5,), "std": (0.5,)}
    x = torch.tensor([[[[-1, 0, 1]]]])
    with pytest.raises(TypeError, match="denormalize takes floating-point images, got torch.int64"):
        denormalize(x, meta)
    torch.testing.assert_close(denormalize(x.float(), meta), torch.tensor([[[[0.0, 0.5, 1.0]]]]))


def test_normalize_images_refuses_bytes_naming_the_scaling():
    x = torch.tensor([[[[0, 255]]]], dtype=torch.uint8)
    with pytest.raises(TypeError, match=r"x\.float\(\) / 255"):
        normalize_images(x, "minus_one_one", ((0.5,), (0.5,)))


@pytest.mark.parametrize("pair", [(3.7, 8), (3, 8.5), (True, 8)])
def test_digit_pair_that_is_not_two_whole_numbers_is_refused(pair):
    # before: int() made (3.7, 8) the 3-vs-8 task and (True, 8) the 1-vs-8 task, unsaid
    with pytest.raises(ValueError, match="two different classes, whole numbers"):
        create_dataset("digits", split="test", digits=pair)


def test_digit_pair_of_whole_floats_still_loads():
    a = create_dataset("digits", split="test", digits=(3.0, 8))
    b = create_dataset("digits", split="test", digits=(3, 8))
    assert a.meta["classes"] == ["3", "8"] and torch.equal(a.inputs, b.inputs)
    assert torch.equal(a.targets, b.targets)


def test_mnist_pickle_with_nan_pixels_is_refused_not_read_as_black(tmp_path):
    # before: NaN passed the 0..255 range check and was cast to byte 0 (a black pixel), with
    # only numpy's "invalid value encountered in cast"
    import gzip
    import pickle

    import numpy as np

    from senslab.data._download import DataUnavailableError

    rng = np.random.default_rng(0)

    def part(n: int):
        return (rng.integers(0, 256, (n, 784)) / 256).astype(np.float32), rng.integers(0, 10, n)

    train, val, test = part(4), part(2), part(2)
    train[0][0, :10] = np.nan
    with gzip.open(tmp_path / "mnist.pkl.gz", "wb") as f:
        pickle.dump((train, val, test), f)
    with pytest.raises(DataUnavailableError, match=r"training pixels.*10 are NaN"):
        create_dataset("mnist", split="train50k", root=tmp_path, verify=False)
