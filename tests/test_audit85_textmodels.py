"""Audit 85 (text models, pretrained loading): the attention block given a 0/1 key mask that is
not bool, and a file of a saved folder passed to ``hf_config`` for the folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from senslab.models.text import Block, SelfAttention


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 5, 8, generator=g), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])


@pytest.mark.parametrize("kind", ["softmax", "relu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8])
def test_a_zero_one_key_mask_of_any_dtype_masks_the_padding_as_a_bool_one(kind, dtype):
    """A float 0/1 mask went to softmax attention as an additive one (+1 on real keys, the
    padding let in: row 0 moved by 10.9 when its padding changed); an integer one failed
    inside torch. Both now read as the bool mask, as ReLU attention already read them."""
    torch.manual_seed(0)
    attn = SelfAttention(8, 2, attention=kind).eval()
    block = Block(8, 2, 16, attention=kind).eval()
    x, mask = _inputs()
    padded = x.clone()
    padded[0, 3:] += 100.0  # what the padding holds must not matter
    with torch.no_grad():
        for layer in (attn, block):
            want = layer(x, mask.bool())
            torch.testing.assert_close(layer(x, mask.to(dtype)), want, rtol=0, atol=0)
            moved = layer(padded, mask.to(dtype))
            torch.testing.assert_close(moved[0, :3], want[0, :3], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["softmax", "relu"])
def test_an_additive_key_mask_is_refused_naming_the_fix(kind):
    """A 0/−inf mask was read as additive by softmax and as a factor by ReLU attention (NaN
    outputs): both refuse it now, naming ``key_mask=(mask == 0)``."""
    attn = SelfAttention(8, 2, attention=kind).eval()
    x, mask = _inputs()
    additive = torch.zeros(2, 5).masked_fill(mask == 0, float("-inf"))
    with pytest.raises(ValueError, match=r"holds -inf.*key_mask=\(mask == 0\)"):
        attn(x, additive)
    torch.testing.assert_close(attn(x, additive == 0), attn(x, mask.bool()))


def test_a_file_of_a_saved_folder_is_refused_naming_the_folder(tmp_path: Path):
    """``hf_config(DIR/config.json)`` read the config, and ``load_hf`` then took the JSON file
    for the weights: torch.load's UnpicklingError, advising weights_only=False."""
    transformers = pytest.importorskip("transformers")
    from senslab.models import pretrained

    config = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=24, vocab_size=50,
                                     max_position_embeddings=16)
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    transformers.BertModel(config).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"]
    with pytest.raises(ValueError, match=r"config\.json is a file; pass the directory that "
                                         r"save_pretrained wrote"):
        pretrained.hf_config(str(tmp_path / "config.json"))
    # the folder itself, also as a pathlib.Path (a missing one failed with AttributeError)
    assert pretrained.hf_config(tmp_path).architectures == ["BertModel"]
    with pytest.raises(ValueError, match="no such directory"):
        pretrained.hf_config(tmp_path / "missing" / "model")
