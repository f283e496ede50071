"""Audit 82 (models): the zoo's prefix reuse on copies perturbed after an example's last real
token (positions the model reads as padding, which a measurement mask of True perturbs)."""

from __future__ import annotations

import pytest
import torch

from senslab.measure import token_sensitivity
from senslab.models import create_model
from senslab.tokens import Embedding


def _model(name: str):
    model = create_model(name, vocab_size=50, dim=32, layers=2, max_len=16, num_classes=3,
                         seed=0).eval()
    with torch.no_grad():
        model.head.weight.mul_(50)  # predictions that depend on the tokens
    return model


def _ids() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 50, (4, 10), generator=g)
    ids[1, 6:] = 1  # the model's pad id: rows 1 and 2 end in padding
    ids[2, 3:] = 1
    return ids


@pytest.mark.parametrize("name", ["gpt2", "lstm"])
def test_a_copy_perturbed_after_the_last_real_token_gets_the_clean_logits(name: str) -> None:
    model, ids = _model(name), _ids()
    with torch.no_grad():
        clean = model(ids)
        cache = model.prefix_cache(model.embed_ln(model.embed(ids)), ids)
        src = torch.tensor([2, 1, 0, 2])
        tok = torch.tensor([5, 9, 4, 1])  # two after the last real token, two real tokens
        noise = torch.randn(4, 32, generator=torch.Generator().manual_seed(1)) * 5
        out = model.forward_suffix(cache, src, tok, noise)  # raised a raw RuntimeError
    torch.testing.assert_close(out[:2], clean[[2, 1]], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[2:], clean[[0, 2]], atol=1e-3)  # the real tokens' noise acts


@pytest.mark.parametrize("name", ["gpt2", "lstm"])
def test_prefix_reuse_with_a_mask_over_the_padding_gives_the_full_forwards_numbers(name):
    model, ids = _model(name), _ids()
    mask = torch.ones_like(ids, dtype=torch.bool)  # as the pad-id error suggests for real ids
    runs = [token_sensitivity(model, ids, Embedding("embed_ln", reuse_prefix=reuse), mask=mask,
                              sigma=5.0, repeats=2, generator=1).per_sample
            for reuse in (True, False)]
    torch.testing.assert_close(runs[0], runs[1])
