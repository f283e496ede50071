"""A base Hugging Face encoder (BertModel) under a per-token head of the user's own was read at
its last real token ([SEP]) as a causal model is, without a word; it is refused now, naming the
position to say. A causal base model (GPT2Model) under the same head is still read there, and
BERT as a decoder (``is_decoder``, causal attention) too."""

from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:the standard error rests:RuntimeWarning")

from senslab.measure import token_sensitivity  # noqa: E402
from senslab.tokens import Embedding  # noqa: E402


class PerToken(nn.Module):
    """A user's head over a base model's hidden states: logits at every position."""

    def __init__(self, base: nn.Module, width: int) -> None:
        super().__init__()
        self.base = base
        self.head = nn.Linear(width, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        return self.head(self.base(input_ids=input_ids,
                                   attention_mask=attention_mask).last_hidden_state)


def _bert(**extra) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=32, **extra)
    return PerToken(transformers.BertModel(config), 16).eval()


def _gpt2() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    return PerToken(transformers.GPT2Model(config), 16).eval()


INPUTS = {"input_ids": torch.randint(2, 50, (3, 6), generator=torch.Generator().manual_seed(1))}


def test_a_base_encoder_under_a_per_token_head_is_refused_at_the_last_token() -> None:
    model = _bert()
    with pytest.raises(ValueError, match=r"BertModel \(inside PerToken.*bidirectional.*"
                                         r"position=k"):
        token_sensitivity(model, INPUTS, Embedding("base.embeddings.LayerNorm"), sigma=0.5,
                          repeats=2)
    # the fix the message names measures
    r = token_sensitivity(model, INPUTS, Embedding("base.embeddings.LayerNorm", position=0),
                          sigma=0.5, repeats=2)
    assert 0.0 <= r.estimate <= 1.0


@pytest.mark.parametrize("make", [_gpt2, lambda: _bert(is_decoder=True)],
                         ids=["gpt2", "bert-decoder"])
def test_a_causal_base_model_under_a_per_token_head_is_read_at_the_last_token(make) -> None:
    model = make()
    name = "base.wte" if isinstance(model.base, transformers.GPT2Model) \
        else "base.embeddings.LayerNorm"
    r = token_sensitivity(model, INPUTS, Embedding(name), sigma=0.5, repeats=2)
    assert 0.0 <= r.estimate <= 1.0
