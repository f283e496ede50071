"""How the tokenizations read the layout of the inputs they are given.

* Channels-last images (B, H, W, C), for a model that permutes them inside: read as
  (B, C, H, W) their "patches" cut across rows and channels, and a patch size that divides W and
  C measured them without a word (0.29 for the 0.20 of the closed form below). A shape that
  reads far better as channels-last is refused unless the layout is stated;
  ``Patches(p, channels_last=True)`` measures them (the model still gets (B, H, W, C) copies),
  exactly as (B, C, H, W) images through a wrapper that permutes. Shapes that are plausibly
  (B, C, H, W) are not refused, and a grid refusal of a narrow image names channels-last.
* Sequence-first (T, B, D) inputs to :class:`~senslab.tokens.Sequence`: a model whose batch is
  its second axis is refused with the layout named, also where T == B (which failed deep inside
  the runner with a size mismatch).

The reference numbers are computed independently: the closed-form flip probability of a linear
two-class model, and the (B, C, H, W) path measured through a permuting wrapper.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.tokens import Patches, Sequence

OPTS = dict(generator=0, precision="float32")


class PermuteLinear(nn.Module):
    """A two-class linear model on channels-last (B, H, W, C) images: it permutes inside."""

    def __init__(self, c: int = 3, hw: int = 8, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)  # test-only: nn.Linear initialises from the global RNG
        self.fc = nn.Linear(c * hw * hw, 2)
        self.c, self.hw = c, hw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[1:] == (self.hw, self.hw, self.c), x.shape  # the user's own layout
        return self.fc(x.permute(0, 3, 1, 2).flatten(1))


class ToChannelsLast(nn.Module):
    """The reference path: (B, C, H, W) images, permuted to the model's layout."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.permute(0, 2, 3, 1))


def nhwc(n: int = 6, hw: int = 8, c: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, hw, hw, c, generator=torch.Generator().manual_seed(seed))


def closed_form(model: PermuteLinear, x: torch.Tensor, sigma: float) -> float:
    """Mean over examples and pixels of P(flip) = Φ(−|margin| / (σ ‖w_pixel‖)), one token a
    pixel of all channels: a plain per-example loop."""
    w = (model.fc.weight[1] - model.fc.weight[0]).detach().view(model.c, model.hw, model.hw)
    norms = w.pow(2).sum(0).sqrt().flatten().tolist()
    rates = []
    for b in range(x.shape[0]):
        with torch.no_grad():
            z = model(x[b:b + 1])[0]
        margin = abs(float(z[1] - z[0]))
        rates.append(sum(0.5 * (1 + math.erf(-margin / (sigma * n) / math.sqrt(2)))
                         for n in norms) / len(norms))
    return sum(rates) / len(rates)


# --------------------------------------------------------------------------- channels-last
@pytest.mark.parametrize("shape", [(6, 8, 8, 3), (4, 28, 28, 1), (2, 16, 16, 4)])
def test_channels_last_images_are_refused_unless_the_layout_is_stated(shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Flatten(), nn.Linear(x[0].numel(), 2))
    # Patches(1) divides every axis: before, it measured these without a word
    with pytest.raises(ValueError, match=r"channels_last=True") as info:
        token_sensitivity(model, x, Patches(1), sigma=1.0, **OPTS)
    assert "channels_last=False" in str(info.value)  # the way out for true (B, C, H, W)
    with pytest.raises(ValueError, match=r"channels_last=True"):
        token_sensitivity(model, {"pixel_values": x}, Patches(1), sigma=1.0, **OPTS)


def test_channels_last_measures_the_closed_form_not_the_misread_layout():
    model, x, sigma = PermuteLinear().eval(), nhwc(), 8.0
    exact = closed_form(model, x, sigma)
    got = token_sensitivity(model, x, Patches(1, channels_last=True), sigma=sigma,
                            repeats=25, **OPTS)
    assert abs(got.estimate - exact) < 4 * got.stderr_subset + 1e-3, (got.estimate, exact)
    # the old reading, stated explicitly, measures another number (here 0.29 against 0.20):
    # the check above can tell the two apart
    misread = token_sensitivity(model, x, Patches(1, channels_last=False), sigma=sigma,
                                repeats=25, **OPTS)
    assert abs(misread.estimate - exact) > 8 * misread.stderr_subset, (misread.estimate, exact)


@pytest.mark.parametrize("options", [
    dict(),
    dict(mode="whole"),
    dict(control_variate="linear"),
    dict(sigma_space="pixel", std=(0.5, 0.25, 2.0)),
])
@pytest.mark.parametrize("p", [1, 4])
def test_channels_last_measures_as_the_permuted_images_do(p, options):
    model, x = PermuteLinear().eval(), nhwc()
    opts = dict(options)
    pixel = {k: opts.pop(k) for k in ("sigma_space", "std") if k in opts}
    want = token_sensitivity(ToChannelsLast(model).eval(), x.permute(0, 3, 1, 2).contiguous(),
                             Patches(p, **pixel), sigma=2.0, repeats=4, **OPTS, **opts)
    got = token_sensitivity(model, x, Patches(p, channels_last=True, **pixel), sigma=2.0,
                            repeats=4, **OPTS, **opts)
    assert torch.equal(got.per_sample, want.per_sample)
    assert got.num_forward == want.num_forward
    # a dict input (an image processor's output) is read the same way
    keyed = token_sensitivity(lambda pixel_values: model(pixel_values), {"pixel_values": x},
                              Patches(p, channels_last=True, **pixel), sigma=2.0, repeats=4,
                              **OPTS, **opts)
    assert torch.equal(keyed.per_sample, want.per_sample)


@pytest.mark.parametrize("shape", [(3, 3, 3, 3), (3, 4, 8, 4), (2, 16, 4, 4), (3, 1, 8, 8),
                                   (3, 3, 8, 8)])
def test_plausible_channels_first_images_are_not_refused(shape):
    """A 3-channel 3×3 image, a 4-channel image 4 pixels wide, 16 channels at 4×4: measured
    as (B, C, H, W) by default, as before."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Flatten(), nn.Linear(x[0].numel(), 3))
    r = token_sensitivity(model, x, Patches(1), sigma=1.0, repeats=1, **OPTS)
    assert r.per_position.numel() == shape[2] * shape[3]  # one token per (H, W) pixel


def test_a_flagged_shape_stated_channels_first_is_measured_as_such():
    x = nhwc(n=3)  # (3, 8, 8, 3): 8 channels of 8×3 pixels when so stated
    model = nn.Sequential(nn.Flatten(), nn.Linear(x[0].numel(), 3))
    r = token_sensitivity(model, x, Patches(1, channels_last=False), sigma=1.0, repeats=1,
                          **OPTS)
    assert r.per_position.numel() == 8 * 3


def test_a_grid_refusal_of_a_narrow_image_names_channels_last():
    x = torch.randn(2, 4, 4, 3, generator=torch.Generator().manual_seed(0))  # NHWC, 4×4 RGB
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 2))
    with pytest.raises(ValueError, match=r"does not divide.*channels_last=True"):
        token_sensitivity(model, x, Patches(2), sigma=1.0, **OPTS)
    with pytest.raises(ValueError, match=r"^patch size 2 does not divide image size 4x3; use "
                                         r"one of 1$"):  # the layout stated: no hint
        token_sensitivity(model, x, Patches(2, channels_last=False), sigma=1.0, **OPTS)


def test_channels_last_takes_only_a_bool():
    with pytest.raises(ValueError, match="channels_last must be"):
        Patches(2, channels_last="NHWC")


# --------------------------------------------------------------------------- sequence-first
class SeqFirstGRU(nn.Module):
    """A classifier on sequence-first (T, B, D) inputs (nn.GRU, batch_first=False)."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only
        self.rnn = nn.GRU(d, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[1][-1])


@pytest.mark.parametrize("t, b", [(6, 6), (7, 5)])
def test_sequence_first_inputs_are_refused_with_the_layout(t, b):
    x = torch.randn(t, b, 8, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"sequence-first.*x\.transpose\(0, 1\)"):
        token_sensitivity(SeqFirstGRU().eval(), x, Sequence(), sigma=1.0, repeats=2, **OPTS)


def test_sequence_first_model_measured_batch_first_through_a_wrapper():
    model = SeqFirstGRU().eval()
    x = torch.randn(5, 6, 8, generator=torch.Generator().manual_seed(1))  # (B, T, D)

    class BatchFirst(nn.Module):
        def forward(self, v: torch.Tensor) -> torch.Tensor:
            return model(v.transpose(0, 1))

    r = token_sensitivity(BatchFirst(), x, Sequence(), sigma=1.0, repeats=2, **OPTS)
    assert r.per_sample.shape == (5,) and r.per_position.numel() == 6


def test_a_dict_for_sequence_is_refused_with_the_tokenization_that_reads_its_mask():
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0))
    inputs = {"inputs_embeds": x, "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])}
    with pytest.raises(ValueError, match=r"'inputs_embeds': \(2, 4, 8\).*reads the attention "
                                         r"mask"):
        token_sensitivity(lambda inputs_embeds, attention_mask: inputs_embeds.sum(1), inputs,
                          Sequence(), sigma=1.0, **OPTS)
