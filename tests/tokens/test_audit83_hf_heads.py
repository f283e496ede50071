"""Audit 83: Hugging Face heads measured through a user's wrapper, and multiple-choice inputs.

A wrapper around a token classifier or masked LM was read at its last token ([SEP]) without a
word, one around a multi-label head by the argmax of its labels; multiple-choice inputs were
refused as a sequence-first model's. Tiny randomly initialised models, built from configs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:the standard error rests:RuntimeWarning")

from senslab.measure import token_sensitivity  # noqa: E402
from senslab.tokens import Embedding, auto_tokens  # noqa: E402

BERT = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=32)


def _bert(cls: type, **kw: object) -> nn.Module:
    torch.manual_seed(0)
    return cls(transformers.BertConfig(**BERT, **kw)).eval()


class Logits(nn.Module):
    """A user's wrapper: calls the Hugging Face model and returns its logits."""

    def __init__(self, model: nn.Module, column: int | None = None) -> None:
        super().__init__()
        self.model, self.column = model, column

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return out if self.column is None else out[:, self.column]


def _ids(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randint(1, 50, shape, generator=torch.Generator().manual_seed(1))


def _replaced_flips(model: nn.Module, module: nn.Module, inputs: dict, row: torch.Tensor,
                    read) -> float:
    """Hand reference: the share of (example, token) whose module output, replaced by ``row``,
    changes the class ``read`` gives."""
    with torch.no_grad():
        clean = read(model(**inputs))
        t = module(inputs["input_ids"]).shape[1]
        flips = []
        for k in range(t):
            def put(mod, args, out, k=k):
                out = out.clone()
                out[:, k] = row
                return out
            handle = module.register_forward_hook(put)
            try:
                flips.append(read(model(**inputs)) != clean)
            finally:
                handle.remove()
    return torch.stack(flips).float().mean().item()


@pytest.mark.parametrize("cls, kw", [(transformers.BertForTokenClassification, {"num_labels": 3}),
                                     (transformers.BertForMaskedLM, {})])
def test_a_wrapped_per_token_head_is_not_read_at_its_last_token(cls, kw):
    # before: measured at each example's last token ([SEP]) without a word (0.0208)
    model = Logits(_bert(cls, **kw))
    inputs = {"input_ids": _ids((4, 6))}
    for tokens in (auto_tokens(model), Embedding("model.bert.embeddings.word_embeddings")):
        with pytest.raises(ValueError, match=r"inside Logits.*position=k"):
            token_sensitivity(model, inputs, tokens, sigma=0.5, repeats=2)


def test_a_wrapped_tagger_measured_at_a_position_it_names_matches_the_hand_loop():
    model = Logits(_bert(transformers.BertForTokenClassification, num_labels=3))
    inputs = {"input_ids": _ids((4, 6))}
    word = model.model.bert.embeddings.word_embeddings
    row = torch.randn(1, 16, generator=torch.Generator().manual_seed(2)) * 3
    got = token_sensitivity(model, inputs, Embedding(word, position=2), replace_with=row)
    want = _replaced_flips(model, word, inputs, row[0], lambda o: o[:, 2].argmax(-1))
    assert got.estimate == pytest.approx(want, abs=1e-6)


def test_a_wrapped_multi_label_head_is_refused_and_one_label_is_measured_by_its_sign():
    inner = _bert(transformers.BertForSequenceClassification, num_labels=3,
                  problem_type="multi_label_classification")
    inputs = {"input_ids": _ids((4, 6))}
    # before: its 3 sigmoid labels were read by their argmax without a word (0.0521)
    with pytest.raises(ValueError, match=r"multi-label.*inside Logits|inside Logits.*multi-label"):
        token_sensitivity(Logits(inner), inputs, auto_tokens(Logits(inner)), sigma=0.5)
    one = Logits(inner, column=1)
    word = inner.bert.embeddings.word_embeddings
    row = torch.randn(1, 16, generator=torch.Generator().manual_seed(3)) * 10
    got = token_sensitivity(one, inputs, Embedding(word), replace_with=row,
                            output_kind="logits")
    want = _replaced_flips(one, word, inputs, row[0], lambda o: o > 0)
    assert got.estimate == pytest.approx(want, abs=1e-6)
    # a plain multi-class head inside a wrapper is measured as before
    plain = Logits(_bert(transformers.BertForSequenceClassification, num_labels=3))
    got = token_sensitivity(plain, inputs, Embedding("model.bert.embeddings.word_embeddings"),
                            replace_with=row)
    want = _replaced_flips(plain, plain.model.bert.embeddings.word_embeddings, inputs, row[0],
                           lambda o: o.argmax(-1))
    assert got.estimate == pytest.approx(want, abs=1e-6)


class Choices(nn.Module):
    """The route the multiple-choice refusal names: embed the choices, one module of ours."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.tokens = model, nn.Identity()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        n, c, t = input_ids.shape
        e = self.model.bert.embeddings.word_embeddings(input_ids)
        e = self.tokens(e.reshape(n, c * t, -1)).reshape(n, c, t, -1)
        return self.model(inputs_embeds=e, attention_mask=attention_mask).logits


def test_multiple_choice_inputs_are_refused_with_a_route_that_measures_them():
    mc = _bert(transformers.BertForMultipleChoice)
    ids = _ids((4, 3, 6))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    # before: refused as a sequence-first model's output, whose fix does not apply
    with pytest.raises(ValueError, match=r"\(batch, choices, tokens\).*inputs_embeds"):
        token_sensitivity(mc, inputs, auto_tokens(mc), sigma=0.5)
    model = Choices(mc)
    row = torch.randn(1, 16, generator=torch.Generator().manual_seed(4)) * 3
    got = token_sensitivity(model, inputs, Embedding("tokens"), replace_with=row,
                            mask=torch.ones(4, 18, dtype=torch.bool))
    with torch.no_grad():
        clean = model(**inputs).argmax(-1)
        flips = []
        for k in range(18):
            e = mc.bert.embeddings.word_embeddings(ids).reshape(4, 18, -1).clone()
            e[:, k] = row[0]
            out = mc(inputs_embeds=e.reshape(4, 3, 6, -1), attention_mask=inputs["attention_mask"])
            flips.append(out.logits.argmax(-1) != clean)
    assert got.estimate == pytest.approx(torch.stack(flips).float().mean().item(), abs=1e-6)
