"""Audit 84 of the sensitivity regularizer: a model whose forward Hugging Face accelerate's mixed
precision patched (``Trainer(bf16=True)``) is checked as under ``torch.autocast`` (its penalty
was the rounding's, 100x the float32 one, without a word), with the patched forward's own
numbers where the noise is sound; and a NaN token in bf16 (or autocast-rounded) images gives a
NaN penalty, as in float32, not a refusal that blames sigma."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.train.regularize import random_patch_noise, sensitivity_penalty


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 4, 4), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))


@pytest.fixture
def bf16_accelerator() -> Iterator[object]:
    pytest.importorskip("accelerate")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # another test's precision would be refused
    try:
        yield Accelerator(mixed_precision="bf16", cpu=True)
    finally:
        AcceleratorState._reset_state(True)


def test_accelerates_bf16_forward_is_checked_as_under_autocast(bf16_accelerator) -> None:
    """σ = 0.001 on images near 3: refused under ``torch.autocast``; through accelerate's
    patched forward the penalty was 8.0e-7 for float32's 8.0e-9, without a word."""
    x = 3 + 0.1 * torch.randn(8, 3, 16, 16, generator=_gen(1))
    float32, _ = sensitivity_penalty(_cnn(), x, patch=4, sigma=0.001, generator=_gen(0))
    assert 0 < float32.item() < 1e-7
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError,
                                                                     match="too small"):
        sensitivity_penalty(_cnn(), x, patch=4, sigma=0.001, generator=_gen(0))
    model = bf16_accelerator.prepare(_cnn())
    patched = vars(model)["forward"]
    with pytest.raises(ValueError, match="too small for the bfloat16 images"):
        sensitivity_penalty(model, x, patch=4, sigma=0.001, generator=_gen(0))
    assert vars(model)["forward"] is patched  # the patch is put back, after an error too


def test_accelerates_bf16_forward_keeps_its_own_numbers(bf16_accelerator) -> None:
    """At a sound σ the penalty, its gradient and the float32 clean output are bit for bit
    those of the patched forward itself."""
    model = bf16_accelerator.prepare(_cnn())
    patched = vars(model)["forward"]
    x = torch.randn(8, 3, 16, 16, generator=_gen(1))
    penalty, clean = sensitivity_penalty(model, x, patch=4, sigma=1.0, generator=_gen(0))
    assert vars(model)["forward"] is patched
    noisy = random_patch_noise(x, 4, 1.0, _gen(0))
    direct = F.mse_loss(model(noisy), model(x))
    assert clean.dtype == torch.float32 and torch.equal(clean, model(x))
    assert torch.equal(penalty, direct)
    params = list(model.parameters())
    for a, b in zip(torch.autograd.grad(penalty, params), torch.autograd.grad(direct, params),
                    strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("case", ["bf16", "autocast"])
def test_a_nan_image_gives_a_nan_penalty_not_a_sigma_refusal(case: str) -> None:
    """One NaN image of a bf16 batch (or a float32 one under bf16 autocast) at σ = 1 was
    refused with "the noise is too small … use a larger sigma"; float32 gives NaN."""
    x = torch.randn(4, 3, 8, 8, generator=_gen(1))
    x[0] = float("nan")
    model = _cnn()[:2]
    fp32, _ = sensitivity_penalty(model, x, patch=4, sigma=1.0, generator=_gen(0))
    assert torch.isnan(fp32)
    if case == "bf16":
        penalty, _ = sensitivity_penalty(model.bfloat16(), x.bfloat16(), patch=4, sigma=1.0,
                                         generator=_gen(0))
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            penalty, _ = sensitivity_penalty(model, x, patch=4, sigma=1.0, generator=_gen(0))
    assert torch.isnan(penalty)
    # the finite images are still judged: σ = 0.001 near 3 is refused with one NaN image too
    x[1:] = 3 + 0.1 * torch.randn(3, 3, 8, 8, generator=_gen(2))
    with pytest.raises(ValueError, match="too small"):
        if case == "bf16":
            sensitivity_penalty(model, x.bfloat16(), patch=4, sigma=0.001, generator=_gen(0))
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                sensitivity_penalty(model, x, patch=4, sigma=0.001, generator=_gen(0))


def test_an_image_models_dict_batch_is_told_to_pass_its_pixel_values() -> None:
    """``{"pixel_values": images}`` (an image model's own batch) was refused as "model inputs
    such as input_ids and attention_mask", sent to ``Embedding`` for text."""
    x = {"pixel_values": torch.randn(2, 3, 16, 16, generator=_gen(1))}
    with pytest.raises(TypeError, match=r"x=batch\['pixel_values'\]") as info:
        sensitivity_penalty(_cnn(), x, patch=4, generator=_gen(0))
    assert "for text" not in str(info.value)
    penalty, _ = sensitivity_penalty(_cnn(), x["pixel_values"], patch=4, generator=_gen(0))
    assert penalty.item() > 0
