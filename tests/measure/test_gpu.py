"""The estimator on a CUDA device: same guarantees as on the CPU (chunking never changes the
numbers, same seed same numbers, padding never perturbed), reduced precision and torch.compile
within the float32 estimate's interval, the memory budget respected, and the zoo's models
measurable. Skipped where no GPU is present (CI); run on a GPU machine with
``pytest tests/measure/test_gpu.py`` (``SENSLAB_TEST_DEVICE=cpu`` runs the checks on the host)."""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.models import create_model
from senslab.tokens import Embedding, Patches

#: the device under test; SENSLAB_TEST_DEVICE=cpu runs the same checks on the host
CUDA = torch.device(os.environ.get("SENSLAB_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(CUDA.type == "cuda" and not torch.cuda.is_available(),
                                reason="needs a CUDA device")


def small_mlp(n: int = 64) -> tuple[nn.Module, torch.Tensor]:
    """An MLP at initialisation on 16×16×3 Gaussian images: its predictions spread over the 4
    classes and σ = 0.5 on a 4×4 patch flips about one in eight."""
    x = torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)  # test-only: model init
    model = nn.Sequential(nn.Flatten(), nn.Linear(768, 128), nn.GELU(), nn.Linear(128, 4))
    return model.to(CUDA).eval(), x.to(CUDA)


def within_interval(ref, other) -> bool:
    """``other`` lies within 4 standard errors of the float32 estimate."""
    return abs(ref.estimate - other.estimate) <= 4 * max(ref.stderr_subset, 1e-3)


@pytest.fixture(scope="module")
def mlp():
    return small_mlp()


def test_chunking_and_seed_never_change_the_numbers(mlp):
    model, x = mlp
    runs = [token_sensitivity(model, x, Patches(4), sigma=0.5, repeats=4, chunk_size=c,
                              generator=3) for c in (None, 37, None)]
    assert 0.01 < runs[0].estimate < 0.99
    assert torch.equal(runs[0].per_sample, runs[1].per_sample)
    assert torch.equal(runs[0].per_sample, runs[2].per_sample)
    assert runs[0].per_sample.device.type == "cpu" or runs[0].per_sample.is_cuda


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_agrees_with_float32(mlp, dtype):
    model, x = mlp
    ref = token_sensitivity(model, x, Patches(4), sigma=0.5, repeats=8, estimand="subset")
    low = token_sensitivity(model, x, Patches(4), sigma=0.5, repeats=8, estimand="subset",
                            autocast=dtype)
    assert 0.01 < ref.estimate < 0.99
    assert low.num_forward == ref.num_forward
    assert within_interval(ref, low)


def test_compile_agrees_with_eager(mlp):
    model, x = mlp
    ref = token_sensitivity(model, x, Patches(4), sigma=0.5, repeats=8, estimand="subset")
    comp = token_sensitivity(model, x, Patches(4), sigma=0.5, repeats=8, estimand="subset",
                             compile=True)
    assert within_interval(ref, comp)


def test_memory_budget_is_respected(mlp):
    model, x = mlp
    budget = 8 << 20
    if CUDA.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    m = TokenSensitivity(model, Patches(2), sigma=0.5, repeats=8, memory_budget=budget)
    m.update(x)
    total = len(x) * 64 * 8
    assert m.last_chunk_size is not None and m.last_chunk_size < total
    if CUDA.type == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
        assert peak < 3 * budget  # the chunk's activations, plus the inputs and state


@pytest.mark.skipif(CUDA.type == "cpu", reason="host and device are the same")
def test_inputs_on_the_host_are_an_error(mlp):
    model, x = mlp
    with pytest.raises(ValueError, match="inputs are on cpu but the model is on cuda"):
        token_sensitivity(model, x.cpu(), Patches(4), sigma=0.5)


@pytest.mark.parametrize("name", ["vit_small", "resnet18", "lstm", "roberta"])
def test_zoo_models_measurable_on_gpu(name):
    torch.manual_seed(0)  # test-only: model init
    model = create_model(name).to(CUDA).eval()
    g = torch.Generator().manual_seed(0)
    if name in ("vit_small", "resnet18"):
        x = (torch.rand(4, 3, 32, 32, generator=g) * 2 - 1).to(CUDA)
        r = token_sensitivity(model, x, Patches(4), sigma=3.0, repeats=2)
        assert r.per_position.shape == (64,)
        assert r.num_forward == 4 + 4 * 64 * 2
        return
    ids = torch.randint(2, 8000, (3, 128), generator=g).to(CUDA)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, 100:] = False  # padding: never perturbed
    r = token_sensitivity(model, {"input_ids": ids, "attention_mask": mask}, Embedding("embed_ln"),
                          sigma=3.0, repeats=2)
    assert r.num_forward == 3 + (128 * 3 - 28) * 2
    assert math.isfinite(r.estimate)


def test_bf16_checked_keeps_float32_decisions(mlp):
    """On tensor cores as on a CPU: the copies whose margin bf16 could flip are evaluated again
    in float32, so every decision is float32's; ``"auto"`` checks bf16 where the device has
    native bf16 matrix units."""
    model, x = mlp
    opts = dict(sigma=0.5, repeats=4, estimand="subset", generator=1)
    ref = token_sensitivity(model, x, Patches(4), precision="float32", **opts)
    chk = token_sensitivity(model, x, Patches(4), precision="bf16-checked", **opts)
    assert 0.01 < ref.estimate < 0.99
    assert torch.equal(ref.per_sample.cpu(), chk.per_sample.cpu())
    assert chk.recheck_fraction is not None and 0 < chk.recheck_fraction < 1
    assert chk.num_forward_fp32 > 0
    if CUDA.type == "cuda" and torch.cuda.get_device_capability(CUDA) >= (8, 0):
        auto = TokenSensitivity(model, Patches(4), **opts)
        auto.update(x)
        assert auto.checked_precision == "bf16"
        assert torch.equal(auto.compute().per_sample.cpu(), ref.per_sample.cpu())


def _padded_text(vocab: int, n: int = 4, width: int = 12) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (n, width), generator=g)
    lengths = torch.tensor([width, 5, 9, 3][:n])
    mask = torch.arange(width)[None] < lengths[:, None]
    return {"input_ids": ids.masked_fill(~mask, 0).to(CUDA), "attention_mask": mask.to(CUDA)}


def test_padding_trim_and_reuse_never_change_the_flips():
    """The exact cuts on the device: padding trimmed or evaluated, GPT-2's copies resumed from
    their clean prefix or run whole, ViT's local reuse or full forwards — the same flips with
    the same seed (float64 models, so no rounding decides a flip)."""
    torch.manual_seed(0)  # test-only: model init
    opts = dict(sigma=2.0, repeats=3, precision="float32", generator=2)
    gpt2 = create_model("gpt2", seed=0, vocab_size=40, dim=32, heads=2, layers=2,
                        max_len=16).double().to(CUDA).eval()
    batch = _padded_text(40)
    runs = [token_sensitivity(gpt2, batch, Embedding("embed_ln", reuse_prefix=reuse),
                              trim_padding=trim, **opts)
            for reuse, trim in ((True, True), (False, True), (False, False))]
    assert runs[0].estimate > 0
    for other in runs[1:]:
        assert torch.equal(runs[0].per_sample.cpu(), other.per_sample.cpu())
    vit = create_model("vit_small", seed=0, dim=32, depth=2, heads=2, dim_head=16).double()
    with torch.no_grad():  # larger weights: at initialisation every image is one class
        for p in vit.parameters():
            p.mul_(2)
    vit = vit.to(CUDA).eval()
    x = (torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1)
    x = x.double().to(CUDA)
    local, full = (token_sensitivity(vit, x, Patches(4, reuse_local=r), **{**opts, "sigma": 4.0})
                   for r in (True, False))
    assert local.estimate > 0
    assert torch.equal(local.per_sample.cpu(), full.per_sample.cpu())
