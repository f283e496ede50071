"""Audit 85, vision models (senslab.models.vision / resnet): local reuse agrees with full
forwards (checked, nothing found); the input checks name the fix that applies."""

from __future__ import annotations

import pytest
import torch

from senslab.models import create_model

SMALL = {
    "resnet18": {"width": 0.125, "blocks": (1, 1), "image_size": 8},
    "cnn": {"channels": (2, 4), "hidden": 8},
    "convmixer": {"dim": 8, "depth": 1, "image_size": 8},
    "mlp": {"widths": (8,)},
}


def build(name: str) -> torch.nn.Module:
    return create_model(name, **SMALL[name]).eval()


def images(model: torch.nn.Module, n: int = 2) -> torch.Tensor:
    c, s = model.config.in_channels, model.config.image_size
    return torch.rand(n, c, s, s, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", list(SMALL))
def test_channels_last_images_are_told_to_permute(name: str) -> None:
    """(B, H, W, C) images were told to rebuild the model with other in_channels/image_size,
    which cannot take them either; the fix is a permute."""
    model = build(name)
    x = images(model)
    with pytest.raises(ValueError, match=r"channels-last .*images\.permute\(0, 3, 1, 2\)") as err:
        model(x.permute(0, 2, 3, 1))
    assert "create_model" not in str(err.value)
    with torch.no_grad():  # the fix it names is the one that works
        assert model(x.permute(0, 2, 3, 1).permute(0, 3, 1, 2)).shape[0] == 2


@pytest.mark.parametrize("name", list(SMALL))
def test_an_image_without_its_batch_axis_is_told_to_unsqueeze(name: str) -> None:
    model = build(name)
    x = images(model, 1)[0]
    with pytest.raises(ValueError, match=r"without its batch axis.*unsqueeze\(0\)") as err:
        model(x)
    assert "create_model" not in str(err.value)
    with torch.no_grad():
        assert model(x.unsqueeze(0)).shape[0] == 1


def test_a_wrong_image_size_still_names_the_model_build() -> None:
    model = build("resnet18")
    with pytest.raises(ValueError, match=r"create_model\(name, in_channels=\.\.\., image_size"):
        model(torch.zeros(2, 3, 12, 12))


def test_float64_images_under_autocast_are_not_told_to_use_autocast() -> None:
    """Under autocast already, float64 images were told to "run it under torch.autocast": it
    casts no float64 tensors, so that was no fix."""
    model = build("resnet18")
    x = images(model).double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(TypeError, match="float64") as err:
            model(x)
    assert "run it under torch.autocast" not in str(err.value)
    assert "casts no float64" in str(err.value)
    with pytest.raises(TypeError, match="run it under torch.autocast"):  # outside: still said
        model(x)
