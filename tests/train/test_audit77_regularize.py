"""Audit 77 of the sensitivity regularizer: the rounding check judges each call's own noise
(not a pool shared with earlier calls), a ``mask=`` that marks padding is told, and settings
that are no numbers (``alpha=True``, a tensor σ) are refused by name."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.models import create_model
from senslab.tokens import Embedding, Sequence
from senslab.train.regularize import (
    gaussian_noise_augment,
    sensitivity_penalty,
    sensitivity_regularized_loss,
)

PAD, BOS = 1, 2


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _image_model() -> nn.Module:
    torch.manual_seed(0)  # test-only: init
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 5))


def test_noise_rounded_away_on_a_small_bf16_batch_is_refused_at_once():
    """4 bf16 images near 3 (48 perturbed entries, under the 1024 a pool waited for) at
    σ = 0.001: the penalty came out 0.0 (float32: 8.6e-8) without a word, and the refusal came
    calls later — on a sound σ = 1 call, naming the earlier noise. Each call is judged now."""
    model = _image_model().to(torch.bfloat16)
    x = (torch.rand(4, 3, 8, 8, generator=_gen(1)) * 2 + 2).bfloat16()
    with pytest.raises(ValueError, match="too small for the bfloat16 images"):
        sensitivity_penalty(model, x, sigma=1e-3, generator=_gen(0))
    # a sound call after it is judged on its own noise
    penalty, _ = sensitivity_penalty(model, x, sigma=1.0, generator=_gen(0))
    assert torch.isfinite(penalty) and penalty > 0
    # the same for vector sequences and for the whole-input augmentation of one example
    vectors = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8, 2)).to(torch.bfloat16)
    v = (torch.rand(2, 3, 8, generator=_gen(2)) + 2).bfloat16()
    with pytest.raises(ValueError, match="too small for the bfloat16 token vectors"):
        sensitivity_penalty(vectors, v, tokens=Sequence(), sigma=1e-3, generator=_gen(0))
    with pytest.raises(ValueError, match="too small for the bfloat16"):
        gaussian_noise_augment(x[:1], 1e-3, _gen(0))


def test_noise_rounded_by_autocast_on_a_small_batch_is_refused_at_once():
    """Float32 images under a bf16 autocast, batch of 4 at σ = 0.001: the penalty was 3.2e-6,
    38× the float32 one (8.6e-8), returned without a word."""
    model = _image_model()
    x = torch.rand(4, 3, 8, 8, generator=_gen(1)) * 2 + 2
    with torch.autocast("cpu", dtype=torch.bfloat16), \
            pytest.raises(ValueError, match=r"too small .*images \(as torch.autocast rounds"):
        sensitivity_penalty(model, x, sigma=1e-3, generator=_gen(0))


def _roberta() -> nn.Module:
    return create_model("roberta", vocab_size=40, max_len=16, dim=16, layers=1, heads=2,
                        pad_id=PAD, num_classes=2, dropout=0.0).train()


def test_a_mask_that_marks_padding_is_told():
    """``mask=ids != BOS`` (meant: leave out the [BOS]) is true on the padding too: the noise
    landed on padding that the attention mask hides, and the penalty came out about 5× smaller
    (7.2e-11 against 3.7e-10 averaged over 200 draws) without a word, where a measurement warns.
    The regularizer warns as the measurement does; a mask within the real tokens is quiet."""
    model = _roberta()
    lengths = torch.tensor([2, 3, 2, 8])
    ids = torch.randint(3, 40, (4, 8), generator=_gen(0))
    ids[:, 0] = BOS
    real = torch.arange(8)[None] < lengths[:, None]
    ids = ids.masked_fill(~real, PAD)
    batch = {"input_ids": ids, "attention_mask": real.long()}
    with pytest.warns(UserWarning, match="marks 17 positions real that the input's "
                                         "'attention_mask' entry marks as padding"):
        sensitivity_penalty(model, batch, tokens=Embedding("embed_ln"), mask=ids != BOS,
                            generator=_gen(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sensitivity_penalty(model, batch, tokens=Embedding("embed_ln"),
                            mask=(ids != BOS) & real, generator=_gen(0))


@pytest.mark.parametrize("setting", [{"alpha": True}, {"sigma": True}, {"sigma": False}])
def test_a_bool_setting_is_refused_not_read_as_a_number(setting):
    """``alpha=True`` trained on the MSE term alone (α = 1) and ``sigma=True`` added σ = 1,
    without a word: a bool is no weight or standard deviation."""
    x, y = torch.randn(4, 3, 8, 8, generator=_gen(0)), torch.tensor([0, 1, 2, 3])
    name = next(iter(setting))
    with pytest.raises(TypeError, match=f"{name} .*got True|{name} .*got False"):
        sensitivity_regularized_loss(_image_model(), x, y, patch=4, generator=_gen(0),
                                     **setting)


def test_a_tensor_sigma_is_refused_by_its_type():
    """σ = torch.tensor(1.0) was refused as "must be >= 0, got tensor(1.)": true of no
    tensor, and no fix named. The error names the type and the fix (float(sigma))."""
    x = torch.randn(4, 3, 8, 8, generator=_gen(0))
    with pytest.raises(TypeError, match=r"float\(sigma\)"):
        sensitivity_penalty(_image_model(), x, patch=4, sigma=torch.tensor(1.0),
                            generator=_gen(0))
    with pytest.raises(TypeError, match=r"float\(alpha\)"):
        sensitivity_regularized_loss(_image_model(), x, torch.tensor([0, 1, 2, 3]), patch=4,
                                     alpha=torch.tensor(0.5), generator=_gen(0))
