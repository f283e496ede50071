"""A dict input's head mask — (heads,) or (layers, heads): the model's, not the examples' — is
passed to every copy as it is, whatever its shape, where it was picked by rows when the layers
equalled the batch size and cut when the heads equalled the tokens (transformers 4.x models take
one; 5.x dropped it)."""

import torch

from senslab.tokens.base import cut_tokens, has_token_axis, select


def test_a_head_mask_as_long_as_the_batch_is_not_picked_by_rows():
    ids = torch.arange(24).view(4, 6)
    head = torch.tensor([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])  # 4 layers, 4 examples
    got = select({"input_ids": ids, "head_mask": head, "decoder_head_mask": head},
                 torch.tensor([2, 2, 0]))
    assert torch.equal(got["input_ids"], ids[[2, 2, 0]])
    assert got["head_mask"] is head and got["decoder_head_mask"] is head


def test_a_head_mask_as_wide_as_the_tokens_is_not_cut():
    ids = torch.arange(24).view(4, 6)
    head = torch.ones(3, 6)  # 3 layers of 6 heads, 6 tokens
    got = cut_tokens({"input_ids": ids, "cross_attn_head_mask": head}, 6, 4)
    assert got["input_ids"].shape == (4, 4) and got["cross_attn_head_mask"] is head
    assert not has_token_axis({"head_mask": head}, 6)
