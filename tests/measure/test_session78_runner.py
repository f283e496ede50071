"""The copies' checks judge a bf16 model by bf16's rounding also where its outputs are cast to
float32 (prefix reuse had been refused as a forward_suffix that disagrees), and ``max_forward``
without ``target_stderr`` is refused with an allocation too (its one round ignored the cap)."""

from __future__ import annotations

import pytest
import torch

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.models import create_model
from senslab.models.text import GPT2Classifier, init_weights
from senslab.tokens import Embedding, Patches

SMALL = dict(vocab_size=40, max_len=16, dim=16, layers=2, heads=2, pad_id=1)


class _DroppedNoise(GPT2Classifier):
    """A reuse path that loses the noise: right with zero noise, wrong on every noisy copy."""

    def forward_suffix(self, cache, src, tok, noise):  # type: ignore[no-untyped-def]
        return super().forward_suffix(cache, src, tok, noise * 0)


class _HalvedNoise(GPT2Classifier):
    """A reuse path that rescales the noise."""

    def forward_suffix(self, cache, src, tok, noise):  # type: ignore[no-untyped-def]
        return super().forward_suffix(cache, src, tok, noise * 0.5)


def _bf16_gpt2(cls: type[GPT2Classifier] = GPT2Classifier) -> GPT2Classifier:
    """The zoo's gpt2, small, with weights large enough for its predictions to vary, in bf16."""
    model = create_model("gpt2", **SMALL).eval()
    init_weights(model, torch.Generator().manual_seed(5), linear_std=0.3, embed_std=1.0)
    model.__class__ = cls
    return model.bfloat16()


def _inputs() -> dict[str, torch.Tensor]:
    ids = torch.randint(2, SMALL["vocab_size"], (4, 10), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones(4, 10, dtype=torch.bool)}


def _measure(model: GPT2Classifier, reuse: bool = True) -> float:
    # the head's bf16 logits read as float32, as a user casts them for the metric
    r = token_sensitivity(model, _inputs(), Embedding("embed_ln", reuse_prefix=reuse), sigma=1.0,
                          repeats=4, generator=0, output=lambda out: out.float())
    return r.estimate


@pytest.mark.filterwarnings("ignore:the standard error rests on few flips")
def test_bf16_model_with_float32_outputs_is_measured_through_prefix_reuse():
    """bf16's rounding (0.015 on logits of size 1.7) was judged with float32's tolerance
    (0.0017): a correct forward_suffix was refused as one that disagrees with the forward.
    Reuse and full forwards now give the same number, and a reuse path that drops or rescales
    the noise is still refused."""
    assert _measure(_bf16_gpt2()) == _measure(_bf16_gpt2(), reuse=False)
    for broken in (_DroppedNoise, _HalvedNoise):
        with pytest.raises(RuntimeError, match="forward_suffix disagrees with its forward"):
            _measure(_bf16_gpt2(broken))


@pytest.mark.parametrize("allocation", ["linear", "uniform"])
def test_max_forward_without_target_is_refused_with_an_allocation(allocation):
    """Without a target an allocation runs one round, which always runs: ``max_forward=20``
    was accepted and 95 forwards spent. It is refused, naming budget=; with a target it caps
    the rounds as before."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"max_forward=20 caps .*budget=.*target_stderr="):
        token_sensitivity(model, x, Patches(4), sigma=1.0, allocation=allocation,
                          max_forward=20, generator=0)
    m = TokenSensitivity(model, Patches(4), sigma=1.0, allocation=allocation,
                         target_stderr=0.05, max_forward=20)
    assert m.max_forward == 20
