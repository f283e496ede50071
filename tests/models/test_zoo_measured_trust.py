"""What a researcher measuring the zoo's small and vision models trusts without looking: the
window arithmetic of local reuse (``senslab.models.windows``) never returns another layer's
numbers, the CNN's windows match its full forward on awkward inputs, a measurement leaves the
model as it found it and repeats exactly, and ``default_tokens()`` names what it says."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab import token_sensitivity
from senslab.models import create_model
from senslab.models.windows import Window, local
from senslab.tokens import Embedding, Patches, Sequence


def _bn(channels: int, **kw) -> nn.BatchNorm2d:
    """A BatchNorm2d with non-trivial running statistics (seeded)."""
    bn = nn.BatchNorm2d(channels, **kw)
    if bn.running_mean is not None:
        g = torch.Generator().manual_seed(7)
        bn.running_mean.copy_(torch.randn(channels, generator=g))
        bn.running_var.copy_(torch.rand(channels, generator=g) + 0.5)
    return bn


class _StdConv(nn.Conv2d):
    """A weight-standardised convolution (as in BiT/NFNet ResNets): its own forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        w = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / (w.std(dim=(1, 2, 3), keepdim=True) + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


def _window_vs_full(layer: nn.Module, size: int = 12, top: int = 0, left: int = 3,
                    p: int = 3, channels: int = 2, then: nn.Module | None = None,
                    reference: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(windowed, full): ``local``'s output window for one copy of example 1 with a patch at
    ``top``/``left`` (then ``then`` on it), and the same positions of ``reference`` (default
    ``layer``) run on the whole perturbed map."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, channels, size, size, generator=g)
    patch = torch.randn(1, channels, p, p, generator=g) * 3
    win = Window(x, torch.tensor([1]), patch, torch.tensor([top]), torch.tensor([left]))
    with torch.no_grad():
        y, t, lft = local(layer, win)
        if then is not None:
            y = then(y)
        perturbed = x[1:2].clone()
        perturbed[:, :, top:top + p, left:left + p] = patch
        full = (reference or layer)(perturbed)  # batch statistics, where used, are this map's
    t, lft = int(t), int(lft)
    return y, full[:, :, t:t + y.shape[2], lft:lft + y.shape[3]]


def _convmixer_patch_embedding() -> nn.Module:
    """ConvMixer's first layer, Sequential(conv, GELU, BatchNorm2d), with trained-looking
    running statistics."""
    model = create_model("convmixer", image_size=12, in_channels=2, patch_size=3, dim=4,
                         depth=1).eval()
    embed = model.net[0]
    embed[2].load_state_dict(_bn(4).state_dict())
    return embed


def _train_mode_bn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), _bn(3)).train()


# layers local() cannot window: each used to return values that are not the layer's
REFUSED = {
    "conv reflect padding": lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"),
    "conv replicate padding": lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="replicate"),
    "conv circular padding": lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular"),
    "conv with its own forward": lambda: _StdConv(2, 3, 3, padding=1),
    "non-square max pool": lambda: nn.MaxPool2d((2, 3)),
    "avg pool, stride per axis": lambda: nn.AvgPool2d(2, stride=(2, 1)),
    "max pool padded on one axis": lambda: nn.MaxPool2d(2, padding=(0, 1)),
    "conv, GELU, BatchNorm (ConvMixer)": _convmixer_patch_embedding,
    "conv, GroupNorm": lambda: nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4)),
    "conv, BatchNorm without running stats": lambda: nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1), _bn(3, track_running_stats=False)).eval(),
    "conv, BatchNorm in train mode": _train_mode_bn,
}
# layers it can: the window must equal the full layer's output there
WINDOWED = {
    "conv zero padding": lambda: nn.Conv2d(2, 3, 3, padding=1),
    "strided depthwise conv": lambda: nn.Conv2d(2, 2, 3, stride=2, padding=1, groups=2),
    "conv, eval BatchNorm": lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), _bn(3)).eval(),
    "max pool given as pairs": lambda: nn.MaxPool2d((2, 2), stride=(2, 2), dilation=(1, 1)),
    "avg pool 3 stride 2": lambda: nn.AvgPool2d(3, stride=2),
}


@pytest.mark.parametrize("name", list(REFUSED) + list(WINDOWED))
def test_local_never_returns_a_window_that_differs_from_the_full_layer(name):
    """The property: ``local`` either refuses or returns the full layer's values (computed
    independently, by the layer itself on the whole perturbed map)."""
    layer = {**REFUSED, **WINDOWED}[name]()
    if name in WINDOWED:
        windowed, full = _window_vs_full(layer)
        torch.testing.assert_close(windowed, full, rtol=1e-5, atol=1e-5)
        return
    # the full layer on the perturbed map, against what the window gave before: a wrong number
    with pytest.raises(ValueError, match="local reuse"):
        _window_vs_full(layer)


@pytest.mark.parametrize("name, fix", [
    ("conv reflect padding", "reuse_local=False"),
    ("conv with its own forward", "reuse_local=False"),
    ("conv, GELU, BatchNorm (ConvMixer)", r"local\(seq\[0\], win\)"),
    ("conv, BatchNorm in train mode", r"model\.eval\(\)"),
])
def test_a_refusal_names_the_fix(name, fix):
    with pytest.raises(ValueError, match=fix):
        _window_vs_full(REFUSED[name]())


def test_the_convmixer_embedding_windowed_as_the_refusal_says_is_right():
    """The way the refusal points to: the convolution windowed alone, then its pointwise layers
    (GELU, eval BatchNorm) on the window, gives the whole layer's values."""
    embed = _convmixer_patch_embedding()
    windowed, full = _window_vs_full(embed[0], top=3, left=6, then=nn.Sequential(*embed[1:]),
                                     reference=embed)
    assert windowed.shape[2] * windowed.shape[3] < 16  # a window of the 4×4 output map
    torch.testing.assert_close(windowed, full, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ the CNN's windows
@pytest.mark.parametrize("image, kernel, patch, dtype, channels_last", [
    (27, 3, 3, torch.float32, False),    # 23×23 map: the 2×2 pool drops its last row
    (27, 3, 9, torch.float32, True),     # channels-last memory
    (29, 3, 1, torch.float64, False),    # float64 model and images, 1×1 tokens
    (30, 2, 6, torch.float32, False),    # even kernel
])
def test_cnn_windows_equal_the_full_forward_on_awkward_inputs(image, kernel, patch, dtype,
                                                             channels_last):
    model = create_model("cnn", image_size=image, kernel_size=kernel, sens_patch=image,
                         channels=[3, 5], hidden=8).eval().to(dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 1, image, image, generator=g, dtype=dtype)  # a batch of one
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    grid = image // patch
    tok = torch.arange(grid * grid)
    top, left = tok // grid * patch, tok % grid * patch
    noisy = torch.randn(len(tok), 1, patch, patch, generator=g, dtype=dtype) * 2
    with torch.no_grad():
        fast = model.forward_local(model.local_cache(x, patch), torch.zeros_like(tok), top,
                                   left, noisy)
        copies = x.repeat(len(tok), 1, 1, 1)
        for i in range(len(tok)):
            copies[i, :, top[i]:top[i] + patch, left[i]:left[i] + patch] = noisy[i]
        full = model(copies)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(fast, full, rtol=tol, atol=tol)


# ------------------------------------------------------------------ measurement leaves no trace
@pytest.mark.parametrize("name, overrides, make", [
    ("convmixer", {"image_size": 8, "patch_size": 2, "dim": 8, "depth": 1},
     lambda g: torch.randn(2, 3, 8, 8, generator=g)),
    ("boolean_transformer", {"n_bits": 5, "dim": 16, "ff_dim": 16, "dropout": 0.3},
     lambda g: torch.randint(0, 2, (4, 5), generator=g)),
])
@pytest.mark.parametrize("train", [True, False])
def test_a_measurement_repeats_exactly_and_leaves_modes_and_buffers_alone(name, overrides,
                                                                          make, train):
    """BatchNorm statistics and dropout: a model left in train mode is measured in eval mode
    (the default), gives the same number twice, and comes back in its own mode with its
    running statistics untouched."""
    model = create_model(name, **overrides).train(train)
    x = make(torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = [token_sensitivity(model, x, sigma=2.0, generator=4) for _ in range(2)]
    assert torch.equal(runs[0].per_sample, runs[1].per_sample)
    assert [m.training for m in model.modules()] == modes
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


# ------------------------------------------------------------------ default tokens
def test_default_tokens_name_what_the_docstrings_say():
    assert create_model("mlp", sens_patch=7).default_tokens() == Patches(7)
    assert create_model("cnn", sens_patch=14).default_tokens() == Patches(14)
    assert create_model("convmixer", dim=8, depth=1, patch_size=8).default_tokens() == Patches(8)
    assert create_model("sparse_attention").default_tokens() == Sequence()
    assert create_model("attention_model").default_tokens() == Sequence()
    for name, module in [("modadd_transformer", "embed"), ("parity_transformer", "embed"),
                         ("boolean_transformer", "bit_embed")]:
        model = create_model(name)
        tokens = model.default_tokens()
        assert tokens == Embedding(module)
        assert isinstance(dict(model.named_modules())[module], nn.Embedding)
