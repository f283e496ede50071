"""Audit 84: Hugging Face heads read through a user's wrapper, and T5 without decoder inputs.

A wrapped one-output regression head was read as a binary logit without a word (0.0208 and
0.0417 measured), where the bare head is refused; T5ForConditionalGeneration without
decoder_input_ids failed inside Hugging Face ("You must specify exactly one of input_ids or
inputs_embeds", though input_ids were given). Tiny randomly initialised models, from configs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:the standard error rests:RuntimeWarning")

from senslab.measure import token_sensitivity  # noqa: E402
from senslab.tokens import auto_tokens  # noqa: E402

BERT = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=32)
T5 = dict(vocab_size=50, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
          decoder_start_token_id=0, pad_token_id=0)


class Logits(nn.Module):
    """A user's wrapper: calls the Hugging Face model and returns its logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def _ids() -> torch.Tensor:
    return torch.randint(2, 50, (4, 6), generator=torch.Generator().manual_seed(1))


def _regression(problem: str | None) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(**BERT, num_labels=1, problem_type=problem)
    return transformers.BertForSequenceClassification(config).eval()


@pytest.mark.parametrize("problem, says", [(None, "one output.*output_kind='logits'"),
                                           ("regression", "regression head.*compare='l1'")])
def test_a_wrapped_one_output_regression_head_is_refused_as_the_bare_one(problem, says):
    # before: the bare head refused, the wrapped one read as a binary logit (0.0208, 0.0417)
    head = _regression(problem)
    model = Logits(head)
    inputs = {"input_ids": _ids()}
    with pytest.raises(ValueError, match=says):
        token_sensitivity(head, inputs, auto_tokens(head), sigma=0.5, repeats=2)
    with pytest.raises(ValueError, match=rf"inside Logits.*{says}"):
        token_sensitivity(model, inputs, auto_tokens(model), sigma=0.5, repeats=2)


def test_a_wrapped_one_output_head_read_as_the_kind_it_names_matches_the_bare_one():
    head = _regression(None)
    inputs = {"input_ids": _ids()}
    bare = token_sensitivity(head, inputs, auto_tokens(head), sigma=0.5, repeats=2,
                             output_kind="logits", generator=0)
    model = Logits(head)
    wrapped = token_sensitivity(model, inputs, auto_tokens(model), sigma=0.5, repeats=2,
                                output_kind="logits", generator=0)
    assert torch.equal(bare.per_sample, wrapped.per_sample)
    single = _regression("multi_label_classification")  # one sigmoid: read as before
    assert token_sensitivity(Logits(single), inputs, auto_tokens(Logits(single)), sigma=0.5,
                             repeats=2).num_examples == 4


def test_t5_without_decoder_inputs_is_refused_by_senslab_naming_them():
    # before: "You must specify exactly one of input_ids or inputs_embeds" from Hugging Face
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**T5)).eval()
    ids = _ids()
    with pytest.raises(ValueError, match=r"T5ForConditionalGeneration.*decoder_input_ids"
                                         r".*decoder_start_token_id.*output=lambda"):
        token_sensitivity(model, {"input_ids": ids}, auto_tokens(model), sigma=0.5, repeats=2)
    start = torch.full((4, 1), model.config.decoder_start_token_id)
    fixed = token_sensitivity(model, {"input_ids": ids, "decoder_input_ids": start},
                              auto_tokens(model), sigma=0.5, repeats=2,
                              output=lambda o: o.logits[:, -1])
    assert fixed.num_examples == 4
