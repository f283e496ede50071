"""Embedding tokens on a Hugging Face vision-language model's word embedding: the forward writes
the vision tower's features over the image placeholders' positions, so noise there is discarded
and those positions read as never flipping. Refused, with fixes that measure."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from senslab import token_sensitivity  # noqa: E402
from senslab.tokens import Embedding, auto_tokens  # noqa: E402

IMAGE = 99

pytestmark = pytest.mark.filterwarnings("ignore:the standard error rests")


@pytest.fixture(scope="module")
def llava():
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    torch.manual_seed(0)  # test-only: the Hugging Face model initialises from the global RNG
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=2, image_size=32, patch_size=8)
    text = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, vocab_size=100)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE,
                         vision_feature_layer=-1)
    return LlavaForConditionalGeneration(config).eval()


def batch(g: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, IMAGE - 1, (3, 6), generator=g)
    ids = torch.cat([ids[:, :1], torch.full((3, 16), IMAGE), ids[:, 1:]], dim=1)  # 16 patches
    return {"input_ids": ids, "pixel_values": torch.randn(3, 3, 32, 32, generator=g),
            "attention_mask": torch.ones_like(ids)}


def test_noise_on_overwritten_placeholders_is_refused(llava):
    inputs = batch(torch.Generator().manual_seed(1))
    tokens = auto_tokens(llava)  # the language model's word embedding
    with pytest.raises(ValueError, match=r"placeholder token\(s\) \(image_token_index=99\).*"
                                         r"noise there is discarded.*16 placeholder"):
        token_sensitivity(llava, inputs, tokens, sigma=3.0, repeats=2, generator=0)


def test_the_fixes_measure(llava):
    inputs = batch(torch.Generator().manual_seed(1))
    tokens = auto_tokens(llava)
    text = (inputs["input_ids"] != IMAGE) & inputs["attention_mask"].bool()
    r = token_sensitivity(llava, inputs, tokens, mask=text, sigma=3.0, repeats=2, generator=0)
    assert r.num_forward > 0
    assert int(r.per_position.isfinite().sum()) == 6  # the 6 text positions, the images left out
    # a module after the merge keeps the noise on the image positions: measured, not refused
    after = Embedding("model.language_model.layers.0.input_layernorm")
    r = token_sensitivity(llava, inputs, after, sigma=3.0, repeats=2, generator=0)
    assert r.per_position.shape[0] == 22


def test_text_alone_is_not_judged(llava):
    ids = torch.randint(0, IMAGE - 1, (2, 5), generator=torch.Generator().manual_seed(2))
    r = token_sensitivity(llava, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                          auto_tokens(llava), sigma=3.0, repeats=2, generator=0)
    assert r.per_position.shape[0] == 5 and bool(r.per_position.isfinite().all())
