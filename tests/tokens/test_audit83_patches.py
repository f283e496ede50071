"""Audit 83 (image tokens): Patches against hand-written references on users' own models.

No wrong number was found; these pin what was checked. A two-class linear model's flip
probability for patch ``t`` under noise ε ~ N(0, σ²) is Φ(−|m| / (σ‖d_t / std‖)) (``d`` the
weight difference restricted to the patch, ``std`` per channel in pixel space, 1 otherwise); with
``control_variate="linear"`` a linear model's estimate is that closed form exactly, and any
copy whose noise landed elsewhere (another patch, channel or scale) would move it. Checked for
1, 3 and 4 channels, rectangular images, channels-last images and memory format, non-contiguous
images, batch size 1 and both σ spaces; pixel-space noise is the input-space draw divided by
std per channel; a Hugging Face dict input with ``labels`` and extra keys measures what its
tensor does (``labels`` not passed, the others passed), read from a ``ModelOutput``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from senslab import Patches, token_sensitivity


class _ToNCHW(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 3, 1, 2)


def _closed_form(lin: nn.Linear, x: torch.Tensor, p: int, sigma: float,
                 std: torch.Tensor) -> list[float]:
    """Per-example mean over patches of Φ(−|m| / (σ‖d_t / std‖)) for (B, C, H, W) ``x``."""
    b, c, h, w = x.shape
    gh, gw = h // p, w // p
    d = (lin.weight[1] - lin.weight[0]).detach().double().view(c, gh, p, gw, p)
    out = lin(x.flatten(1).to(lin.weight.dtype)).detach().double()
    marg = out[:, 1] - out[:, 0]
    ref = []
    for i in range(b):
        ps = []
        for t in range(gh * gw):
            blk = d[:, t // gw, :, t % gw, :] / std.view(c, 1, 1)
            z = abs(float(marg[i])) / (sigma * float(blk.norm()))
            ps.append(0.5 * math.erfc(z / math.sqrt(2)))
        ref.append(sum(ps) / len(ps))
    return ref


@pytest.mark.parametrize(("c", "h", "w", "p", "b"), [
    (3, 4, 4, 2, 3), (1, 4, 6, 2, 2), (4, 6, 4, 2, 2), (3, 4, 4, 4, 1), (3, 4, 8, 4, 2)])
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "memory_format", "strided"])
@pytest.mark.parametrize("space", ["input", "pixel"])
def test_linear_model_measures_its_closed_form(c: int, h: int, w: int, p: int, b: int,
                                              layout: str, space: str) -> None:
    torch.manual_seed(0)
    lin = nn.Linear(c * h * w, 2).double()
    g = torch.Generator().manual_seed(1)
    x = torch.rand(b, c, h, w, generator=g, dtype=torch.float64) * 0.5
    std = (torch.tensor([0.2, 0.5, 0.1, 0.3], dtype=torch.float64)[:c] if space == "pixel"
           else torch.ones(c, dtype=torch.float64))
    kw = {"sigma_space": "pixel", "std": tuple(std.tolist())} if space == "pixel" else {}
    model: nn.Module = nn.Sequential(nn.Flatten(), lin)
    inputs = x
    if layout == "channels_last":
        inputs, model = x.permute(0, 2, 3, 1).contiguous(), nn.Sequential(_ToNCHW(), model)
        kw["channels_last"] = True
    elif layout == "memory_format":
        inputs = x.contiguous(memory_format=torch.channels_last)
    elif layout == "strided":  # every other column of a wider image: not contiguous
        wide = torch.zeros(b, c, h, 2 * w, dtype=torch.float64)
        wide[..., ::2] = x
        inputs = wide[..., ::2]
        assert not inputs.is_contiguous()
    r = token_sensitivity(model, inputs, Patches(p, **kw), sigma=0.3,
                          control_variate="linear", repeats=2, generator=0)
    ref = _closed_form(lin, x, p, 0.3, std)
    assert r.per_sample.double().tolist() == pytest.approx(ref, rel=1e-5, abs=1e-9)


class _Recorder(nn.Module):
    def __init__(self, numel: int) -> None:
        super().__init__()
        self.lin = nn.Linear(numel, 4).double()
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        return self.lin(x.flatten(1).double())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_pixel_noise_is_the_input_draw_divided_by_std_per_channel(dtype: torch.dtype) -> None:
    std = torch.tensor([0.229, 0.224, 0.225], dtype=torch.float64)
    x = (torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(2)) * 0.2).to(dtype)
    runs = []
    for tok in (Patches(2), Patches(2, sigma_space="pixel", std=tuple(std.tolist()))):
        torch.manual_seed(0)
        m = _Recorder(48)
        token_sensitivity(m, x, tok, sigma=0.05, repeats=2, generator=3)
        runs.append(m.seen)
    # the measured copies come last: 2 examples × 4 patches × 2 draws (earlier calls are the
    # clean forward and checks scaled by the tokens' own size, which differ between the spaces)
    a, bb = (torch.cat(seen)[-16:].double() for seen in runs)
    # each copy's example: the nearest clean image (the noise touches one patch of four)
    near = torch.stack([min(x.double(), key=lambda e, s=s: float((s - e).abs().sum()))
                        for s in a])
    da, db = a - near, (bb - near) * std.view(1, 3, 1, 1)
    assert ((da != 0).flatten(1).sum(1) == 12).all()  # one 2x2 patch of 3 channels
    tol = 2e-3 if dtype == torch.float16 else 1e-6
    assert torch.allclose(db, da, atol=tol, rtol=tol), float((db - da).abs().max())


def test_hugging_face_dict_with_labels_measures_what_its_tensor_does() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32, num_labels=4, initializer_range=1.0)
    torch.manual_seed(0)
    vit = transformers.ViTForImageClassification(cfg).eval()
    seen: list[set[str]] = []
    vit.register_forward_pre_hook(lambda mod, a, kw: seen.append(set(kw)), with_kwargs=True)
    x = torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    batch = {"pixel_values": x, "labels": torch.arange(5) % 4,
             "interpolate_pos_encoding": False}
    r = token_sensitivity(vit, batch, Patches(4), sigma=4.0, repeats=4, generator=0)
    assert set().union(*seen) == {"pixel_values", "interpolate_pos_encoding"}
    plain = token_sensitivity(vit, x, Patches(4), sigma=4.0, repeats=4, generator=0)
    assert r.estimate > 0  # flips happen: the comparison below can fail
    assert r.per_sample.tolist() == plain.per_sample.tolist()


@pytest.mark.parametrize(("shape", "p"), [((2, 3, 10, 10), 4), ((2, 3, 6, 6), 8)])
def test_patch_size_that_does_not_divide_the_image_is_refused(shape: tuple, p: int) -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape[1:]), 3))
    with pytest.raises(ValueError, match=rf"patch size {p} does not divide image size "
                                         rf"{shape[2]}x{shape[3]}; use one of 1, 2"):
        token_sensitivity(model, torch.rand(*shape), Patches(p), sigma=0.1)
