"""Checked int8 (``senslab.measure._int8``) and ``compile=True`` (``._compiled``): a mixture
whose experts may get no rows, models with forward hooks (the user's, and a measurement's own
noise hook) against the static int8 copy, and copies of a metric that has run compiled."""

from __future__ import annotations

import copy
import functools
import pickle

import pytest
import torch
from checked_flips import Recorder
from torch import nn

from senslab.measure import TokenSensitivity, _compiled, _int8
from senslab.models import create_model
from senslab.tokens import Embedding, Patches, Sequence

#: local reuse off: a pre-hook on the model is not run by its forward_local
PATCHES = Patches(4, reuse_local=False)
needs_int8 = pytest.mark.skipif(not _int8.available(),
                                reason="this torch has no x86 quantised linear kernels")


class MoE(nn.Module):
    """Top-1 routing of each token to one of four 64-wide experts, then a 3-class head: an
    expert no token is routed to runs on an empty input."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.router = nn.Linear(64, 4)
        self.experts = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
        self.head = nn.Linear(64, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            self.router.bias.copy_(torch.tensor([0.0, 0.0, 0.0, -100.0]))  # expert 3: never

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        pick = self.router(flat).argmax(-1)
        out = torch.zeros_like(flat)
        for i, expert in enumerate(self.experts):
            rows = (pick == i).nonzero().flatten()
            out[rows] = expert(flat[rows])
        return self.head(out.view_as(x).mean(1))


@needs_int8
def test_an_expert_without_rows_runs_checked_int8_with_float32_flips():
    """An eligible linear layer called on zero rows (a mixture's unrouted expert) once crashed
    the int8 pass (``aminmax`` of an empty tensor, recording its input's sizes): its call now
    records zeros, and the copies get float32's flips."""
    model = MoE().eval()
    x = torch.randn(8, 6, 64, generator=torch.Generator().manual_seed(1))
    runs = {}
    for precision in ("float32", "int8-checked"):
        m = Recorder(model, Sequence(), sigma=1.0, repeats=4, generator=5, precision=precision)
        m.update(x)
        runs[precision] = m
    checked, full = runs["int8-checked"], runs["float32"]
    assert checked.checked_precision == "int8" and checked._check._int8.calls > 0
    assert torch.equal(checked.copies, full.copies)
    assert 0 < full.compute().estimate < 1
    assert _int8.extents(torch.zeros(0, 64)) == [0.0, 0.0, 0.0]


def cnn() -> nn.Module:
    """The zoo's CNN, its weights doubled (patches flip its class at σ = 0.5): FX traces it,
    so checked int8 makes it a static int8 copy."""
    model = create_model("cnn", seed=0, image_size=16, channels=(16, 32), hidden=64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2)
    return model


def _normalise(module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
    return ((args[0] - 0.5) / 0.25,)


@needs_int8
def test_a_hooked_model_gets_no_static_int8_copy():
    """FX traces ``forward``, not the call: the static int8 copy of a model with a forward
    pre-hook (input normalisation) ran without it, a function other than the model's, which
    the check's calibration then took for int8's error (every copy re-checked). A hooked model
    keeps its hooks: no static copy, and float32's flips."""
    model = cnn()
    assert _int8.StaticInt8.applies(model)
    handle = model.register_forward_pre_hook(_normalise)
    assert not _int8.StaticInt8.applies(model)
    handle.remove()
    assert _int8.StaticInt8.applies(model)
    model.register_forward_pre_hook(_normalise)
    x = torch.rand(16, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    opts = {"sigma": 0.5, "repeats": 4, "generator": 5}
    full = Recorder(model, PATCHES, precision="float32", **opts)
    full.update(x)
    checked = Recorder(model, PATCHES, precision="int8-checked", **opts)
    checked.update(x)
    assert checked._check._static is None
    assert torch.equal(checked.copies, full.copies)
    assert 0 < full.compute().estimate < 1


@needs_int8
def test_a_hook_registered_between_batches_drops_the_static_copy():
    """A static copy made before a hook was registered would go on running without it: the
    hooks are part of what makes a new copy, and a hooked model gets none."""
    model = cnn()
    x = torch.rand(16, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    opts = {"sigma": 0.5, "repeats": 4, "generator": 5}
    checked = Recorder(model, PATCHES, precision="int8-checked", **opts)
    checked.update(x)
    assert checked._check._static is not None and checked._check._static.model is not None
    model.register_forward_pre_hook(_normalise)
    checked.update(x)
    assert checked._check._static is None
    full = Recorder(model, PATCHES, precision="float32", **opts)
    full.update(x)
    full.update(x)
    half = len(full.copies) // 2
    assert torch.equal(checked.copies[half:], full.copies[half:])
    assert 0 < full.compute().estimate < 1


class PatchNet(nn.Module):
    """Images → a strided convolution → 16 tokens of 32 features (``norm``) → a convolution
    over the token grid → a 3-class head: float inputs, noise inside the model."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.stem = nn.Conv2d(1, 32, 4, stride=4)
        self.norm = nn.LayerNorm(32)
        self.mix = nn.Conv2d(32, 32, 3, padding=1)
        self.head = nn.Linear(32, 3)
        with torch.no_grad():
            for p in self.parameters():
                scale = 1.5 / p[0].numel() ** 0.5 if p.dim() > 1 else 0.1
                p.copy_(torch.randn(p.shape, generator=g) * scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.norm(self.stem(x).flatten(2).transpose(1, 2))
        return self.head(torch.relu(self.mix(t.transpose(1, 2).unflatten(2, (4, 4)))).mean((2, 3)))


@needs_int8
def test_noise_added_by_a_hook_is_not_left_out_by_a_static_copy():
    """``Embedding`` tokens add the noise with a forward hook: a static int8 copy of a model
    fed float images ran the copies without their noise (each copy its clean example; only
    the calibration's wide band, every copy re-checked, kept float32's flips). No static copy
    under such a hook."""
    model = PatchNet().eval()
    assert _int8.StaticInt8.applies(model)
    x = torch.randn(16, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    opts = {"sigma": 4.0, "repeats": 4, "generator": 5}
    full = Recorder(model, Embedding("norm"), precision="float32", **opts)
    full.update(x)
    checked = Recorder(model, Embedding("norm"), precision="int8-checked", **opts)
    checked.update(x)
    assert checked._check._static is None
    assert torch.equal(checked.copies, full.copies)
    assert 0 < full.compute().estimate < 1


@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile with the eager backend: Dynamo traces for real, nothing is built by a C++
    compiler (which takes minutes on 2 CPU cores)."""
    monkeypatch.setattr(_compiled.torch, "compile",
                        functools.partial(torch.compile, backend="eager"))


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_metric_that_ran_compiled_can_be_copied(eager_compile, how):
    """A metric with ``compile=True`` that has measured holds its compiled model: copying or
    pickling it failed with ``KeyError: '_model'`` (the wrapper's attribute lookup, asked for
    ``__setstate__`` before it had a model). A copy now compiles its own model again, and goes
    on as the original does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.GELU(), nn.Flatten(),
                          nn.Linear(256, 3)).eval()
    g = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(4, 1, 8, 8, generator=g), torch.randn(4, 1, 8, 8, generator=g)
    m = TokenSensitivity(model, Patches(2), sigma=1.5, repeats=4, generator=0, compile=True)
    m.update(x1)
    assert m._compiled is not None
    twin = copy.deepcopy(m) if how == "deepcopy" else pickle.loads(pickle.dumps(m))
    assert twin._compiled._model is twin.model and twin.model is not model
    m.update(x2)
    twin.update(x2)
    assert torch.equal(twin.compute().per_sample, m.compute().per_sample)
    assert 0 < m.compute().estimate < 1
