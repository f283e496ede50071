"""audit85 / patches: what ``Patches`` says about inputs it cannot cut, and per-channel values
given as NumPy.

* A 3-D tensor was told only "add a channel axis with x.unsqueeze(1) for grayscale images". A
  model that takes the 3-D tensor as it is (a spectrogram CNN that adds its own channel axis, a
  GRU over frames, AST's ``input_values``) then failed in its forward (a Conv2d got 5-D input),
  and one (channels, height, width) image was cut into grayscale images of one row each.
* A dict entry that is no tensor (an image processor called without ``return_tensors='pt'``)
  was told to "pass a dict {'pixel_values': images, …}", which it had.
* A NumPy per-channel std (``np.std`` over a dataset's channels), a NumPy scalar, or a NumPy
  ``image_std`` was refused as "no sequence of per-channel numbers", and a processor's float32
  ``rescale_factor`` of 1/255 was said not to be 1/255.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.tokens import Patches, Sequence
from senslab.tokens.patches import processor_normalization


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class SpecCNN(nn.Module):
    """A spectrogram classifier that takes (batch, mels, frames) and adds its own channel axis."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x.unsqueeze(1)).mean((2, 3)))


class Squeezed(nn.Module):
    """The wrapper the message names: forward(x) calls model(x.squeeze(1))."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.squeeze(1))


def _refusal(model, inputs, tokens) -> str:
    with pytest.raises(ValueError) as err:
        token_sensitivity(model, inputs, tokens, sigma=0.5, generator=0)
    return str(err.value)


def test_a_model_that_takes_three_dimensional_inputs_is_told_the_wrapper() -> None:
    model = SpecCNN().eval()
    x = torch.randn(8, 16, 16, generator=_gen())
    text = _refusal(model, x, Patches(4))
    # the channel axis alone, which the old message gave, fails in the model's own forward
    with pytest.raises(RuntimeError):
        model(x.unsqueeze(1))
    assert "wrapper whose forward(x) calls model(x.squeeze(1))" in text
    assert "Sequence()" in text
    assert "one image" not in text  # a batch of 8 spectrograms, not an 8-channel image
    r = token_sensitivity(Squeezed(model), x.unsqueeze(1), Patches(4), sigma=0.5, generator=0)
    assert r.per_position.shape == (16,)
    gru = nn.GRU(16, 8, batch_first=True)
    frames = token_sensitivity(lambda v: gru(v)[0][:, -1], x, Sequence(), sigma=0.5, generator=0)
    assert frames.per_position.shape == (16,)


class Audio(nn.Module):
    """A stand-in for a Hugging Face audio model: called as model(input_values=…)."""

    main_input_name = "input_values"

    def __init__(self) -> None:
        super().__init__()
        self.inner = SpecCNN()

    def forward(self, input_values: torch.Tensor, scale: torch.Tensor | None = None):
        out = self.inner(input_values)
        return out if scale is None else out * scale[:, None]


class PixelValues(nn.Module):
    """The dict wrapper the message names."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor, **rest):
        return self.model(input_values=pixel_values.squeeze(1), **rest)


def test_an_audio_entry_is_not_called_grayscale_images_and_the_named_fix_measures() -> None:
    model = Audio().eval()
    x = torch.randn(4, 16, 16, generator=_gen(1))
    scale = torch.tensor([1.0, 2.0, 0.5, 3.0])
    text = _refusal(model, {"input_values": x, "scale": scale}, Patches(4))
    assert "grayscale" not in text and "audio features, not images" in text
    assert "model(input_values=pixel_values.squeeze(1), **rest)" in text
    got = token_sensitivity(PixelValues(model), {"pixel_values": x.unsqueeze(1), "scale": scale},
                            Patches(4), sigma=0.5, compare="l2", generator=0)
    # the same numbers as the spectrogram measured through the tensor wrapper, scaled
    ref = token_sensitivity(Squeezed(model.inner), x.unsqueeze(1), Patches(4), sigma=0.5,
                            compare="l2", generator=0)
    assert bool((torch.as_tensor(ref.per_sample) > 0).all())
    assert torch.allclose(torch.as_tensor(got.per_sample),
                          torch.as_tensor(ref.per_sample) * scale, rtol=1e-5, atol=0)


def test_one_image_without_its_batch_axis_is_told_to_add_it() -> None:
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 14 * 14, 3)).eval()
    img = torch.rand(3, 16, 16, generator=_gen(2))
    text = _refusal(conv, img, Patches(4))
    assert "one image of 3 channels, add its batch axis instead: x.unsqueeze(0)" in text
    with pytest.raises(RuntimeError):  # the grayscale advice, followed
        conv(img.unsqueeze(1))
    hwc = img.permute(1, 2, 0).contiguous()
    text = _refusal(conv, hwc, Patches(4))
    assert "x.permute(2, 0, 1).unsqueeze(0)" in text
    r = token_sensitivity(conv, hwc.permute(2, 0, 1).unsqueeze(0), Patches(4), sigma=0.5,
                          compare="l2", estimand="subset", generator=0)
    ref = token_sensitivity(conv, img.unsqueeze(0), Patches(4), sigma=0.5, compare="l2",
                            estimand="subset", generator=0)
    assert float(ref.estimate) > 0
    assert torch.equal(torch.as_tensor(r.per_sample), torch.as_tensor(ref.per_sample))
    text = _refusal(conv, hwc, Patches(4, channels_last=True))
    assert "one image of 3 channels, add its batch axis instead: x.unsqueeze(0)" in text


def test_a_dict_entry_that_is_no_tensor_names_return_tensors() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 3)).eval()
    imgs = [np.zeros((3, 8, 8), dtype=np.float32) for _ in range(2)]
    for entry in (imgs, np.stack(imgs)):
        text = _refusal(model, {"pixel_values": entry, "labels": torch.tensor([0, 1])},
                        Patches(4))
        assert "return_tensors='pt'" in text and "torch.as_tensor" in text
        assert "or a dict {'pixel_values'" not in text


def test_numpy_per_channel_std_is_read_as_the_same_values() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 3)).eval()
    x = torch.randn(4, 3, 8, 8, generator=_gen(3)) * 0.2
    std = np.array([0.229, 0.224, 0.225])
    assert Patches(4, sigma_space="pixel", std=std).std == tuple(std.tolist())
    assert Patches(4, sigma_space="pixel", std=np.float32(0.25)).std == (0.25,)
    got = token_sensitivity(model, x, Patches(4, sigma_space="pixel", std=std), sigma=0.1,
                            compare="l2", generator=0)
    ref = token_sensitivity(model, x, Patches(4, sigma_space="pixel", std=tuple(std.tolist())),
                            sigma=0.1, compare="l2", generator=0)
    assert bool((torch.as_tensor(ref.per_sample) > 0).all())
    assert torch.equal(torch.as_tensor(got.per_sample), torch.as_tensor(ref.per_sample))
    proc = SimpleNamespace(do_rescale=True, rescale_factor=np.float32(1 / 255),
                           do_normalize=True, image_mean=np.array([0.5, 0.4, 0.3]),
                           image_std=np.array([0.26862954, 0.26130258, 0.27577711]))
    mean, std3 = processor_normalization(proc)
    assert mean == pytest.approx((0.5, 0.4, 0.3)) and std3 == (0.26862954, 0.26130258,
                                                              0.27577711)
    proc.rescale_factor = np.float32(1 / 127.5)  # another factor is still refused
    with pytest.raises(ValueError, match="not 1/255"):
        processor_normalization(proc)
