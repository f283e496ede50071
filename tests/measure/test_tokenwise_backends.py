"""Automatic chunking, reduced precision (autocast) and torch.compile: same estimand, and where
promised the same numbers."""

from __future__ import annotations

import math
from contextlib import contextmanager

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, _chunks, token_sensitivity
from senslab.measure._chunks import (
    CPU_TENSOR_BYTES,
    ActivationMeter,
    chunk_from_probe,
    default_budget,
    with_tensor_cap,
)
from senslab.tokens import Embedding, Patches


class TinyViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(1, 16, 4, stride=4)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x).flatten(2).transpose(1, 2)).mean(1))


class TinyText(nn.Module):
    """Embedding → LayerNorm (the tokens) → tanh MLP → mean → head. (oneDNN's CPU LSTM has no
    bf16 kernel on CPUs without bf16 instructions, so no LSTM here.)"""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 8)
        self.embed_ln = nn.LayerNorm(8)
        self.mix = nn.Linear(8, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed_ln(self.embedding(input_ids)))).mean(1))


def seeded(cls: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)  # test-only: model init
    return cls()


def images(n: int = 8) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def within_interval(a, b) -> bool:
    """Two independent estimates agree within 4 standard errors of their difference."""
    se = math.hypot(a.stderr_subset, b.stderr_subset)
    return abs(a.estimate - b.estimate) <= 4 * max(se, 1e-3)


@pytest.mark.parametrize("make, inputs, tokens", [
    (TinyViT, images(), Patches(2)),
    (TinyText, torch.randint(0, 20, (6, 9), generator=torch.Generator().manual_seed(2)),
     Embedding("embed_ln")),
])
def test_bfloat16_autocast_agrees_with_float32(make, inputs, tokens):
    model = seeded(make)
    opts = {"sigma": 1.5, "repeats": 8, "estimand": "subset"}
    a = token_sensitivity(model, inputs, tokens, **opts)
    b = token_sensitivity(model, inputs, tokens, autocast=torch.bfloat16, generator=1, **opts)
    assert 0.02 < a.estimate < 0.98  # informative
    assert within_interval(a, b)


def test_memory_budget_sets_the_chunk_and_never_the_numbers():
    model = seeded(TinyViT)
    x = images()
    runs = {}
    for budget in (50_000, 1 << 30):
        m = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=2, memory_budget=budget)
        m.update(x)
        runs[budget] = (m.last_chunk_size, m.compute())
    small, large = runs[50_000][0], runs[1 << 30][0]
    assert small is not None and large is not None and small < large
    assert large == len(x) * 16 * 2  # everything fits: one chunk
    assert torch.equal(runs[50_000][1].per_sample, runs[1 << 30][1].per_sample)


def test_activation_meter_sees_module_outputs():
    layer = nn.Linear(10, 1000)
    with ActivationMeter(layer, torch.device("cpu")) as meter:
        layer(torch.zeros(5, 10))
    # output 5×1000 floats (inputs are counted too), doubled for unseen temporaries
    assert 2 * 5 * 1000 * 4 <= meter.peak <= 2 * (5 * 1000 + 5 * 10) * 4
    assert chunk_from_probe(meter.peak, 5, 10 * meter.peak, 10_000) == 50
    assert chunk_from_probe(meter.peak, 5, 1, 10_000, even=True) == 2
    assert default_budget(torch.device("cpu")) >= 1 << 20


class WideInside(nn.Module):
    """A conv net whose forward makes a ``width``-channel temporary per image that no module
    returns (so no hook sees it), and keeps a per-batch layout of its input after its first
    call — a cache, not a temporary — from which each call reads a view."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.lift = nn.Parameter(torch.randn(width, 4, generator=torch.Generator().manual_seed(0)))
        self.head = nn.Linear(width, 3)
        self.kept: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kept is None:
            self.kept = torch.zeros(4096, 1024)  # 16 MiB, made inside the first forward
        h = self.conv(x).flatten(2)  # (n, 4, 64)
        wide = torch.einsum("ck,nkp->ncp", self.lift, h)  # (n, width, 64), unseen by hooks
        feature = wide.mean(2)
        return self.head(feature - feature.mean(1, keepdim=True)) + self.kept[0, :3]


def test_activation_meter_records_the_largest_temporary_only():
    """``largest``: the biggest storage an operation made and freed inside the forward — the
    unseen wide temporary; not the layout the forward keeps, nor the output."""
    model = WideInside()
    x = images(8)
    with torch.inference_mode(), ActivationMeter(model, torch.device("cpu")) as meter:
        model(x)
    assert meter.largest == 8 * 64 * 64 * 4  # the einsum's (8, 64, 64) float32 output
    with torch.inference_mode(), ActivationMeter(model, torch.device("cpu")) as meter:
        out = model(x[:2])  # kept already exists: reading its view is no temporary either
    assert meter.largest == 2 * 64 * 64 * 4
    assert out.shape == (2, 3)
    assert meter.peak < 2 * 64 * 64 * 4  # the hooks never saw it (why the cap needs the mode)


def test_with_tensor_cap_keeps_the_largest_tensor_under_the_cap():
    budget = 64 << 20
    assert with_tensor_cap(1000.0, 0.0, budget) == 1000.0  # nothing seen: unchanged
    assert with_tensor_cap(1e6, 1000.0, budget) == 1e6  # small temporaries: the budget rules
    per_copy = with_tensor_cap(1000.0, 1 << 20, budget)
    chunk = chunk_from_probe(per_copy, 1, budget, 10_000)
    assert chunk == CPU_TENSOR_BYTES // (1 << 20)  # 24 copies of a 1 MiB temporary


def test_host_chunks_keep_every_temporary_under_the_cap(monkeypatch):
    """On CPU under the default budget the automatic chunk keeps the largest temporary under
    CPU_TENSOR_BYTES; a budget the user gives is honoured as is; the numbers never change."""
    monkeypatch.setattr(_chunks, "CPU_TENSOR_BYTES", 6 * 64 * 64 * 4)  # 6 images' temporary
    x = images(8)
    model = seeded(WideInside)
    runs = {}
    for budget in (None, 1 << 30):
        m = TokenSensitivity(model, Patches(2), sigma=3.0, repeats=2,
                             memory_budget=budget, generator=3)
        m.update(x)
        runs[budget] = (m.last_chunk_size, m.compute())
    assert runs[None][0] == 6
    assert runs[1 << 30][0] == len(x) * 16 * 2  # the user's budget: one chunk
    assert runs[None][1].estimate > 0.02  # informative
    assert torch.equal(runs[None][1].per_sample, runs[1 << 30][1].per_sample)


def test_host_chunks_under_autocast_meter_the_einsum_it_casts(monkeypatch):
    """Under autocast the probe's metering no longer breaks a forward: its einsum of a float32
    parameter and a bf16 activation had failed (a dtype mismatch inside the dispatch mode,
    under inference mode). The einsum's bf16 output, half a float32 one, still sets the
    chunk."""
    monkeypatch.setattr(_chunks, "CPU_TENSOR_BYTES", 6 * 64 * 64 * 4)  # 6 float32 images'
    m = TokenSensitivity(seeded(WideInside), Patches(2), sigma=3.0, repeats=2,
                         autocast=torch.bfloat16, generator=3)
    m.update(images(8))
    assert m.last_chunk_size == 12  # 12 images' bf16 temporary
    assert m.compute().estimate > 0.02


@pytest.mark.slow  # compiling takes minutes on 2 CPU cores
def test_compile_agrees_with_eager():
    # a CNN: torch 2.13's compiler rejects nn.TransformerEncoderLayer's fused inference path
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.GELU(), nn.Flatten(),
                          nn.Linear(256, 3))
    x = images(4)
    a = token_sensitivity(model, x, Patches(2), sigma=1.5, repeats=8, estimand="subset")
    b = token_sensitivity(model, x, Patches(2), sigma=1.5, repeats=8, estimand="subset",
                          compile=True)
    assert b.num_forward == a.num_forward
    assert within_interval(a, b)


class _Counting(nn.Module):
    """Stands in for ``torch.compile(model)`` (compiling takes minutes on 2 CPU cores)."""

    def __init__(self, model: nn.Module, fail: bool = False) -> None:
        super().__init__()
        self.model, self.fail, self.calls = model, fail, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.fail:
            raise RuntimeError("compiled model failed")
        return self.model(x)


class _Recording(Patches):
    """Patches that remember every BoundTokens they hand out."""

    @contextmanager
    def bind(self, model, inputs, mask=None, output=None):
        with super().bind(model, inputs, mask, output) as bound:
            BOUND.append(bound)
            yield bound


BOUND: list = []


@pytest.mark.parametrize("fail", [False, True])
def test_compile_swap_is_undone(monkeypatch, fail):
    """compile=True runs the perturbed copies through the compiled model and then gives the
    bound tokenization its own model back — also when the compiled model raises."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.GELU(), nn.Flatten(),
                          nn.Linear(256, 3)).eval()
    wrapper = _Counting(model, fail)
    monkeypatch.setattr(TokenSensitivity, "_compiled_model", lambda self: wrapper)
    BOUND.clear()
    x = images(4)
    options = dict(sigma=1.5, repeats=4, chunk_size=8, generator=0)
    m = TokenSensitivity(model, _Recording(2), compile=True, **options)
    if fail:
        with pytest.raises(RuntimeError, match="compiled model failed"):
            m.update(x)
    else:
        m.update(x)
        eager = TokenSensitivity(model, Patches(2), **options)
        eager.update(x)
        assert torch.equal(m.compute().per_sample, eager.compute().per_sample)
    assert wrapper.calls > 0  # the swap did happen
    (bound,) = BOUND
    assert bound.model is model


def test_probe_once_per_input_shape():
    """Later batches of the same shape reuse the probed copy size: same chunk, same numbers as
    a fresh metric."""
    model = seeded(TinyViT)
    x = images()
    m = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=2, memory_budget=200_000,
                         precision="float32")  # "auto" may stop checking after a batch (a
    m.update(x[:4])  # new path, probed again) where the CPU multiplies bf16 faster
    first = m.last_chunk_size
    m.update(x[4:])
    assert m.last_chunk_size == first and len(m._per_copy) == 1
    fresh = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=2, memory_budget=200_000,
                             precision="float32")
    fresh.update(x[:4])
    fresh.update(x[4:])
    assert torch.equal(fresh.compute().per_sample, m.compute().per_sample)


def test_control_variate_through_an_embedding_hook():
    """Gradients reach the hooked token module: the CV estimate agrees with a plain one and
    its fixed-subset standard error is smaller at equal draws."""
    model = seeded(TinyText)
    ids = torch.randint(0, 20, (6, 9), generator=torch.Generator().manual_seed(2))
    opts = {"sigma": 1.5, "repeats": 16, "estimand": "subset"}
    plain = token_sensitivity(model, ids, Embedding("embed_ln"), **opts)
    cv = token_sensitivity(model, ids, Embedding("embed_ln"), control_variate="linear",
                           generator=1, **opts)
    assert 0.02 < plain.estimate < 0.98
    assert within_interval(plain, cv)
    assert cv.stderr_subset < plain.stderr_subset
    assert cv.num_forward == plain.num_forward + len(ids)  # the gradient pass


class _CountingCompiler:
    """Stands in for ``torch.compile`` (compiling takes minutes on 2 CPU cores): what it is
    asked to compile, and how often each compiled function runs."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def __call__(self, fn):
        name = getattr(fn, "__name__", type(fn).__name__)
        self.calls[name] = 0

        def compiled(*args, **kwargs):
            self.calls[name] += 1
            return fn(*args, **kwargs)
        return compiled


def _lively_cnn() -> nn.Module:
    from senslab.models import create_model

    model = create_model("cnn", seed=0, image_size=16, channels=(4, 8), hidden=16).eval()
    with torch.no_grad():  # larger weights: some patches flip the class at σ = 1
        for p in model.parameters():
            p.mul_(2)
    return model


@pytest.mark.parametrize("case", ["local", "prefix"])
def test_compile_reaches_the_reuse_path(monkeypatch, case):
    """With reuse on, the copies go through the model's forward_local/forward_suffix, not its
    call: compile=True compiles those (it once compiled the call alone, so a zoo ResNet or
    GPT-2 ran no compiled code), the clean caches stay eager, the numbers are eager's, and the
    model is given back."""
    from senslab.measure import _compiled

    compiler = _CountingCompiler()
    monkeypatch.setattr(_compiled.torch, "compile", compiler)
    if case == "local":
        model, tokens = _lively_cnn(), Patches(4)
        inputs = torch.randn(3, 1, 16, 16, generator=torch.Generator().manual_seed(0))
        path, cache = "forward_local", "local_cache"
    else:
        from senslab.models import create_model

        model = create_model("gpt2", seed=0, vocab_size=20, dim=16, heads=2, layers=2,
                             max_len=16).eval()
        ids = torch.randint(0, 20, (3, 9), generator=torch.Generator().manual_seed(1))
        mask = torch.ones_like(ids)
        mask[1, 5:] = 0
        inputs, tokens = {"input_ids": ids, "attention_mask": mask}, Embedding("embed_ln")
        path, cache = "forward_suffix", "prefix_cache"
    options = dict(sigma=1.0, repeats=3, chunk_size=8, generator=0)
    eager = TokenSensitivity(model, tokens, **options)
    eager.update(inputs)
    m = TokenSensitivity(model, tokens, compile=True, **options)
    m.update(inputs)
    assert compiler.calls[path] > 0  # the copies went through the compiled path …
    assert compiler.calls[type(model).__name__] == 0  # … and none through the compiled call
    assert cache not in compiler.calls  # built once per batch, eagerly
    assert m._compiled.compiled_paths == (path,)
    assert m._compiled.training is model.training  # other attributes are the model's
    assert torch.equal(m.compute().per_sample, eager.compute().per_sample)
    assert m.compute().estimate > 0


@pytest.mark.slow  # compiling takes minutes on 2 CPU cores
def test_compiled_local_reuse_agrees_with_eager():
    from torch._dynamo.utils import counters

    model = _lively_cnn()
    x = torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    opts = dict(sigma=1.0, repeats=4, estimand="subset", generator=0)
    a = token_sensitivity(model, x, Patches(4), **opts)
    counters.clear()
    b = token_sensitivity(model, x, Patches(4), compile=True, **opts)
    assert counters["stats"]["unique_graphs"] >= 1  # something was compiled
    assert 0.02 < a.estimate < 0.98
    assert b.num_forward == a.num_forward
    assert (a.per_sample - b.per_sample).abs().max() <= 1 / (16 * 4)  # at most a boundary flip


def test_autocast_queries_fall_back_on_a_torch_without_their_device_argument(monkeypatch):
    """Before torch 2.4 ``is_autocast_enabled`` took no device and ``get_autocast_dtype`` did
    not exist: the host's own queries answer instead."""
    from senslab._autocast import autocast_dtype, autocast_on

    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_on("cpu") and autocast_dtype("cpu") == torch.bfloat16
        monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: (_ for _ in ()).throw(
            TypeError("is_autocast_enabled() takes 0 positional arguments")) if a else False)
        monkeypatch.delattr(torch, "get_autocast_dtype")
        assert autocast_on("cpu") and autocast_dtype("cpu") == torch.bfloat16
    assert not autocast_on("cpu")
