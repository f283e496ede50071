"""Audit 84 ("fabric"): Lightning Fabric's mixed precision (``Fabric(precision="bf16-mixed")``)
casts the inputs to bf16 and enters ``torch.autocast`` inside the ``_FabricModule``'s forward,
out of the regularizer's sight: a σ = 0.001 penalty on images near 3 came out 128× the float32
one, and autocast's rounding behind a last LayerNorm (11.7×) passed without a word. The
regularizer now runs Fabric's forward inside an equivalent autocast, as for accelerate's."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("lightning")
from lightning.fabric import Fabric  # noqa: E402

from senslab.tokens import Embedding  # noqa: E402
from senslab.train import regularize  # noqa: E402
from senslab.train.regularize import random_patch_noise, sensitivity_penalty  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(regularize, "_OUTPUT_GRID_SAID", set())
    monkeypatch.setattr(regularize, "_AUTOCAST_CALLS", [0])


def fabric_model(module: nn.Module, precision: str) -> nn.Module:
    return Fabric(accelerator="cpu", devices=1, precision=precision).setup_module(module)


def cnn() -> nn.Module:
    torch.manual_seed(0)  # test-only: init
    return nn.Sequential(nn.Conv2d(3, 8, 4, 4), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))


def images() -> torch.Tensor:
    return 3 + 0.1 * torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def test_fabric_bf16_mixed_small_sigma_is_refused_as_under_autocast():
    g = torch.Generator().manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="too small"):
        sensitivity_penalty(cnn(), images(), patch=4, sigma=0.001, generator=g)
    m = fabric_model(cnn(), "bf16-mixed")
    with pytest.raises(ValueError, match=r"too small .*images \(as torch.autocast rounds"):
        sensitivity_penalty(m, images(), patch=4, sigma=0.001,
                            generator=torch.Generator().manual_seed(0))


def test_fabric_bf16_mixed_keeps_its_own_numbers():
    """At a sound σ: penalty, float32 clean output and every gradient bit for bit those of the
    two forwards through Fabric's own forward."""
    fabric = Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")
    m = fabric.setup_module(cnn())
    x = images()
    pen, clean = sensitivity_penalty(m, x, patch=4, sigma=1.0,
                                     generator=torch.Generator().manual_seed(0))
    fabric.backward(pen + clean.square().mean())
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    noisy_x = random_patch_noise(x, 4, 1.0, torch.Generator().manual_seed(0))
    c = m(x)
    ref = torch.nn.functional.mse_loss(m(noisy_x), c)
    fabric.backward(ref + c.square().mean())
    assert clean.dtype == torch.float32 and torch.equal(clean, c) and torch.equal(pen, ref)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, m.parameters(), strict=True))
    assert "forward" not in vars(m)  # Fabric's forward is back


def test_fabric_autocast_rounding_behind_a_layernorm_is_warned_about():
    torch.manual_seed(0)  # test-only: init
    linear = nn.Linear(16, 8)
    with torch.no_grad():
        linear.bias.fill_(100.0)  # logits near 100: bf16 steps of 0.5 there
    m = fabric_model(nn.Sequential(nn.Flatten(), linear, nn.LayerNorm(8)), "bf16-mixed")
    x = torch.rand(64, 1, 4, 4, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sensitivity_penalty(m, x, patch=2, sigma=0.1, generator=torch.Generator().manual_seed(0))
    said = [str(w.message) for w in caught if "sensitivity_penalty" in str(w.message)]
    assert len(said) == 1 and "torch.autocast(dtype=torch.bfloat16)" in said[0]


class Text(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.ln, self.lin = nn.Embedding(50, 16), nn.LayerNorm(16), nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lin(self.ln(self.emb(ids))).mean(1)


def test_fabric_text_model_takes_its_own_module_names():
    torch.manual_seed(0)  # test-only: init
    inner = Text()
    m = fabric_model(inner, "32-true")
    ids = torch.randint(0, 50, (8, 6), generator=torch.Generator().manual_seed(2))
    got, _ = sensitivity_penalty(m, ids, tokens=Embedding("ln"), sigma=1.0,
                                 generator=torch.Generator().manual_seed(0))
    want, _ = sensitivity_penalty(inner, ids, tokens=Embedding("ln"), sigma=1.0,
                                  generator=torch.Generator().manual_seed(0))
    assert torch.equal(got, want)


def test_fabric_bf16_true_small_sigma_is_refused_on_the_inputs_grid():
    """``"bf16-true"`` casts the float32 images to bf16 in the forward: the noise is now added
    to and judged on those bf16 images (was 128× the float32 penalty, said only of the
    outputs' grid)."""
    m = fabric_model(cnn(), "bf16-true")
    with pytest.raises(ValueError, match=r"too small for the bfloat16 images"):
        sensitivity_penalty(m, images(), patch=4, sigma=0.001,
                            generator=torch.Generator().manual_seed(0))
    pen, clean = sensitivity_penalty(m, images(), patch=4, sigma=1.0,
                                     generator=torch.Generator().manual_seed(0))
    ref, _ = sensitivity_penalty(cnn(), images(), patch=4, sigma=1.0,
                                 generator=torch.Generator().manual_seed(0))
    assert clean.dtype == torch.float32 and abs(pen.item() / ref.item() - 1) < 0.02
